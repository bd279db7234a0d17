#!/usr/bin/env bash
# The README's install step works, and the deploy/ files load in the tools that consume them:
# - the systemd units, with `systemd-analyze verify` (where systemd is installed), against the
#   binaries just built; any warning fails, not only errors;
# - deploy/prometheus.yml, its alerting rules (checked, and run against the series of
#   deploy/prometheus/alerts_test.yml) and the metrics scraped by publisher/tests/metrics.rs, with Debian's
#   promtool (from the prometheus package, unpacked, not installed: installing would start a
#   Prometheus server on this machine);
# - the Grafana dashboard, parsed (Grafana is not packaged for Debian; the metrics test checks
#   that every series it queries is one the programs serve).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== the README's install step: cargo install --path publisher / subscriber"
# Into a scratch root, with the build's own target directory, so a release build already there is reused.
CARGO_TARGET_DIR="$PWD/target" cargo install -q --locked --path publisher --root "$work/install"
CARGO_TARGET_DIR="$PWD/target" cargo install -q --locked --path subscriber --root "$work/install"
"$work/install/bin/mdrelay-pub" --version
"$work/install/bin/mdrelay-sub" --version
"$work/install/bin/mdrelay-sub" --config config/sub-two-host.toml --check > /dev/null

if command -v systemd-analyze >/dev/null; then
    echo "== systemd-analyze verify deploy/systemd"
    mkdir "$work/units"
    for unit in deploy/systemd/*.service; do
        sed "s#/usr/local/bin/#$PWD/target/release/#" "$unit" > "$work/units/$(basename "$unit")"
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

echo "== promtool check config deploy/prometheus.yml, check and test the alerting rules, check metrics on the scrapes"
promtool=$(command -v promtool || true)
if [ -z "$promtool" ]; then
    (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get download prometheus >/dev/null; }; })
    dpkg-deb -x "$work"/prometheus_*.deb "$work/prometheus"
    promtool="$work/prometheus/usr/bin/promtool"
fi
"$promtool" check config deploy/prometheus.yml
"$promtool" check rules deploy/prometheus/alerts.yml
"$promtool" test rules deploy/prometheus/alerts_test.yml
scrapes=(target/tmp/metrics/*.prom)
[ -f "${scrapes[0]}" ] || { echo "no scrapes in target/tmp/metrics: publisher/tests/metrics.rs did not run" >&2; exit 1; }
for scrape in "${scrapes[@]}"; do
    echo "$scrape"
    out=$("$promtool" check metrics < "$scrape" 2>&1) || { echo "$out"; exit 1; }
    if [ -n "$out" ]; then echo "$out"; exit 1; fi
done

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
