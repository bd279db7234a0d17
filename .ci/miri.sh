#!/usr/bin/env bash
# Miri over the Cap'n Proto codec, the one part of the core (mdrelay-codec) with `unsafe` code of its own
# (the arenas the `capnp` layout code reads and writes through, and the packing): its unit tests
# run in the interpreter, which fails them on undefined behaviour that a test alone cannot see,
# such as reads out of bounds or through misaligned pointers, uninitialised bytes or aliasing
# violations. Miri cannot execute SSSE3 instructions, and feature detection reports none under
# it, so the tests run the portable packing path; the SSSE3 path is checked against it by the
# ordinary tests.
#
# Installs what it needs when missing (nightly, its Miri and the standard library's source, from
# which Miri builds its own sysroot); run as often as wanted.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal --component miri,rust-src
fi
installed=$(rustup component list --toolchain nightly --installed)
for component in miri rust-src; do
    if ! grep -q "^$component" <<<"$installed"; then
        rustup component add --toolchain nightly "$component"
    fi
done
cargo +nightly miri setup
cargo +nightly miri test -p mdrelay-codec --lib capnproto
