//! A caller that must stop at once (a wake ends its wait); and peers that greet correctly and then
//! misbehave, made here with std::net on loopback:
//! one that sends records producing nothing, without end (a `FORMAT` record of the format in
//! use, over and over), which must not hold up the caller's deadline, nor must a rogue that
//! floods a NATS subject (a real `nats-server`) with datagrams producing nothing; and ones that refuse with
//! a reason that is huge, or that holds newlines and terminal escapes, which must be bounded in
//! memory and escaped wherever it is shown.

use mdrelay_client::{Builder, Error, Waited};
use mdrelay_codec::Format;
use mdrelay_harness::alloc::count_allocations;
use mdrelay_harness::receive::{fake_publisher, flood, refuse};
use mdrelay_harness::{STEP, shared};
use mdrelay_proto::relay::{MAX_REASON, RecordTag, Subscribe, control_record};
use std::io::Write;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SESSION: u64 = 0x5e55;
/// The longest a flood goes on: far longer than any wait below should take.
const FLOOD: Duration = Duration::from_secs(8);

/// How a hostile peer's connection ended.
#[derive(Debug)]
struct Flooded {
    /// Bytes it sent.
    bytes: u64,
    /// It stopped at its time limit, the subscriber still connected.
    ran_out: bool,
}

/// A peer that greets one subscriber as the publisher of `SESSION`, reads its answer, then
/// writes `first` once and `record` over and over, until the subscriber leaves or `FLOOD`
/// passes.
fn flooding_publisher(first: Vec<u8>, record: Vec<u8>) -> (SocketAddr, JoinHandle<Flooded>) {
    fake_publisher(SESSION, move |mut s, answer| {
        Subscribe::parse(&answer).expect("a subscriber's answer");
        s.write_all(&first).unwrap();
        let (bytes, ran_out) = flood(&mut s, &record, FLOOD);
        Flooded { bytes: first.len() as u64 + bytes, ran_out }
    })
}

/// The flood a subscriber must have taken in while it waited, for its waits to say anything.
const FLOODED_BYTES: u64 = 1 << 20;

/// Waits for events with `wait` as the deadline while a flood goes on, until five waits have
/// timed out and the subscriber has taken in `FLOODED_BYTES` (or `FLOOD` passed): the longest a
/// wait took, and how many timed out. Both, because the flood may reach the subscriber late (a
/// NATS server delivers what was published after the subscription only) or in bursts on a busy
/// host: five timeouts alone once ended before 1 MiB had come.
fn waits_during_a_flood(subscriber: &mut mdrelay_client::Subscriber, wait: Duration) -> (Duration, u32) {
    let started = Instant::now();
    let (mut longest, mut timed_out) = (Duration::ZERO, 0);
    while (timed_out < 5 || subscriber.counters().bytes <= FLOODED_BYTES) && started.elapsed() < FLOOD {
        let asked = Instant::now();
        let waited = subscriber.next_event_timeout(wait).unwrap();
        longest = longest.max(asked.elapsed());
        match waited {
            Waited::TimedOut => timed_out += 1,
            Waited::Event(_) => {}
            Waited::Finished => panic!("the stream ended"),
        }
    }
    (longest, timed_out)
}

#[test]
fn records_that_produce_nothing_sent_without_end_do_not_hold_up_the_callers_deadline() {
    let _shared = shared();
    let format = control_record(RecordTag::Format, Format::Sbe, 1, &[]);
    let (addr, peer) = flooding_publisher(format.clone(), format);
    let mut subscriber = Builder::tcp(addr.to_string()).build().unwrap();
    let wait = Duration::from_millis(100);
    let (longest, timed_out) = waits_during_a_flood(&mut subscriber, wait);
    let received = subscriber.counters().bytes;
    subscriber.close();
    let flooded = peer.join().unwrap();
    eprintln!(
        "next_event_timeout({wait:?}) took {longest:?} at most over {timed_out} timeouts; {received} bytes received"
    );
    assert!(
        longest < Duration::from_secs(1),
        "next_event_timeout({wait:?}) returned after {longest:?} at most, while the peer sent {} MB of records \
         producing nothing ({flooded:?}, {timed_out} timeouts)",
        flooded.bytes >> 20
    );
    assert!(
        !flooded.ran_out && received > FLOODED_BYTES,
        "the waits timed out during the flood: {flooded:?}, {received}"
    );
}

/// A peer that greets, reads the answer and refuses the subscription with `reason` (the record
/// declaring `declared` bytes of it), then holds the connection until the subscriber leaves.
fn refusing_publisher(reason: Vec<u8>, declared: u32) -> (SocketAddr, JoinHandle<()>) {
    fake_publisher(SESSION, move |s, _| refuse(s, &reason, declared))
}

/// The error the subscriber ends with, and the largest single allocation made meanwhile.
fn refused_by(reason: Vec<u8>, declared: u32) -> (Error, usize) {
    let (addr, peer) = refusing_publisher(reason, declared);
    let (error, allocations) = count_allocations(|| {
        let mut subscriber = Builder::tcp(addr.to_string()).build().unwrap();
        let started = Instant::now();
        loop {
            assert!(started.elapsed() < STEP, "no refusal within {STEP:?}");
            match subscriber.next_event() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the stream ended without the refusal"),
                Err(error) => break error,
            }
        }
    });
    peer.join().unwrap();
    (error, allocations.largest)
}

#[test]
fn a_refusal_with_a_60_mib_reason_is_read_to_its_limit_and_no_further() {
    let _shared = shared();
    let reason: Vec<u8> = b"closed for maintenance; ".iter().copied().cycle().take(60 << 20).collect();
    let (error, largest) = refused_by(reason.clone(), reason.len() as u32);
    eprintln!("largest single allocation: {largest} bytes");
    let Error::Refused { reason: shown, .. } = &error else { panic!("{error:?}") };
    let kept = String::from_utf8_lossy(&reason[..MAX_REASON]);
    assert!(shown.starts_with(&*kept), "the reason's first {MAX_REASON} bytes: {shown:.400}");
    assert!(shown.len() < 2 * MAX_REASON, "{} bytes of reason shown", shown.len());
    assert!(shown.contains(&(60u32 << 20).to_string()), "says how long it was: {shown}");
    assert!(largest < 1 << 20, "largest single allocation {largest} bytes, for a reason of 60 MiB");
}

#[test]
fn a_refusal_reason_with_newlines_and_terminal_escapes_is_shown_escaped() {
    let _shared = shared();
    let forged = "upgrade\n2025-01-01T00:00:00.000000Z ERROR mdrelay_sub: forged line\r\x1b[2J\x1b]0;owned\x07";
    let (error, _) = refused_by(forged.as_bytes().to_vec(), forged.len() as u32);
    let shown = error.to_string();
    assert!(!shown.chars().any(char::is_control), "control characters reach the error's text: {shown:?}");
    assert!(
        shown.contains(
            r"upgrade\n2025-01-01T00:00:00.000000Z ERROR mdrelay_sub: forged line\r\u{1b}[2J\u{1b}]0;owned\u{7}"
        ),
        "{shown}"
    );
}

#[test]
#[cfg(feature = "nats")]
fn datagrams_that_produce_nothing_flooding_a_nats_subject_do_not_hold_up_the_callers_deadline() {
    use mdrelay_proto::relay::wire::{DatagramHeader, DatagramKind};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let _serial = mdrelay_harness::serial();
    let server = mdrelay_harness::NatsServer::start();
    let subject = "md.flood";
    // An echo datagram is a subscriber's, ignored by a subscriber: it gives the caller nothing.
    let echo = DatagramHeader {
        version: 1,
        format: Format::Sbe,
        kind: DatagramKind::Echo,
        frame_count: 0,
        protection: Default::default(),
        session: SESSION,
        sequence: 1,
    }
    .to_bytes()
    .to_vec();
    let url = server.url();
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = stop.clone();
    let rogue = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let client = async_nats::connect(url).await.unwrap();
            let (started, mut sent) = (Instant::now(), 0u64);
            while !flooding.load(Ordering::Relaxed) && started.elapsed() < FLOOD {
                for _ in 0..1024 {
                    client.publish(subject, echo.clone().into()).await.unwrap();
                }
                sent += 1024;
            }
            client.flush().await.unwrap();
            sent
        })
    });
    let mut subscriber = Builder::nats(server.url(), subject).build().unwrap();
    let wait = Duration::from_millis(100);
    let (longest, timed_out) = waits_during_a_flood(&mut subscriber, wait);
    let received = subscriber.counters().bytes;
    stop.store(true, Ordering::Relaxed);
    subscriber.close();
    let sent = rogue.join().unwrap();
    eprintln!(
        "next_event_timeout({wait:?}) took {longest:?} at most over {timed_out} timeouts; {sent} echoes sent, \
         {received} bytes received"
    );
    assert!(
        longest < Duration::from_secs(1),
        "next_event_timeout({wait:?}) returned after {longest:?} at most, while {sent} datagrams producing nothing \
         came ({timed_out} timeouts)"
    );
    assert!(received > FLOODED_BYTES, "the waits timed out during the flood: {received} bytes received");
}

/// A program that stops need not wait out a long timeout: a wake from another thread ends a
/// wait on a silent stream at once, and one made while no wait is in progress ends the next.
#[test]
fn a_wake_handle_ends_a_long_wait_on_a_silent_stream() {
    // A UDP subscriber on a port nobody sends to: its waits end only by their time or a wake.
    let mut subscriber = Builder::udp("127.0.0.1:0").build().unwrap();
    let long = Duration::from_secs(120);
    let waker = subscriber.wake_handle();
    let woke = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        waker.wake();
    });
    let started = Instant::now();
    assert!(matches!(subscriber.next_event_timeout(long).unwrap(), Waited::TimedOut));
    let took = started.elapsed();
    woke.join().unwrap();
    assert!(took < long / 4, "the wake did not end the wait: it took {took:?}");

    // Woken with no wait in progress: the next wait ends at once, and the one after waits again.
    subscriber.wake_handle().wake();
    let started = Instant::now();
    assert!(matches!(subscriber.next_event_timeout(long).unwrap(), Waited::TimedOut));
    assert!(started.elapsed() < long / 4, "a wake made before the wait was lost");
    let started = Instant::now();
    assert!(matches!(subscriber.next_event_timeout(Duration::from_millis(300)).unwrap(), Waited::TimedOut));
    assert!(started.elapsed() >= Duration::from_millis(300), "one wake ended two waits");
}
