#!/usr/bin/env bash
# Builds the NATS server, natscli (the NATS project's command-line client) and nats-creds (ours)
# that the NATS tests and benchmarks run, from the Go module proxy, into a cache outside the clone
# (${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}/bin); does nothing when the pinned versions are
# there already. The tests find them on PATH or in that cache.
set -euo pipefail
SERVER_VERSION=v2.15.2
CLI_VERSION=v0.5.0
tools=${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}
mkdir -p "$tools/bin"
command -v go >/dev/null || { apt-get update -q && apt-get install -y -q golang-go; }
if ! "$tools/bin/nats-server" --version 2>/dev/null | grep -qx "nats-server: $SERVER_VERSION"; then
    echo "building nats-server $SERVER_VERSION into $tools/bin"
    GOBIN="$tools/bin" go install "github.com/nats-io/nats-server/v2@$SERVER_VERSION"
fi
if [ ! -x "$tools/bin/nats" ] || [ "$(cat "$tools/bin/.nats-version" 2>/dev/null)" != "$CLI_VERSION" ]; then
    echo "building natscli $CLI_VERSION into $tools/bin"
    GOBIN="$tools/bin" go install "github.com/nats-io/natscli/nats@$CLI_VERSION"
    echo "$CLI_VERSION" > "$tools/bin/.nats-version"
fi
# The tests' operator, account and `.creds` files, made with the NATS project's JWT library
# (harness/nats-creds; nsc itself is not on the module proxy). Go's build cache makes this
# quick when nothing changed.
(cd "$(dirname "$0")/../harness/nats-creds" && GOBIN="$tools/bin" go install .)
"$tools/bin/nats-server" --version
