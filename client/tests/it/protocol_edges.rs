//! Against peers made here for what a publisher of this build does not send: a resume judged
//! where the stream starts (after a cut, the ring's replay starts with `DATA`, no `FORMAT` first
//! since the greeting named the format, and a `FORMAT` later switches the format: the resume
//! worked, and only the first stream record says so, never the later switch); and a
//! retransmission service refusing with a reason longer than the 256 bytes read of it
//! (`MAX_REASON`), which is still a refusal, not a peer that is no retransmission service; and a publisher that never
//! reads its subscriber's echoes, whose echoes are each counted once, sent or dropped.

use mdrelay_client::{Builder, Event};
use mdrelay_client::{RecoveryEvent, Waited};
use mdrelay_codec::{Codec, Format, Limits, MessageScratch, collect_segment};
use mdrelay_harness::{STEP, accept_within, iex_data};
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::iextp::Segment;
use mdrelay_proto::relay::{
    Coalescer, Envelope, Hello, MAX_REASON, Protection, RecordHeader, RecordTag, Resume, Subscribe, Totals,
    control_record,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

const SESSION: u64 = 0x5e55;

/// The first `n` DEEP10 segments that carry messages, each encoded as one frame of `format`.
fn frames(format: Format, n: usize) -> Vec<Vec<u8>> {
    let path = iex_data().join("DEEP10.pcap.gz");
    let mut reader = CaptureReader::open(&path).unwrap();
    let mut codec = Codec::new(format, Limits::default());
    let mut out = Vec::new();
    while out.len() < n {
        let packet = reader.next_packet().unwrap().expect("DEEP10 has enough segments");
        let Ok(datagram) = mdrelay_iex::link::udp_datagram(packet.link_type, packet.data) else { continue };
        let Ok(segment) = Segment::parse(datagram.payload) else { continue };
        if segment.blocks().count() == 0 {
            continue;
        }
        let mut frame = Vec::new();
        MessageScratch::new().with(|list| {
            collect_segment(&segment, list);
            codec.encode_segment(1_000 + out.len() as i64, &segment, datagram.payload, list, &mut frame).unwrap();
        });
        out.push(frame);
    }
    out
}

fn data(format: Format, sequence: u64, frame: &[u8]) -> Vec<u8> {
    let header = RecordHeader { tag: RecordTag::Data, format, frame_count: 1, length: frame.len() as u32, sequence };
    [&header.to_bytes()[..], frame].concat()
}

/// Greets one connection as the publisher of `SESSION` whose next frame is `next`, and returns
/// the subscriber's answer.
fn greet(listener: &TcpListener, next: u64) -> (TcpStream, Subscribe) {
    let mut s = accept_within(listener, STEP);
    s.set_read_timeout(Some(STEP)).unwrap();
    s.write_all(&Hello::new(Format::Sbe, SESSION, 1, next).to_bytes()).unwrap();
    let mut answer = [0u8; Subscribe::V2_LEN];
    s.read_exact(&mut answer).unwrap();
    (s, Subscribe::parse(&answer).expect("a subscriber's answer"))
}

#[test]
fn a_resume_whose_replay_starts_with_data_is_a_resume_and_a_later_format_switch_is_not_a_failed_one() {
    let sbe = frames(Format::Sbe, 6);
    let capnp = frames(Format::Capnp, 8);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let publisher = std::thread::spawn(move || {
        // Frames 1 to 3, then the connection is cut.
        let (mut s, answer) = greet(&listener, 1);
        assert_eq!(answer.resume, Resume::Live);
        s.write_all(&control_record(RecordTag::Format, Format::Sbe, 1, &[])).unwrap();
        for seq in 1..=3u64 {
            s.write_all(&data(Format::Sbe, seq, &sbe[seq as usize - 1])).unwrap();
        }
        drop(s);
        // The resume: frames 4 to 6 straight after the greeting, then a switch to Cap'n Proto
        // for frames 7 and 8, then the end.
        let (mut s, answer) = greet(&listener, 4);
        let mut bytes = Vec::new();
        for seq in 4..=6u64 {
            bytes.extend(data(Format::Sbe, seq, &sbe[seq as usize - 1]));
        }
        bytes.extend(control_record(RecordTag::Format, Format::Capnp, 7, &[]));
        for seq in 7..=8u64 {
            bytes.extend(data(Format::Capnp, seq, &capnp[seq as usize - 1]));
        }
        let mut totals = Vec::new();
        Totals { frames: 8, ..Totals::default() }.write(&mut totals);
        bytes.extend(control_record(RecordTag::End, Format::Capnp, 9, &totals));
        s.write_all(&bytes).unwrap();
        // Held until the subscriber leaves.
        let _ = s.read_to_end(&mut Vec::new());
        answer.resume
    });
    let mut subscriber = Builder::tcp(addr.to_string()).build().unwrap();
    let started = Instant::now();
    let (mut sequences, mut resumes) = (Vec::new(), Vec::new());
    while let Some(event) = subscriber.next_event().unwrap() {
        assert!(started.elapsed() < Duration::from_secs(60), "the stream took too long");
        match event {
            Event::Frame(frame) => {
                assert!(frame.decode_error().is_none(), "frame {}: {:?}", frame.sequence(), frame.decode_error());
                sequences.push(frame.sequence());
            }
            Event::Resumed { asked, offered } => resumes.push((asked, offered)),
            _ => {}
        }
    }
    assert_eq!(publisher.join().unwrap(), Resume::From(4), "the subscriber asked for the frame after frame 3");
    assert_eq!(sequences, (1..=8).collect::<Vec<u64>>(), "every frame once");
    assert_eq!(resumes, [(4, 4)], "resumed where asked, and the switch at frame 7 is no resume");
    let counters = subscriber.counters();
    assert_eq!((counters.reconnects, counters.resumes, counters.lost), (1, 1, 0), "{counters:?}");
}

/// A UDP `DATA` datagram of one frame.
fn datagram(format: Format, sequence: u64, frame: &[u8]) -> Vec<u8> {
    let mut coalescer =
        Coalescer::new(Envelope::Datagram { session: SESSION, protection: Protection::NONE }, usize::MAX);
    coalescer.push(sequence, format, frame, |_| panic!("one frame fits")).unwrap();
    let mut out = Vec::new();
    coalescer.flush(|sealed| out = sealed.bytes.to_vec());
    out
}

#[test]
fn a_retransmission_service_refusing_with_a_reason_past_the_limit_is_a_refusal_with_that_reason_cut() {
    let reason: Vec<u8> = b"this service is closed for maintenance; ".iter().copied().cycle().take(5000).collect();
    let service = TcpListener::bind("127.0.0.1:0").unwrap();
    let service_addr = service.local_addr().unwrap();
    // Made by hand: this build's senders cut a reason to MAX_REASON bytes.
    let header =
        RecordHeader { tag: RecordTag::Refuse, format: Format::Raw, frame_count: 0, length: 5000, sequence: 0 };
    let refusal = [&header.to_bytes()[..], &reason].concat();
    let server = std::thread::spawn(move || {
        let mut s = accept_within(&service, Duration::from_secs(60));
        s.write_all(&refusal).unwrap();
        // Held until the subscriber leaves.
        s.set_read_timeout(Some(STEP)).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    });
    let mut subscriber = Builder::udp("127.0.0.1:0")
        .recovery(service_addr.to_string())
        .recovery_delay(Duration::from_millis(1))
        .build()
        .unwrap();
    let local = subscriber.local_addrs()[0];
    // Frames 1 and 3: frame 2 is missing, and asked of the service.
    let sbe = frames(Format::Sbe, 3);
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    for seq in [1u64, 3] {
        sender.send_to(&datagram(Format::Sbe, seq, &sbe[seq as usize - 1]), local).unwrap();
    }
    let started = Instant::now();
    let refused = loop {
        assert!(started.elapsed() < Duration::from_secs(60), "no answer of the service came");
        match subscriber.next_event_timeout(Duration::from_millis(100)).unwrap() {
            Waited::Event(Event::Recovery(RecoveryEvent::Refused { reason })) => break reason,
            Waited::Finished => panic!("the stream ended first"),
            _ => {}
        }
    };
    let expected = format!("{} [the first {MAX_REASON} of 5000 bytes]", String::from_utf8_lossy(&reason[..MAX_REASON]));
    assert!(refused.contains("refused the recovery connection"), "{refused:.300}");
    assert!(refused.ends_with(&expected), "the reason, cut at {MAX_REASON} bytes: {refused:.600}");
    subscriber.close();
    server.join().unwrap();
}

#[test]
fn echoes_a_publisher_never_reads_are_each_counted_once_sent_or_dropped_at_the_end() {
    // Far more echoes than the kernel's buffers and the subscriber's bound on echoes waiting
    // hold: at the end some wait unsent.
    const FRAMES: u64 = 600_000;
    let sbe = frames(Format::Sbe, 1);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let publisher = std::thread::spawn(move || {
        let (mut s, answer) = greet(&listener, 1);
        assert!(answer.echo, "the subscriber asked to echo");
        let mut bytes = control_record(RecordTag::Format, Format::Sbe, 1, &[]);
        for seq in 1..=FRAMES {
            bytes.extend(data(Format::Sbe, seq, &sbe[0]));
            if bytes.len() > 1 << 20 {
                s.write_all(&bytes).unwrap();
                bytes.clear();
            }
        }
        let mut totals = Vec::new();
        Totals { frames: FRAMES, ..Totals::default() }.write(&mut totals);
        bytes.extend(control_record(RecordTag::End, Format::Sbe, FRAMES + 1, &totals));
        s.write_all(&bytes).unwrap();
        // Never reads an echo; holds the connection until the subscriber is done.
        let _ = done_rx.recv_timeout(Duration::from_secs(120));
    });
    let mut subscriber = Builder::tcp(addr.to_string()).echo_every(1).build().unwrap();
    let started = Instant::now();
    while let Some(event) = subscriber.next_event().unwrap() {
        assert!(started.elapsed() < Duration::from_secs(120), "the stream took too long");
        if matches!(event, Event::End(_)) {
            break;
        }
    }
    let c = subscriber.counters();
    assert_eq!(c.frames, FRAMES);
    assert!(c.echoes_dropped > 0, "the way back was full: {c:?}");
    assert_eq!(c.echoes_sent + c.echoes_dropped, FRAMES, "every echo counted once: {c:?}");
    drop(subscriber);
    done_tx.send(()).unwrap();
    publisher.join().unwrap();
}
