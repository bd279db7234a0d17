#!/usr/bin/env bash
# Builds the NATS server, natscli (the NATS project's command-line client) and nats-creds (ours)
# that the NATS tests and benchmarks run, from the Go module proxy, into a cache outside the clone
# (${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}/bin); does nothing when the pinned versions are
# there already. The tests' harness runs it on first use when the tools are missing (or were
# built from another version of this script or of harness/nats-creds), and finds them in that
# cache; CI runs it first.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
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
# -buildvcs=false: stamping the binary with the commit runs `git status`, which rewrites the
# clone's index, and buildinfo (which embeds the commit in mdrelay-pub and mdrelay-sub) watches
# the index: when the tests build these tools on first use, the next cargo build rebuilt four
# crates for nothing.
(cd "$here/harness/nats-creds" && GOBIN="$tools/bin" go install -buildvcs=false .)
"$tools/bin/nats-server" --version
# What they were built from, last, once all three are there: the harness rebuilds them when this
# differs from its own digest of the same files (harness/src/tools.rs).
inputs=$(cat "$here/.ci/nats.sh" "$here/harness/nats-creds/go.mod" "$here/harness/nats-creds/go.sum" "$here/harness/nats-creds/main.go" | sha256sum | cut -d' ' -f1)
echo "$inputs" > "$tools/bin/.nats-inputs"
