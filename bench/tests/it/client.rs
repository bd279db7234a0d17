//! `mdrelay-bench client` as users run it: a short comparison of the program on mdrelay-client
//! with mdrelay-sub, which must write the table and the JSON, alternate the two programs, and
//! have both receive exactly what the publisher sent. No timing is asserted: the host decides
//! those.

use mdrelay_harness::Process;
use std::time::Duration;

const BENCH: &str = env!("CARGO_BIN_EXE_mdrelay-bench");

#[test]
fn a_short_comparison_alternates_the_programs_and_both_receive_everything() {
    let _serial = mdrelay_harness::serial();
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let plots_arg = plots.display().to_string();
    let args =
        ["client", "--repetitions", "2", "--messages", "20000", "--top-speed-messages", "50000", "--plots", &plots_arg];
    let done = Process::start(BENCH, args).finish(Duration::from_secs(300));
    done.assert_success();
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(plots.join("client.json")).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let order: Vec<(&str, &str)> =
        runs.iter().map(|r| (r["mode"].as_str().unwrap(), r["program"].as_str().unwrap())).collect();
    assert_eq!(
        order,
        [
            ("latency", "binary"),
            ("latency", "library"),
            ("latency", "library"),
            ("latency", "binary"),
            ("top-speed", "binary"),
            ("top-speed", "library"),
            ("top-speed", "library"),
            ("top-speed", "binary"),
        ],
        "alternating, the first to go swapped at each repetition"
    );
    for r in runs {
        let row = &r["row"];
        assert_eq!(row["totals_match"], true, "{r}");
        assert_eq!(row["messages_received"], row["messages_sent"], "{r}");
        assert!(row["latency_ns"]["count"].as_u64().unwrap() > 0, "{r}");
    }
    let comparisons = report["comparisons"].as_array().unwrap();
    assert_eq!(comparisons.len(), 2);
    for c in comparisons {
        assert!(c["throughput_ratio"].as_f64().unwrap() > 0.0, "{c}");
    }
    let table = std::fs::read_to_string(plots.join("client.md")).unwrap();
    assert!(table.contains("**library / binary**") && table.contains("mdrelay-client program"), "{table}");
}
