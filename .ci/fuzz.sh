#!/usr/bin/env bash
# CI: every fuzz target builds under cargo-fuzz (nightly, libFuzzer, AddressSanitizer), so a
# change that breaks a harness is caught even though the fuzzers themselves are run by hand (see
# fuzz/run.sh). The corpus is replayed on stable by `cargo test` (fuzz/tests/replay.rs).
# Installs what it needs on a fresh machine: the nightly toolchain and cargo-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
# cargo-fuzz links libFuzzer, which it compiles with a C++ compiler.
command -v c++ >/dev/null || { apt-get update -q && apt-get install -y -q g++; }
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

echo "== cargo fuzz build (every target)"
targets=$(cargo +nightly fuzz list --fuzz-dir fuzz/libfuzzer)
[ -n "$targets" ] || { echo "error: no fuzz targets listed" >&2; exit 1; }
cargo +nightly fuzz build --fuzz-dir fuzz/libfuzzer
# cargo fuzz build stops at the first failure; still, check that every listed target produced its binary.
bin=fuzz/libfuzzer/target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release
missing=0
for target in $targets; do
    [ -x "$bin/$target" ] || { echo "error: fuzz target $target did not build" >&2; missing=1; }
done
[ "$missing" = 0 ]
echo "fuzz targets built: $(echo $targets | wc -w)"
