#!/usr/bin/env bash
# The public API of mdrelay-client against its committed snapshot, client/public-api.txt: nightly
# rustdoc writes the crate's documentation as JSON (rustdoc's JSON output is nightly-only), and
# client/public-api (cargo-public-api's library) prints every public item with its path and
# signature, one a line. A difference fails with the diff: an intended change is committed with
# `bash .ci/public-api.sh --update`, so every change to the API is seen in review.
#
# Installs nightly when missing (as .ci/miri.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
target=target/public-api
cargo +nightly rustdoc -q -p mdrelay-client --lib --target-dir "$target" -- -Z unstable-options --output-format json
# The printer, built once per version of its sources into the tools cache beside the NATS tools
# (as .ci/deps.sh does for cargo-deny): a build takes minutes, and it changes seldom.
tools=${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}
inputs=$(cat client/public-api/Cargo.toml client/public-api/Cargo.lock $(find client/public-api/src -type f | sort) |
    sha256sum | cut -c1-16)
printer="$tools/public-api-$inputs/mdrelay-client-public-api"
if [ ! -x "$printer" ]; then
    echo "building the public-API printer (client/public-api) into $(dirname "$printer")"
    cargo build -q --release --locked --manifest-path client/public-api/Cargo.toml --target-dir "$tools/public-api-target"
    mkdir -p "$(dirname "$printer")"
    cp "$tools/public-api-target/release/mdrelay-client-public-api" "$printer"
    rm -rf "$tools/public-api-target"
fi
fresh=$(mktemp)
trap 'rm -f "$fresh"' EXIT
"$printer" "$target/doc/mdrelay_client.json" >"$fresh"
if [ "${1:-}" = "--update" ]; then
    cp "$fresh" client/public-api.txt
    echo "client/public-api.txt updated ($(wc -l <client/public-api.txt) items)"
    exit 0
fi
if ! diff -u client/public-api.txt "$fresh"; then
    echo "error: mdrelay-client's public API differs from client/public-api.txt (above: - committed, + now)." >&2
    echo "If the change is intended, run: bash .ci/public-api.sh --update, and commit client/public-api.txt" >&2
    exit 1
fi
echo "mdrelay-client's public API matches client/public-api.txt ($(wc -l <client/public-api.txt) items)"
