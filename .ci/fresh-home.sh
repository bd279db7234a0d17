#!/usr/bin/env bash
# The README's test command needs nothing installed beforehand: a few of its default NATS tests
# run as on a fresh machine, with an empty HOME and an empty tools cache, two test binaries at
# once. They pass only if the harness builds the pinned NATS tools itself (.ci/nats.sh, once,
# under its lock: exactly one of the two says it builds them) and reuses them afterwards (a third
# run says nothing). Go's module and build caches are kept, so that this costs CI seconds rather
# than the minutes a first download takes; the tools cache and HOME start empty.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_HOME=${CARGO_HOME:-$HOME/.cargo} RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
if command -v go >/dev/null; then
    GOMODCACHE=$(go env GOMODCACHE) GOCACHE=$(go env GOCACHE)
    export GOMODCACHE GOCACHE
fi
home=$(mktemp -d) tools=$(mktemp -d) out=$(mktemp -d)
# Go's module cache is read-only; a first download into the empty HOME would be too.
trap 'chmod -R u+w "$home" "$tools" 2>/dev/null; rm -rf "$home" "$tools" "$out"' EXIT

# The test binaries, built as the README's command builds them (with the real HOME: cargo's
# own caches are not what is checked here).
# The `it` test binaries of the publisher and the subscriber, from the README's own build (the
# whole workspace: `-p` alone would resolve features apart and rebuild half of it).
built=$(cargo test --profile quick --workspace --no-run --message-format=json)
test_binary() { # PACKAGE: the path of its `it` test binary
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" \
            and ("/" + sys.argv[1] + "#") in m["package_id"] and m.get("executable"):
        print(m["executable"])' "$1" <<<"$built"
}
publisher_it=$(test_binary publisher)
subscriber_it=$(test_binary subscriber)
[ -n "$publisher_it" ] && [ -n "$subscriber_it" ] || { echo "error: no it test binaries in the build" >&2; exit 1; }
run() { # PACKAGE-DIR EXE TESTS...: tests of one binary, from its package as cargo runs them
    local dir=$1 exe=$2
    shift 2
    (cd "$dir" && HOME=$home MDRELAY_TOOLS=$tools "$exe" --exact "$@")
}
started=$SECONDS
run publisher "$publisher_it" nats::every_frame_is_stored_once_in_the_stream \
    nats::a_creds_file_of_a_known_account_is_taken_and_a_strangers_is_refused_naming_the_setting \
    >"$out/publisher" 2>&1 &
publisher_pid=$!
run subscriber "$subscriber_it" exit_status::a_run_stopped_before_the_end_gives_no_verdict_and_exits_0 \
    >"$out/subscriber" 2>&1 &
subscriber_pid=$!
status=0
wait "$publisher_pid" || status=1
wait "$subscriber_pid" || status=1
cat "$out/publisher" "$out/subscriber"
echo "== NATS tests from an empty HOME and tools cache: $((SECONDS - started)) s, the tools' build included"
[ "$status" = 0 ] || { echo "error: a NATS test failed from an empty HOME" >&2; exit 1; }
builds=$(cat "$out/publisher" "$out/subscriber" | grep -c 'building the pinned NATS tools' || true)
[ "$builds" = 1 ] || { echo "error: the NATS tools were built $builds times, not once" >&2; exit 1; }
for program in nats-server nats nats-creds; do
    [ -x "$tools/bin/$program" ] || { echo "error: $tools/bin/$program was not built" >&2; exit 1; }
done
run subscriber "$subscriber_it" exit_status::a_run_stopped_before_the_end_gives_no_verdict_and_exits_0 \
    >"$out/again" 2>&1 || { cat "$out/again"; exit 1; }
if grep -q 'building the pinned NATS tools' "$out/again"; then
    cat "$out/again"
    echo "error: the NATS tools were built again instead of reused" >&2
    exit 1
fi
echo "== the NATS tools were built once and reused"
# Building the tools mid-run leaves the build as it was: the next `cargo test` compiles nothing
# (stamping nats-creds with the commit once rewrote git's index, which the programs' build
# scripts watch, and the next run rebuilt four crates).
rebuilt=$(cargo test --profile quick --workspace --no-run 2>&1 | grep 'Compiling' || true)
if [ -n "$rebuilt" ]; then
    echo "$rebuilt"
    echo "error: after the NATS tools were built, the README's test command rebuilt the crates above" >&2
    exit 1
fi
echo "== and the next build of the tests compiled nothing"
