mod common;
use common::*;
use mdrelay_client::Builder;

#[test]
fn tcp_smoke() {
    let deep10 = capture("DEEP10");
    let mut p = publisher(&["--capture", &deep10, "--tcp", "127.0.0.1:0", "--wait-subscribers", "1", "--slow-subscriber", "block", "--format", "sbe"]);
    let addr = p.serving_on().to_string();
    let mut sub = Builder::tcp(addr).build().unwrap();
    let t0 = std::time::Instant::now();
    let (tally, events, end) = receive_all(&mut sub, RUN);
    eprintln!("{:?} {events:?} {end:?}", t0.elapsed());
    eprintln!("{:?}", sub.counters());
    tally.assert_reference(&mdrelay_harness::expected("DEEP10.json"), "tcp sbe");
    assert!(end.unwrap().complete);
    p.finish(RUN).assert_success();
}
