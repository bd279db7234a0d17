#!/usr/bin/env bash
# The dependency checks: `cargo deny check licenses bans sources` (deny.toml: licenses, duplicate
# major versions, crates.io only) and `cargo machete` (dependencies declared but not used).
# Installs both at pinned versions into a cache outside the clone
# (${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}/bin, as .ci/nats.sh does for the NATS tools) and
# does nothing more when they are there already; building them from source takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
DENY_VERSION=0.20.2
MACHETE_VERSION=0.9.2
tools=${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}
mkdir -p "$tools/bin"
missing=()
"$tools/bin/cargo-deny" --version 2>/dev/null | grep -qx "cargo-deny $DENY_VERSION" ||
    missing+=("cargo-deny@$DENY_VERSION")
"$tools/bin/cargo-machete" --version 2>/dev/null | grep -qx "$MACHETE_VERSION" ||
    missing+=("cargo-machete@$MACHETE_VERSION")
if [ ${#missing[@]} -gt 0 ]; then
    echo "building ${missing[*]} into $tools/bin"
    # A target directory of its own: building the tools in the workspace's would replace the
    # workspace's compiled dependencies with the tools' features and versions of them.
    CARGO_TARGET_DIR="$tools/target" cargo install --locked --force --root "$tools" "${missing[@]}"
    rm -rf "$tools/target"
fi
export PATH="$tools/bin:$PATH"

echo "== cargo deny check licenses bans sources"
cargo deny --locked check licenses bans sources
echo "== cargo machete: every declared dependency is used"
cargo machete
