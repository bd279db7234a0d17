#!/usr/bin/env bash
# The Python package (python/): built with maturin into a venv, linted, and its pytest suite run
# against real mdrelay-pub processes. Prints a "test result:" line in cargo's form, from pytest's
# own counts, so .ci/run's closing line counts these tests with the Rust ones.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv="${MDRELAY_PY_VENV:-$HOME/.cache/mdrelay-tools/python-venv}"

if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
    apt-get update -q && apt-get install -y -q python3-venv
fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# From PyPI: the build backend, the test runner, and the Arrow readers the tests hand batches to.
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q maturin pytest pyarrow polars

echo "== python: cargo fmt --check and clippy (the extension crate, a workspace of its own)"
(cd python && cargo fmt -- --check)
(cd python && CARGO_TARGET_DIR="$root/python/target" cargo clippy --release --all-targets -- -D warnings)

echo "== python: maturin develop --release into $venv"
(cd python && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$root/python/target" \
    "$venv/bin/maturin" develop --release -q)

echo "== python: the publisher the tests run (cheap when the Rust tests built it)"
cargo build --profile quick -p mdrelay-publisher -p mdrelay-subscriber
export MDRELAY_PUB="$root/target/quick/mdrelay-pub"

echo "== python: pytest"
junit=$(mktemp)
started=$SECONDS
set +e
(cd python && "$venv/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$junit" tests)
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
