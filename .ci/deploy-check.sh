#!/usr/bin/env bash
# The README's install step works, and the deploy/ files load in the tools that consume them:
# - the systemd units, with `systemd-analyze verify` (where systemd is installed), against the
#   binaries just built; any warning fails, not only errors;
# - deploy/prometheus.yml and its alerting rules (checked, and run against the series of
#   deploy/prometheus/alerts_test.yml), with Debian's promtool (from the prometheus package,
#   unpacked, not installed: installing would start a Prometheus server on this machine);
# - the metric names both programs serve, against Prometheus's naming conventions: promtool
#   check metrics on scrapes of the binaries just installed, relaying a real stream, so the
#   labelled series exist (any warning fails);
# - the Grafana dashboard, parsed (Grafana is not packaged for Debian; the metrics test checks
#   that every series it queries is one the programs serve).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

# INSTALL_PROFILE: the cargo profile to install with (release, as the README does, by default; CI
# takes the tests' `quick`, whose build is there already).
profile=${INSTALL_PROFILE:-release}
echo "== the README's install step: cargo install --path publisher / subscriber (profile $profile)"
# With the build's own target directory, so a build already there is reused; into a root under
# it, so that after `--install-only` (the install step alone, e.g. beside other work) a full run
# has only the checks left.
install="$PWD/target/deploy-check"
CARGO_TARGET_DIR="$PWD/target" cargo install -q --locked --profile "$profile" --path publisher --root "$install"
CARGO_TARGET_DIR="$PWD/target" cargo install -q --locked --profile "$profile" --path subscriber --root "$install"
"$install/bin/mdrelay-pub" --version
"$install/bin/mdrelay-sub" --version
"$install/bin/mdrelay-sub" --config config/sub-two-host.toml --check > /dev/null
[ "${1:-}" != "--install-only" ] || exit 0

if command -v systemd-analyze >/dev/null; then
    echo "== systemd-analyze verify deploy/systemd"
    mkdir "$work/units"
    for unit in deploy/systemd/*.service; do
        sed "s#/usr/local/bin/#$install/bin/#" "$unit" > "$work/units/$(basename "$unit")"
    done
    # A template is verified through an instance of it.
    ln -s 'mdrelay-sub@.service' "$work/units/mdrelay-sub@ci.service"
    out=$(systemd-analyze verify "$work/units/mdrelay-pub.service" "$work/units/mdrelay-sub@ci.service" 2>&1) || { echo "$out"; exit 1; }
    if [ -n "$out" ]; then echo "$out"; echo "systemd-analyze verify warned (above)"; exit 1; fi
    systemd-analyze security --offline=yes "$work/units/mdrelay-pub.service" 2>&1 | tail -1
    systemd-analyze security --offline=yes "$work/units/mdrelay-sub@ci.service" 2>&1 | tail -1
else
    echo "== systemd-analyze not installed: units not verified"
fi

echo "== promtool check config deploy/prometheus.yml, check and test the alerting rules"
promtool=$(command -v promtool || true)
if [ -z "$promtool" ]; then
    (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get download prometheus >/dev/null; }; })
    dpkg-deb -x "$work"/prometheus_*.deb "$work/prometheus"
    promtool="$work/prometheus/usr/bin/promtool"
fi
"$promtool" check config deploy/prometheus.yml
"$promtool" check rules deploy/prometheus/alerts.yml
"$promtool" test rules deploy/prometheus/alerts_test.yml

echo "== promtool check metrics: both programs' scrapes while they relay a synthetic day"
# Every program's series that a stream brings, on loopback: an origin publisher (TCP, UDP, the
# retransmission service), a relay of it (the upstream's series), a subscriber of the relay that
# records (the recording's), and one on the origin's UDP that recovers from the service. A live
# feed's series are served only with that source: the scrapes tests keep in target/tmp/metrics
# (publisher/tests/it/live_feed.rs, subscriber/tests/it/record.rs; .ci/run runs them first) are
# checked too. Every metric served is in docs/operations.md's table.
bin="$install/bin"
# Started in the order they are needed, each in the background, logging to $work.
start() { local name=$1; shift; "$@" > "$work/$name.log" 2>&1 & pids+=($!); }
# Scrapes PORT into FILE once a series of METRIC counts above 0: within 60 s, or the logs say why
# not (status 2 when a program found its port taken, which the caller retries).
scrape_once_counting() {
    local port=$1 metric=$2 file=$3
    for _ in $(seq 600); do
        if curl -sf "http://127.0.0.1:$port/metrics" > "$file" \
            && awk -v m="$metric" '($1 == m || index($1, m "{") == 1) && $2 > 0 { found = 1 }
                END { exit !found }' "$file"; then
            return 0
        fi
        if grep -q "Address already in use" "$work"/*.log 2>/dev/null; then
            return 2
        fi
        sleep 0.1
    done
    echo "$file: $metric did not count within 60 s" >&2
    tail -n 5 "$work"/*.log >&2
    exit 1
}
# The ports are picked free, then released for the programs to bind. They are picked below the
# kernel's ephemeral range (ip_local_port_range, 32768 and up by default), where port 0 binds and
# outgoing connections take theirs: the tests running beside this step bind hundreds of those, and
# one CI run lost a port picked there on each of three attempts. Another process may still take
# one meanwhile, so the whole relay starts again, on new ports, up to three times.
relay_and_scrape() {
    read -r origin_tcp retransmit relay_tcp udp m_origin m_relay m_recorder m_udp < <(python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
picked = []
while len(picked) < 8:
    port = random.randrange(10000, max(low, 10001))
    if port in picked:
        continue
    try:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(type=kind) as s:
                s.bind(("127.0.0.1", port))
    except OSError:
        continue
    picked.append(port)
print(*picked)')
    udp_listen=127.0.0.1:$udp
    start udp-subscriber "$bin/mdrelay-sub" --udp "$udp_listen" --recovery "127.0.0.1:$retransmit" \
        --report-interval 0 --metrics-listen "127.0.0.1:$m_udp"
    start origin "$bin/mdrelay-pub" run --synthetic --messages 5000000 --pacing rate --rate 20000 \
        --tcp "127.0.0.1:$origin_tcp" --udp "$udp_listen" --retransmit-listen "127.0.0.1:$retransmit" \
        --metrics-listen "127.0.0.1:$m_origin"
    start relay "$bin/mdrelay-pub" run --upstream "127.0.0.1:$origin_tcp" --tcp "127.0.0.1:$relay_tcp" \
        --wait-subscribers 0 --metrics-listen "127.0.0.1:$m_relay"
    start recorder "$bin/mdrelay-sub" --tcp "127.0.0.1:$relay_tcp" --record "$work/relayed.pcap" \
        --report-interval 0 --metrics-listen "127.0.0.1:$m_recorder"
    scrape_once_counting "$m_recorder" mdrelay_sub_record_segments_total "$work/recorder.prom" &&
        scrape_once_counting "$m_udp" mdrelay_sub_frames_total "$work/udp-subscriber.prom" &&
        scrape_once_counting "$m_relay" mdrelay_pub_upstream_frames_total "$work/relay.prom" &&
        scrape_once_counting "$m_origin" mdrelay_pub_sent_frame_bytes_total "$work/origin.prom"
}
for attempt in 1 2 3; do
    status=0
    relay_and_scrape || status=$?
    [ "$status" = 0 ] && break
    echo "a port was taken before its program bound it (attempt $attempt):" >&2
    grep -H "Address already in use" "$work"/*.log >&2
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    pids=()
    rm -f "$work"/*.log "$work"/*.prom "$work/relayed.pcap"
    [ "$attempt" = 3 ] && exit 1
done
for scrape in "$work"/*.prom target/tmp/metrics/*.prom; do
    [ -f "$scrape" ] || continue
    out=$("$promtool" check metrics < "$scrape" 2>&1) || { echo "$(basename "$scrape"): $out"; exit 1; }
    if [ -n "$out" ]; then echo "$(basename "$scrape"): $out"; exit 1; fi
    for name in $(awk '/^# TYPE / { print $3 }' "$scrape"); do
        grep -q "^| \`$name\`\|^| .*, \`$name\`" docs/operations.md \
            || { echo "$(basename "$scrape"): $name is served but not in docs/operations.md's metrics table"; exit 1; }
    done
    echo "$(basename "$scrape"): $(grep -c '^# TYPE ' "$scrape") metrics, $(grep -c '^[a-z]' "$scrape") series: no warnings"
done
kill "${pids[@]}" 2>/dev/null || true
wait 2>/dev/null || true
pids=()

echo "== the Grafana dashboard parses"
python3 - deploy/grafana/mdrelay.json <<'PY'
import json, sys
dash = json.load(open(sys.argv[1]))
panels = [p for p in dash["panels"] if p["type"] != "row"]
exprs = [t["expr"] for p in panels for t in p["targets"]]
assert dash["uid"] and dash["title"] and panels and all(p.get("targets") for p in panels), "panels without queries"
ids = [p["id"] for p in dash["panels"]]
assert len(ids) == len(set(ids)), "panel ids repeat"
print(f"{sys.argv[1]}: {len(panels)} panels, {len(exprs)} queries")
PY
