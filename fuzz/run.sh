#!/usr/bin/env bash
# Runs one fuzz target on its committed corpus, saving crash inputs where the replay test finds
# them. Usage, from anywhere: fuzz/run.sh TARGET [SECONDS] [extra libFuzzer flags...]
# One fuzzer at a time: the limits below keep a run from taking the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: fuzz/run.sh TARGET [SECONDS] [libFuzzer flags...]}
seconds=${2:-300}
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
flags=(-artifact_prefix="fuzz/artifacts/$target/" -rss_limit_mb=2048 -timeout=10 -max_total_time="$seconds" -print_final_stats=1)
if [ -f "fuzz/libfuzzer/dicts/$target.dict" ]; then
    flags+=(-dict="fuzz/libfuzzer/dicts/$target.dict")
fi
exec cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer "$target" "fuzz/corpus/$target" -- "${flags[@]}" "$@"
