//! Prometheus scrapes over real HTTP: a GET on the endpoint, and the text format parsed into
//! samples, so tests compare what an operator's Prometheus would store.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One scrape: every sample, keyed by its name with its labels as printed
/// (`mdrelay_pub_frames_sent_total{format="sbe",transport="tcp"}`), and the raw text.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Sample values by series.
    pub samples: BTreeMap<String, f64>,
    /// The body as served.
    pub text: String,
}

impl Scrape {
    /// The value of the series `name` with exactly `labels` (`format="sbe",transport="tcp"`,
    /// in the order the exporter prints them), or the unlabelled series when `labels` is "".
    pub fn get(&self, name: &str, labels: &str) -> Option<f64> {
        let key = if labels.is_empty() { name.to_string() } else { format!("{name}{{{labels}}}") };
        self.samples.get(&key).copied()
    }

    /// The sum over every series of `name`, whatever its labels; 0 when there is none.
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|(k, _)| k.as_str() == name || k.strip_prefix(name).is_some_and(|rest| rest.starts_with('{')))
            .map(|(_, v)| v)
            .sum()
    }

    /// The metric names served (the part before any labels), a histogram's by its own name
    /// (`x` for `x_bucket`, `x_sum` and `x_count`) as well.
    pub fn names(&self) -> std::collections::BTreeSet<String> {
        let mut names = std::collections::BTreeSet::new();
        for key in self.samples.keys() {
            let name = key.split('{').next().unwrap_or(key);
            if let Some(base) = name.strip_suffix("_bucket")
                && self.samples.keys().any(|k| k.starts_with(&format!("{base}_count")))
            {
                names.insert(base.to_string());
            }
            names.insert(name.to_string());
        }
        names
    }

    /// A histogram's cumulative buckets, `(upper bound, count)` in order of the bound (`+Inf`
    /// last): the `NAME_bucket` series whose other labels are exactly `labels` (`` for none).
    pub fn buckets(&self, name: &str, labels: &str) -> Vec<(f64, f64)> {
        let prefix = format!("{name}_bucket{{");
        let mut buckets: Vec<(f64, f64)> = self
            .samples
            .iter()
            .filter_map(|(key, value)| {
                let inner = key.strip_prefix(&prefix)?.strip_suffix('}')?;
                let (others, le) = match inner.rsplit_once(",le=\"") {
                    Some((others, le)) => (others, le),
                    None => ("", inner.strip_prefix("le=\"")?),
                };
                let le = le.strip_suffix('"')?;
                let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
                (others == labels).then_some((bound, *value))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        buckets
    }

    /// The upper bound of the bucket the `q` quantile falls in (what `histogram_quantile` reads
    /// before it interpolates), or `None` when the histogram is empty or not served.
    pub fn quantile_bucket(&self, name: &str, labels: &str, q: f64) -> Option<f64> {
        let buckets = self.buckets(name, labels);
        let total = buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        buckets.iter().find(|(_, count)| *count >= q * total).map(|(bound, _)| *bound)
    }
}

/// GETs `/metrics` from `addr` (HTTP/1.0, so the body ends with the connection) and parses it;
/// an error says what failed. Bounded by a 5 s timeout on every step.
pub fn scrape(addr: SocketAddr) -> Result<Scrape, String> {
    let (status, body) = get(addr, "/metrics")?;
    if status != 200 {
        return Err(format!("{addr}: status {status}: {body}"));
    }
    Ok(parse(&body))
}

/// GETs `path` from `addr` over HTTP/1.0: the status code and the body; an error says what
/// failed. Bounded by a 5 s timeout on every step.
pub fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let limit = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, limit).map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(limit)).map_err(|e| e.to_string())?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(|e| format!("write to {addr}: {e}"))?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| format!("read from {addr}: {e}"))?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| format!("{addr}: no HTTP header end"))?;
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("{addr}: {status_line:?} is no HTTP status line"))?;
    Ok((status, body.to_string()))
}

/// Parses the Prometheus text format's sample lines (comments skipped).
pub fn parse(text: &str) -> Scrape {
    let mut samples = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        // The value follows the last space (label values here contain none after the '}').
        if let Some((series, value)) = line.rsplit_once(' ')
            && let Ok(v) = value.parse::<f64>()
        {
            samples.insert(series.to_string(), v);
        }
    }
    Scrape { samples, text: text.to_string() }
}

/// The `mdrelay_*` metric names the Grafana dashboard (`deploy/grafana/mdrelay.json`) queries, in
/// every panel target's `expr`, without the `_sum`/`_count`/`_bucket` of a summary's series.
pub fn dashboard_queries() -> std::collections::BTreeSet<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/mdrelay.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dashboard: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
    let mut names = std::collections::BTreeSet::new();
    collect_queries(&dashboard, &mut names);
    names
}

/// The mdrelay series an alerting rule of `deploy/prometheus/alerts.yml` reads (the metric
/// names in its `expr:` lines, a histogram's by its own name).
pub fn alert_queries() -> std::collections::BTreeSet<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/alerts.yml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut names = std::collections::BTreeSet::new();
    for expr in text.lines().filter_map(|line| line.trim().strip_prefix("expr:")) {
        metric_names(expr, &mut names);
    }
    names
}

/// Adds the `mdrelay_` metric names `expr` reads to `out`.
fn metric_names(expr: &str, out: &mut std::collections::BTreeSet<String>) {
    let mut rest = expr;
    while let Some(at) = rest.find("mdrelay_") {
        let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
        out.insert(base.to_string());
    }
}

fn collect_queries(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::String(expr)) = map.get("expr") {
                metric_names(expr, out);
            }
            map.values().for_each(|v| collect_queries(v, out));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_queries(v, out)),
        _ => {}
    }
}
