#!/usr/bin/env bash
# The long tests (marked `#[ignore = "long ..."]`), from the README's build (nothing is compiled
# here), in two lanes at once: the publisher's integration tests, the longest binary by far, in
# one; every other test binary, one after the other, in the other. `cargo test` runs binaries one
# at a time, and most long tests wait (paced streams, peers that stall for seconds), so the other
# lane's tests run meanwhile. Tests that drive streams hard do not overlap even so: the harness's
# serial lock is host-wide (harness/src/serial.rs), so a serial test of one lane waits for the
# other lane's process-heavy tests, and the reverse.
# Each binary runs from its package's directory, as cargo runs it; its output is shown whole once
# its lane is over, with cargo's headers, and the time each binary took. Exits non-zero when a
# test failed, after both lanes ran to the end.
#
# `--list FILE` only writes the list of test binaries (a `cargo test --no-run`, which holds the
# build directory's lock a moment) and `--from FILE` runs from it without cargo, so that CI can
# start other cargo commands meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if [ "${1:-}" = --from ]; then
    cp "$2" "$out/binaries"
else
    # Every test binary of the workspace: "package-dir executable target-name", in cargo's order.
    cargo test --profile quick --workspace --no-run --message-format=json 2>"$out/build" | python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m.get("executable"):
        print(os.path.dirname(m["manifest_path"]), m["executable"], m["target"]["name"])
' >"$out/binaries" || { cat "$out/build" >&2; exit 1; }
fi
[ -s "$out/binaries" ] || { echo "error: no test binaries in the build" >&2; exit 1; }
if [ "${1:-}" = --list ]; then
    cp "$out/binaries" "$2"
    exit 0
fi

lane() { # NAME, then "dir exe target" lines on stdin: each binary's long tests, in turn
    local name=$1 status=0 dir exe target started
    while read -r dir exe target; do
        started=$SECONDS
        {
            echo "     Running ${dir#"$root"/} $target (${exe#"$root"/})"
            (cd "$dir" && "$exe" --ignored) 2>&1 || status=1
            echo "== ${dir#"$root"/} $target: $((SECONDS - started)) s"
        } >>"$out/$name.log"
    done
    echo "$status" >"$out/$name.status"
}
grep '/publisher .* it$' "$out/binaries" >"$out/publisher" || true
grep -v '/publisher .* it$' "$out/binaries" >"$out/others" || true
[ -s "$out/publisher" ] || { echo "error: no publisher integration tests in the build" >&2; exit 1; }
started=$SECONDS
lane publisher <"$out/publisher" &
lane others <"$out/others" &
wait
status=0
for name in publisher others; do
    cat "$out/$name.log"
    [ "$(cat "$out/$name.status")" = 0 ] || status=1
done
echo "== the two lanes took $((SECONDS - started)) s"
grep '^== .*: [0-9]* s$' "$out/publisher.log" "$out/others.log" | sed 's/^[^:]*:/   /'
exit "$status"
