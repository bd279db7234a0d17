#!/usr/bin/env bash
# mdrelay-client as its users build it:
# - without default features (no `nats`): it checks, its unit tests pass, its docs build without
#   warnings, and neither async-nats nor its TLS stack (rustls, ring) nor nkeys is compiled;
# - with and without them, building the examples or tests after the library rebuilds nothing the
#   library built: no crate of the library's graph gets other features once the
#   dev-dependencies join it (tokio's features in a dev-dependency once rebuilt 12 crates);
# - `cargo package` takes a sane file set (the library, the examples, README.md and
#   CHANGELOG.md; not the tests, which need the unpublished mdrelay-harness), and README.md is
#   the manifest's readme.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
profile=${PROFILE:-quick}

echo "== mdrelay-client without default features: every target builds, the unit tests pass, the docs build"
cargo test --profile "$profile" -p mdrelay-client --no-default-features --all-targets --no-run
cargo test --profile "$profile" -p mdrelay-client --no-default-features --lib
RUSTDOCFLAGS="-D warnings" cargo doc -p mdrelay-client --no-deps --no-default-features

echo "== mdrelay-client without default features compiles no NATS, TLS or nkeys crate"
tree=$(cargo tree -e normal -p mdrelay-client --no-default-features --prefix none)
found=$(grep -E '^(async-nats|rustls[a-z-]*|tokio-rustls|ring|nkeys) ' <<<"$tree" | sort -u || true)
if [ -n "$found" ]; then
    echo "error: built without default features, mdrelay-client still depends on:" >&2
    echo "$found" >&2
    exit 1
fi
with=$(cargo tree -e normal -p mdrelay-client --prefix none | sed 's/ (\*)//' | sort -u | wc -l)
without=$(sed 's/ (\*)//' <<<"$tree" | sort -u | wc -l)
echo "mdrelay-client: $with crates with default features, $without without"

echo "== mdrelay-client's examples and tests reuse the library's build (no feature changes)"
for features in "" "--no-default-features"; do
    normal=$(mktemp)
    dev=$(mktemp)
    cargo tree -p mdrelay-client $features -e normal,build -f '{p} {f}' --prefix none |
        sed 's/ (\*)//' | sort -u >"$normal"
    cargo tree -p mdrelay-client $features -e normal,build,dev -f '{p} {f}' --prefix none |
        sed 's/ (\*)//' | sort -u >"$dev"
    # A line of the library's graph missing from the examples' one: the crate is built there
    # with other features, so a `cargo run --example` after `cargo build` would rebuild it.
    changed=$(comm -23 "$normal" "$dev")
    rm -f "$normal" "$dev"
    if [ -n "$changed" ]; then
        echo "error: mdrelay-client${features:+ ($features)}: its dev-dependencies change the features of:" >&2
        echo "$changed" >&2
        echo "enable those features in client/Cargo.toml's [dependencies] (see its comments on tokio and nix)" >&2
        exit 1
    fi
done

echo "== mdrelay-client's package"
files=$(cargo package -p mdrelay-client --list --allow-dirty)
echo "$files"
for wanted in Cargo.toml README.md CHANGELOG.md src/lib.rs examples/trades.rs; do
    grep -qx "$wanted" <<<"$files" || { echo "error: the package lacks $wanted" >&2; exit 1; }
done
if grep -E '^(tests/|public-api)' <<<"$files"; then
    echo "error: the package holds files that are not for its users (above)" >&2
    exit 1
fi
cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, os, sys
p = next(p for p in json.load(sys.stdin)["packages"] if p["name"] == "mdrelay-client")
missing = [f for f in ("description", "license", "repository", "readme", "rust_version") if not p.get(f)]
assert not missing, f"mdrelay-client: Cargo.toml lacks {missing}"
# cargo gives the readme as the manifest says it, relative to the manifest.
readme = os.path.join(os.path.dirname(p["manifest_path"]), p["readme"])
assert os.path.samefile(readme, "client/README.md"), f"mdrelay-client: its readme is {readme}"
path_deps = [d["name"] for d in p["dependencies"] if d.get("path") and d["kind"] is None and d["req"] == "*"]
assert not path_deps, f"mdrelay-client: path dependencies without a version: {path_deps}"'
echo "mdrelay-client: its package and manifest are fit to publish"
