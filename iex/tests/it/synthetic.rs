//! A synthetic capture of a million messages reads back with the independent reference reader
//! to exactly the counts and aggregates `inspect` gives.

use mdrelay_harness::{assert_matches_reference, reference_output};
use mdrelay_iex::capture_writer::{CaptureWriter, Container, WriterOptions};
use mdrelay_iex::inspect::{InspectReport, inspect_file};
use mdrelay_iex::synth::{SynthConfig, SyntheticDay};
use std::net::{Ipv4Addr, SocketAddrV4};

fn write_synthetic(path: &std::path::Path, config: SynthConfig, container: Container) {
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let options = WriterOptions { container, ..Default::default() };
    let mut writer = CaptureWriter::new(file, options).unwrap();
    let mut day = SyntheticDay::new(config).unwrap();
    let from = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 10378);
    let to = SocketAddrV4::new(Ipv4Addr::new(239, 255, 21, 4), 10378);
    while let Some(segment) = day.next_segment() {
        writer.write_udp(segment.send_time + 2_000, from, to, segment.bytes).unwrap();
    }
    writer.finish().unwrap();
}

/// Writes the synthetic day of `config` as `name` in a fresh directory; returns what `inspect`
/// makes of it and the reference reader's output for it.
fn inspect_synthetic(name: &str, config: SynthConfig, container: Container) -> (InspectReport, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    write_synthetic(&path, config, container);
    (inspect_file(&path).unwrap(), reference_output(&path))
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_million_synthetic_messages_agree_with_the_reference_reader() {
    let config = SynthConfig { messages: 1_000_000, symbols: 120, seed: 7, ..Default::default() };
    let (ours, reference) = inspect_synthetic("synthetic.pcap", config, Container::Pcap);
    assert_eq!(ours.messages, 1_000_000);
    assert_eq!(ours.symbols_with_trades_or_quotes, 120);
    assert_matches_reference(&serde_json::to_value(&ours).unwrap(), &reference);
}

#[test]
fn synthetic_pcapng_agrees_with_the_reference_reader() {
    let config = SynthConfig { messages: 50_000, symbols: 30, seed: 99, ..Default::default() };
    let (ours, reference) = inspect_synthetic("synthetic.pcapng", config, Container::PcapNg);
    assert_matches_reference(&serde_json::to_value(&ours).unwrap(), &reference);
}
