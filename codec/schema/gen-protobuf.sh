#!/usr/bin/env bash
# Regenerates codec/generated/protobuf/mdrelay.v1.rs from codec/schema/marketdata.proto.
#
# The generator is the small cargo project codec/schema/protobuf-gen/: prost-build 0.14.4, which
# writes code for the prost 0.14 runtime the workspace uses, driving the protoc that the
# protoc-bin-vendored 3.3.0 crate ships. Both are pinned exactly in its Cargo.toml and, with
# every crate under them, in its committed Cargo.lock (built with --locked), because the
# generated file is committed and every run must give the same bytes. Nothing is needed but
# cargo and crates.io: no system protoc, no download outside the registry.
#
# The build goes to a target dir under ${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}, outside
# the repository, so it neither shows in git status nor waits for a workspace build; the first
# run builds the generator (about 30 s), later runs only run it.
#
# Idempotent: a second run rewrites the same bytes.
#   bash codec/schema/gen-protobuf.sh      (from the project root, or anywhere)
set -euo pipefail
cd "$(dirname "$0")/../.."

SCHEMA_DIR=codec/schema
SCHEMA=marketdata.proto
GENERATOR=codec/schema/protobuf-gen/Cargo.toml
OUT_DIR=codec/generated/protobuf
OUT_FILE=mdrelay.v1.rs

tools="${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}"

if ! command -v cargo >/dev/null; then
    echo "error: cargo is needed to build the Protobuf generator (https://rustup.rs)" >&2
    exit 1
fi

# Generate beside the output, then replace it in one step, so a failed run leaves the committed
# file as it was.
mkdir -p "$OUT_DIR" "$tools"
tmp="$(mktemp -d "$OUT_DIR/.gen.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
CARGO_TARGET_DIR="$tools/protobuf-gen-target" cargo run --quiet --locked --manifest-path "$GENERATOR" -- \
    "$SCHEMA_DIR" "$SCHEMA" "$tmp"
[ -f "$tmp/$OUT_FILE" ] || { echo "error: the generator wrote no $tmp/$OUT_FILE" >&2; exit 1; }
mv -f "$tmp/$OUT_FILE" "$OUT_DIR/$OUT_FILE"
echo "generated $OUT_DIR/$OUT_FILE with prost-build 0.14.4 and protoc-bin-vendored 3.3.0" >&2
