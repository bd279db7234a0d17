#!/usr/bin/env bash
# The minimum Rust version: fails when a package the locked build graph compiles declares a
# `rust-version` newer than the workspace's (`[workspace.package] rust-version`), or an edition
# the workspace's version cannot compile (2024 needs 1.85), naming each such package and its
# version, so a dependency update that raises the floor raises the declared version with it.
#
# Not `cargo msrv verify` (or a build with the declared toolchain): that downloads a second
# toolchain through rustup, and this machine reaches no toolchain server, only the package
# registries. Compiling with 1.95 while declaring less, what the declaration still checks:
# - dependencies, here, by their own `rust-version` and edition;
# - our code's use of the standard library, by clippy's `incompatible_msrv` lint (on by default,
#   in `.ci/run`'s clippy pass), which reads the same `rust-version` through each member's
#   `rust-version.workspace = true`.
# Language features newer than the declared version in our own code are not caught by either.
#
# The graph is the host's (`--filter-platform`): the programs are built and run on Linux, and
# crates only other targets compile (windows-*) or only `--cfg loom` builds compile are not in it.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
check=$(cat <<'PY'
import json, sys

# The first release of each edition: a crate in that edition needs at least this compiler.
EDITION_FLOOR = {"2015": "1.0", "2018": "1.31", "2021": "1.56", "2024": "1.85"}


def version(text):
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
built = {node["id"] for node in meta["resolve"]["nodes"]}
packages = [p for p in meta["packages"] if p["id"] in built]

declared = {p["rust_version"] for p in packages if p["id"] in members}
if None in declared or len(declared) != 1:
    sys.exit(f"msrv: every workspace member must inherit one rust-version, found {sorted(map(str, declared))}")
msrv = declared.pop()

needed = []  # (version, package, reason)
for p in packages:
    name = p["name"] + " " + p["version"]
    # Our own crates: their edition only (cargo itself refuses a rust-version below it, too).
    if p["rust_version"] and p["id"] not in members:
        needed.append((version(p["rust_version"]), name, "rust-version " + p["rust_version"]))
    floor = EDITION_FLOOR.get(p["edition"])
    if floor:
        needed.append((version(floor), name, "edition " + p["edition"]))

too_new = sorted((n for n in needed if n[0] > version(msrv)), reverse=True)
for _, name, reason in too_new:
    print(f"msrv: {name} needs a newer Rust than the workspace declares ({msrv}): {reason}", file=sys.stderr)
if too_new:
    major, minor, patch = too_new[0][0]
    least = f"{major}.{minor}" + (f".{patch}" if patch else "")
    sys.exit(f"msrv: raise rust-version in Cargo.toml to at least {least} (and the README)")

top = max(needed)
print(f"msrv: rust-version {msrv} covers all {len(packages) - len(members)} dependencies; the highest need is {top[1]} ({top[2]})")
PY
)
cargo metadata --format-version 1 --locked --filter-platform "$host" | python3 -c "$check"
