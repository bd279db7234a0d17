#!/usr/bin/env bash
# CI: every fuzz target builds under cargo-fuzz (nightly, libFuzzer, AddressSanitizer), so a
# change that breaks a harness is caught even though the fuzzers themselves are run by hand (see
# fuzz/run.sh), and replays its corpus and crash inputs there. The corpus is replayed on stable
# by `cargo test` too (fuzz/tests/replay.rs).
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
# Unoptimised (--dev): CI checks that the harnesses build and take their corpus, which needs no
# speed, and the optimised build of 19 targets with AddressSanitizer took 20 CPU minutes here
# (4 unoptimised). fuzz/run.sh, which fuzzes, builds them optimised.
cargo +nightly fuzz build --dev --fuzz-dir fuzz/libfuzzer
# cargo fuzz build stops at the first failure; still, check that every listed target produced its binary.
bin=fuzz/libfuzzer/target/$(rustc +nightly -vV | sed -n 's/^host: //p')/debug
missing=0
for target in $targets; do
    [ -x "$bin/$target" ] || { echo "error: fuzz target $target did not build" >&2; missing=1; }
done
[ "$missing" = 0 ]
echo "fuzz targets built: $(echo $targets | wc -w)"

# Every target over its corpus and its crash inputs once (-runs=0: no fuzzing), as cargo-fuzz
# built them: AddressSanitizer, and overflow checks and debug assertions in every crate, the
# dependencies' too (the tests check our crates so; the corpus replay in fuzz/tests/replay.rs runs
# it in the tests' profile). A crash input still unfixed (`KNOWN` in that test) would fail here:
# there are none.
echo "== the fuzz corpus under libFuzzer"
for target in $targets; do
    inputs=()
    for dir in fuzz/corpus/"$target" fuzz/artifacts/"$target"; do
        [ -d "$dir" ] && inputs+=("$dir")
    done
    [ "${#inputs[@]}" -gt 0 ] || continue
    if ! "$bin/$target" -runs=0 -rss_limit_mb=2048 "${inputs[@]}" >"$bin/$target.replay.log" 2>&1; then
        tail -40 "$bin/$target.replay.log"
        echo "error: fuzz target $target failed on an input of ${inputs[*]}" >&2
        exit 1
    fi
    echo "$target: $(grep -o 'INITED.*' "$bin/$target.replay.log" | head -1)"
done
