//! The pacing schedule on a fake clock: nothing here waits.

use super::pacing::*;

const MS: i64 = 1_000_000;
/// The fake clock's (monotonic, wall-clock) time at the anchor.
const ANCHOR: (i64, i64) = (5_000 * MS, 1_700_000_000_000 * MS);

fn original() -> PaceSchedule {
    PaceSchedule::new(PaceMode::Original { speed: 10.0, max_gap_s: 1.0 })
}

#[test]
fn original_timing_is_scaled_and_anchored() {
    let mut p = original();
    let t0 = p.next(1_000_000_000, 1, || ANCHOR);
    assert_eq!(t0, Paced { target: Some(ANCHOR.0), publish_time: Some(ANCHOR.1), reanchored: None });
    // 200 ms of capture time at speed 10 is 20 ms; the clock is not read again.
    let t1 = p.next(1_200_000_000, 1, || unreachable!("read only to anchor"));
    assert_eq!(t1.target, Some(ANCHOR.0 + 20 * MS));
    assert_eq!(t1.publish_time.unwrap() - t0.publish_time.unwrap(), 20 * MS, "publish times follow the schedule");
    // Due only while in the future.
    assert_eq!(p.due(1_300_000_000, || ANCHOR.0), Some(ANCHOR.0 + 30 * MS));
    assert_eq!(p.due(1_300_000_000, || ANCHOR.0 + 30 * MS), None);
    // A capture time before the anchor is due at the anchor, not before it.
    assert_eq!(p.next(900_000_000, 1, || unreachable!()).target, Some(ANCHOR.0));
}

#[test]
fn fixed_rate_schedules_by_messages_sent() {
    let mut p = PaceSchedule::new(PaceMode::Rate { per_second: 1000.0 });
    let t0 = p.next(0, 5, || ANCHOR).target.unwrap();
    let t1 = p.next(0, 0, || unreachable!()).target.unwrap();
    let t2 = p.next(0, 5, || unreachable!()).target.unwrap();
    // 5 messages at 1000/s is 5 ms; the heartbeat between counts as one message.
    assert_eq!((t1 - t0, t2 - t1), (5 * MS, MS));
}

#[test]
fn a_jump_in_the_capture_clock_is_not_waited_out() {
    let mut p = original();
    p.next(0, 1, || ANCHOR);
    // A century ahead, then back: each starts the schedule again (max_gap is 1 s here).
    let ahead = p.next(100 * 365 * 86_400 * 1_000_000_000, 1, || (ANCHOR.0 + MS, ANCHOR.1 + MS));
    assert_eq!(ahead.target, Some(ANCHOR.0 + MS));
    assert!(ahead.reanchored.is_some_and(|jump| jump > 1e8));
    let back = p.next(1_000_000, 1, || (ANCHOR.0 + 2 * MS, ANCHOR.1 + 2 * MS));
    assert!(back.reanchored.is_some_and(|jump| jump < -1e8));
    assert_eq!(p.reanchors(), 2);
    // An ordinary step of the clock is still paced: 100 ms at speed 10 is 10 ms.
    let t0 = p.next(2_000_000, 1, || unreachable!()).target.unwrap();
    let t1 = p.next(102_000_000, 1, || unreachable!()).target.unwrap();
    assert_eq!(t1 - t0, 10 * MS);
    assert_eq!(p.reanchors(), 2);
}

#[test]
fn top_speed_has_no_target_and_rewind_anchors_again() {
    let mut p = PaceSchedule::new(PaceMode::TopSpeed);
    assert_eq!(p.next(0, 1, || ANCHOR), Paced { target: None, publish_time: None, reanchored: None });
    assert_eq!(p.due(i64::MAX, || unreachable!("no clock read at top speed")), None);
    let mut p = original();
    p.next(10_000_000_000, 1, || ANCHOR);
    p.next(10_500_000_000, 1, || unreachable!());
    // A new pass over the capture starts from its own first segment, not 10 s back.
    p.rewind();
    let later = (ANCHOR.0 + 100 * MS, ANCHOR.1 + 100 * MS);
    assert_eq!(p.next(0, 1, || later).target, Some(later.0));
    assert_eq!(p.reanchors(), 0);
}

#[test]
fn targets_beyond_the_clock_are_at_once_not_a_panic() {
    let mut p = PaceSchedule::new(PaceMode::Original { speed: 1e-9, max_gap_s: f64::MAX });
    p.next(0, 1, || (i64::MAX - 10, 0));
    let far = p.next(i64::MAX, 1, || unreachable!());
    assert_eq!((far.target, far.publish_time), (None, None));
    let mut p = PaceSchedule::new(PaceMode::Rate { per_second: 1e-12 });
    p.next(0, u64::MAX, || (0, 0));
    assert_eq!(p.next(0, 1, || unreachable!()).target, Some(i64::MAX));
}
