#!/usr/bin/env bash
# Soak test: a looping replay at 100,000 msg/s to four subscribers (two over TCP, two over
# multicast) on this host, for MINUTES minutes (default 10). Every 10 s it samples each
# process's RSS and scrapes its metrics endpoint. It fails when
#   - a process's RSS grows past its bound over its first sample after the warm-up
#     (publisher: PUB_GROWTH_MIB, default 16; each subscriber: SUB_GROWTH_MIB, default 8), or
#   - any error counter moves: the subscribers' gaps, duplicates, reordering, decode errors,
#     invalid packets and reconnects; the publisher's disconnects, dropped frames, refused
#     connections, accept errors and oversized datagrams, or
#   - a process fails, or a subscriber's totals do not match the publisher's at the end.
# Results go to target/soak/: samples.csv (every sample), soak.md (the RSS series and the
# verdict, as docs/benchmarks.md quotes it) and each process's log and JSON report.
#
# Usage: deploy/soak.sh [MINUTES]     (from the project root; builds the release binaries)
#   SOAK_CAPTURE=FILE  capture to loop (default ../shared/data/iex/DEEP10.pcap.gz if present,
#                      else the built-in synthetic day)
#   SOAK_RATE=N        messages per second (default 100000)
# Not part of CI: it takes minutes by design.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${1:-10}
if ! [[ "$minutes" =~ ^[0-9]+$ ]] || [ "$minutes" -lt 1 ] || [ "$minutes" -gt 1440 ]; then
    echo "usage: deploy/soak.sh [MINUTES]   (a whole number from 1 to 1440; default 10)" >&2
    exit 2
fi
rate=${SOAK_RATE:-100000}
pub_growth_mib=${PUB_GROWTH_MIB:-16}
sub_growth_mib=${SUB_GROWTH_MIB:-8}
warmup=30
interval=10
command -v curl >/dev/null || { echo "soak.sh needs curl" >&2; exit 2; }

capture=${SOAK_CAPTURE:-../shared/data/iex/DEEP10.pcap.gz}
if [ -f "$capture" ]; then
    source_args=(--capture "$capture")
else
    source_args=(--synthetic)
    capture="synthetic day"
fi

cargo build --release -q -p mdrelay-publisher -p mdrelay-subscriber
bin=target/release
out=target/soak
rm -rf "$out" && mkdir -p "$out"

# Ports above the usual ones, so a relay already running here is not disturbed.
tcp=127.0.0.1:19100
group=239.255.77.1:19300
pub_metrics=127.0.0.1:19900
sub_metrics=(127.0.0.1:19901 127.0.0.1:19902 127.0.0.1:19903 127.0.0.1:19904)
names=(tcp-1 tcp-2 multicast-1 multicast-2)

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo "soak: interrupted" >&2; exit 130' INT TERM

# Multicast subscribers first (UDP has no handshake), then the publisher, then TCP subscribers.
for i in 2 3; do
    "$bin/mdrelay-sub" --multicast "$group" --interface 127.0.0.1 --report-interval 0 \
        --metrics-listen "${sub_metrics[$i]}" --json "$out/${names[$i]}.json" 2> "$out/${names[$i]}.log" > "$out/${names[$i]}.txt" &
    pids[i]=$!
done
seconds=$((minutes * 60))
"$bin/mdrelay-pub" run "${source_args[@]}" --loops 0 --duration "$seconds" \
    --pacing rate --rate "$rate" --tcp "$tcp" --wait-subscribers 2 \
    --multicast "$group" --interface 127.0.0.1 --multicast-loop true \
    --metrics-listen "$pub_metrics" --json "$out/publisher.json" 2> "$out/publisher.log" > "$out/publisher.txt" &
pub_pid=$!
pids[4]=$pub_pid
for _ in $(seq 100); do grep -q "serving subscribers over TCP" "$out/publisher.log" && break; sleep 0.1; done
for i in 0 1; do
    "$bin/mdrelay-sub" --tcp "$tcp" --report-interval 0 \
        --metrics-listen "${sub_metrics[$i]}" --json "$out/${names[$i]}.json" 2> "$out/${names[$i]}.log" > "$out/${names[$i]}.txt" &
    pids[i]=$!
done

# The value of one series in a scrape (0 when absent).
value() { awk -v s="$2" '$1 == s { v = $2 } END { print (v == "" ? 0 : v) }' <<< "$1"; }
# The sum of a metric's series on one transport, whatever the format.
on_transport() { awk -v m="$2" -v t="transport=\"$3\"" 'index($1, m "{") == 1 && index($1, t) { v += $2 } END { print v + 0 }' <<< "$1"; }
# The sum of a metric's series, whatever their labels.
total() { awk -v m="$2" 'index($1, m) == 1 && (substr($1, length(m) + 1, 1) == "{" || length($1) == length(m)) { v += $2 } END { print v + 0 }' <<< "$1"; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

sub_errors=(mdrelay_sub_missing_frames mdrelay_sub_duplicate_frames_total mdrelay_sub_reordered_frames_total
    mdrelay_sub_decode_errors_total mdrelay_sub_invalid_packets_total mdrelay_sub_reconnects_total)
pub_errors=(mdrelay_pub_disconnects_total mdrelay_pub_dropped_frames_total mdrelay_pub_connections_refused_total
    mdrelay_pub_accept_errors_total mdrelay_pub_udp_oversized_frames_total)

echo "t_s,process,rss_kib,messages,errors" > "$out/samples.csv"
declare -A base_rss=() last_errors=()
failures=()
started=$(date +%s)
echo "soak: $minutes min, $rate msg/s of $capture to ${names[*]}; samples every ${interval}s in $out/samples.csv"
while kill -0 "$pub_pid" 2>/dev/null; do
    sleep "$interval"
    t=$(( $(date +%s) - started ))
    kill -0 "$pub_pid" 2>/dev/null || break
    scrape=$(curl -s --max-time 5 "http://$pub_metrics/metrics" || true)
    errors=0
    for m in "${pub_errors[@]}"; do errors=$(awk -v a="$errors" -v b="$(total "$scrape" "$m")" 'BEGIN { print a + b }'); done
    rows=("$t,publisher,$(rss_kib "$pub_pid"),$(on_transport "$scrape" mdrelay_pub_messages_sent_total tcp),$errors")
    for i in 0 1 2 3; do
        scrape=$(curl -s --max-time 5 "http://${sub_metrics[$i]}/metrics" || true)
        errors=0
        for m in "${sub_errors[@]}"; do errors=$(awk -v a="$errors" -v b="$(value "$scrape" "$m")" 'BEGIN { print a + b }'); done
        rows+=("$t,${names[$i]},$(rss_kib "${pids[$i]}"),$(value "$scrape" mdrelay_sub_messages_total),$errors")
    done
    for row in "${rows[@]}"; do
        echo "$row" >> "$out/samples.csv"
        IFS=, read -r _ process rss _ errs <<< "$row"
        # Each move is reported once, with when it happened.
        if [ "$errs" != "${last_errors[$process]:-0}" ]; then
            failures+=("$process: error counters moved from ${last_errors[$process]:-0} to $errs by ${t}s")
            last_errors[$process]=$errs
        fi
        if [ "$t" -ge "$warmup" ]; then
            if [ -z "${base_rss[$process]:-}" ]; then base_rss[$process]=$rss; fi
            if [ "$process" = publisher ]; then bound=$((pub_growth_mib * 1024)); else bound=$((sub_growth_mib * 1024)); fi
            if [ "$rss" -gt $(( base_rss[$process] + bound )) ]; then
                failures+=("$process: RSS ${rss} KiB at ${t}s, more than $((bound / 1024)) MiB over ${base_rss[$process]} KiB")
            fi
        fi
    done
    printf 'soak: %4ds  %s\n' "$t" "$(IFS=' '; for r in "${rows[@]}"; do IFS=, read -r _ p rss m e <<< "$r"; printf '%s %s MiB %s msg %s err; ' "$p" $((rss / 1024)) "$m" "$e"; done)"
done
wait "$pub_pid" || failures+=("publisher exited with $?")
for i in 0 1 2 3; do
    # The multicast subscribers end at the publisher's END datagram, the TCP ones at its END record.
    if ! wait "${pids[$i]}"; then failures+=("${names[$i]} exited with an error"); fi
    if ! grep -q '"totals_match": true' "$out/${names[$i]}.json"; then failures+=("${names[$i]}: totals do not match the publisher's"); fi
done
pids=()

{
    echo "Soak: $minutes min of $capture looped at $rate msg/s, to two TCP and two multicast subscribers"
    echo "on one host; RSS and metrics sampled every ${interval} s (deploy/soak.sh)."
    echo
    echo "| t (s) | publisher RSS (MiB) | tcp-1 RSS (MiB) | tcp-2 RSS (MiB) | multicast-1 RSS (MiB) | multicast-2 RSS (MiB) | messages relayed | error counters |"
    echo "|---|---|---|---|---|---|---|---|"
    awk -F, 'NR > 1 { t = $1; rss[t, $2] = sprintf("%.1f", $3 / 1024); if ($2 == "publisher") m[t] = $4; e[t] += $5; if (!(t in seen)) { seen[t] = 1; order[++n] = t } }
        END { for (i = 1; i <= n; i++) { t = order[i]; if (i % 6 != 1 && i != n) continue;
              printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", t, rss[t, "publisher"], rss[t, "tcp-1"], rss[t, "tcp-2"], rss[t, "multicast-1"], rss[t, "multicast-2"], m[t], e[t] } }' "$out/samples.csv"
    echo
    if [ ${#failures[@]} -eq 0 ]; then
        echo "Verdict: passed. RSS stayed within $pub_growth_mib MiB (publisher) and $sub_growth_mib MiB (each subscriber) of its"
        echo "first sample after ${warmup} s; no error counter moved; every subscriber's totals match the publisher's."
    else
        echo "Verdict: FAILED"
        printf -- '- %s\n' "${failures[@]}"
    fi
} > "$out/soak.md"
cat "$out/soak.md"
[ ${#failures[@]} -eq 0 ]
