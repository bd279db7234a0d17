#!/usr/bin/env bash
# The Python package (python/): linted, built into a wheel with maturin and installed into a venv
# as a prebuilt wheel is, and its pytest suite run against real mdrelay-pub processes. Prints a
# "test result:" line in cargo's form, from pytest's own counts, so .ci/run's closing line counts
# these tests with the Rust ones.
#
# `--lint` only lints, `--build` stops after the wheel is installed and `--test` starts at the
# tests, so that each can run apart (CI lints beside the long tests, at low priority).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
phase=${1:-all}
venv="${MDRELAY_PY_VENV:-$HOME/.cache/mdrelay-tools/python-venv}"

if [ "$phase" = all ] || [ "$phase" = --lint ]; then
    echo "== python: cargo fmt --check and clippy (the extension crate, a workspace of its own)"
    # --locked: python/Cargo.lock must be current (a dependency added to the core or the client
    # needs the lock regenerated with `cd python && cargo update -w`), or a user's `pip install`
    # would rewrite it and leave the clone dirty.
    (cd python && cargo fmt -- --check)
    # Subscriber's keywords in the type stub are the client library's Settings fields, and its
    # message classes are the model's table.
    python3 python/generate_stub.py --check
    (cd python && CARGO_TARGET_DIR="$root/python/target" cargo clippy --locked --release --all-targets -- -D warnings)
fi
[ "$phase" != --lint ] || exit 0

if [ "$phase" != --test ]; then
    if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
        apt-get update -q && apt-get install -y -q python3-venv
    fi
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
    fi
    # From PyPI: the build backend, the test runner, the Arrow readers and DataFrame libraries the
    # tests hand batches to (to_pandas() and to_polars() need pandas and polars), and mypy, whose
    # stubtest checks the type stub against the compiled module (tests/test_stub.py).
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q maturin pytest pyarrow polars pandas mypy

    # The path the README gives for other machines: one release build into a wheel, then pip
    # installs the wheel (the same single build `maturin develop --release` would make).
    wheels=$(mktemp -d)
    trap 'rm -rf "$wheels"' EXIT
    echo "== python: maturin build --release --locked, then pip install of the wheel into $venv"
    (cd python && CARGO_TARGET_DIR="$root/python/target" \
        "$venv/bin/maturin" build --release --locked -q --interpreter "$venv/bin/python" --out "$wheels")
    "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheels"/mdrelay-*.whl
fi
[ "$phase" != --build ] || exit 0

echo "== python: the publisher the tests run (built by the Rust tests when they ran before)"
[ -x target/quick/mdrelay-pub ] || cargo build --profile quick -p mdrelay-publisher -p mdrelay-subscriber
export MDRELAY_PUB="$root/target/quick/mdrelay-pub"

echo "== python: pytest"
junit=$(mktemp)
started=$SECONDS
set +e
# From tests/, not python/: there `import mdrelay` (pytest's, and the scripts the tests start)
# would find the package's sources, which lack the compiled module, before the installed wheel.
(cd python/tests && "$venv/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$junit" .)
status=$?
set -e
# cargo's form, so the closing awk of .ci/run adds these to the Rust tests' counts.
"$venv/bin/python" - "$junit" "$((SECONDS - started))" <<'PY'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
total = sum(int(s.get("tests", 0)) for s in suites)
failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
passed = total - failed - skipped
outcome = "ok" if failed == 0 else "FAILED"
print(f"test result: {outcome}. {passed} passed; {failed} failed; {skipped} ignored; 0 measured; 0 filtered out; finished in {sys.argv[2]}s (python)")
PY
rm -f "$junit"
exit $status
