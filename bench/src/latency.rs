//! What the latency runs share: the transports `loopback` and its floor run over, and latency
//! percentiles. Both `loopback` and `floor` use these, and `loopback` uses `floor`, so they live
//! here rather than in either.

use clap::ValueEnum;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Transports the comparison can run over.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// TCP to 127.0.0.1.
    Tcp,
    /// UDP unicast to 127.0.0.1.
    Udp,
    /// UDP multicast to 239.255.0.1 on interface 127.0.0.1.
    Multicast,
    /// Through a `nats-server` (JetStream) the run starts on loopback, after TCP as the reference.
    Nats,
    /// Through a three-node `nats-server` cluster, stream replicated three times (`--nats-cluster`).
    #[value(skip)]
    NatsCluster,
    /// TCP, UDP and multicast in turn.
    All,
}

impl Transport {
    /// The transports `self` stands for.
    pub fn each(self) -> Vec<Transport> {
        match self {
            Transport::All => vec![Transport::Tcp, Transport::Udp, Transport::Multicast],
            // NATS beside the TCP fan-out it is compared with, in the same run.
            Transport::Nats => vec![Transport::Tcp, Transport::Nats],
            t => vec![t],
        }
    }

    /// Whether it goes through NATS.
    pub fn is_nats(self) -> bool {
        matches!(self, Transport::Nats | Transport::NatsCluster)
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
            Transport::Multicast => "multicast",
            Transport::Nats => "nats",
            Transport::NatsCluster => "nats-cluster",
            Transport::All => "all",
        }
    }
}

/// Latency percentiles, ns.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
    /// Largest.
    pub max: u64,
    /// Values recorded.
    pub count: u64,
}

impl Percentiles {
    /// The percentiles of `h`.
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        Percentiles {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            p9999: h.value_at_quantile(0.9999),
            max: h.max(),
            count: h.len(),
        }
    }

    /// From the subscriber's report (`latency_ns`).
    pub fn from_report(v: &serde_json::Value) -> Percentiles {
        let get = |k: &str| v[k].as_u64().unwrap_or(0);
        Percentiles {
            p50: get("p50"),
            p90: get("p90"),
            p99: get("p99"),
            p999: get("p999"),
            p9999: get("p9999"),
            max: get("max"),
            count: get("count"),
        }
    }
}
