//! The hand-over of a subscriber's socket between the hot thread and the subscriber's task.

use super::handover::{Handover, Taken, Wrote};
use mdrelay_codec::Format;

/// A handover whose task is current at frame 10 in SBE.
fn open_at_10() -> Handover {
    let mut h = Handover::default();
    h.open(Format::Sbe, 10);
    h
}

#[test]
fn a_closed_socket_is_never_offered() {
    let h = Handover::default();
    assert!(!h.offer(Format::Sbe, 1));
    assert!(!h.is_open());
}

#[test]
fn only_the_record_owed_next_in_the_format_last_sent_is_offered() {
    let h = open_at_10();
    assert!(h.offer(Format::Sbe, 10));
    assert!(!h.offer(Format::Sbe, 11), "a record after one still queued for the task");
    assert!(!h.offer(Format::Sbe, 9));
    assert!(!h.offer(Format::Json, 10), "a new format needs a FORMAT record first: the task's");
}

#[test]
fn records_written_whole_are_skipped_by_the_task_and_the_next_is_offered() {
    let mut h = open_at_10();
    h.wrote(10, 12, Wrote::Whole);
    assert!(h.offer(Format::Sbe, 12));
    h.wrote(12, 15, Wrote::Whole);
    assert_eq!(h.taken(10, 12), Taken::Written);
    assert_eq!(h.taken(12, 15), Taken::Written);
    assert!(h.is_open(), "skipping what the hot thread wrote does not take the socket back");
    assert_eq!(h.written_until(), 15);
}

#[test]
fn a_record_written_in_part_is_finished_by_the_task_which_takes_the_socket_back() {
    let mut h = open_at_10();
    h.wrote(10, 12, Wrote::Part(7));
    assert!(!h.is_open());
    assert!(!h.offer(Format::Sbe, 12), "nothing may follow the part until the task wrote the rest");
    assert_eq!(h.taken(10, 12), Taken::From(7));
    assert_eq!(h.taken(12, 13), Taken::Own, "the next record, not offered, is the task's");
    h.open(Format::Sbe, 13);
    assert!(h.offer(Format::Sbe, 13));
}

#[test]
fn a_socket_that_would_block_goes_back_to_the_task() {
    let mut h = open_at_10();
    h.wrote(10, 12, Wrote::Nothing);
    assert!(!h.offer(Format::Sbe, 10));
    assert_eq!(h.taken(10, 12), Taken::Own);
}

#[test]
fn the_task_does_not_reopen_behind_records_the_hot_thread_wrote() {
    let mut h = open_at_10();
    h.wrote(10, 12, Wrote::Whole);
    h.wrote(12, 14, Wrote::Nothing);
    // The task has taken nothing yet: its next frame is still 10.
    h.open(Format::Sbe, 10);
    assert!(!h.is_open(), "records 10..12 are still on their way to the task");
    assert_eq!(h.taken(10, 12), Taken::Written);
    assert_eq!(h.taken(12, 14), Taken::Own);
    h.open(Format::Sbe, 14);
    assert!(h.offer(Format::Sbe, 14));
}

#[test]
fn an_open_socket_keeps_the_hot_threads_place_when_the_task_catches_up() {
    let mut h = open_at_10();
    h.wrote(10, 12, Wrote::Whole);
    h.wrote(12, 14, Wrote::Whole);
    assert_eq!(h.taken(10, 12), Taken::Written);
    // The task, idle again after 10..12, says it is at 12: the hot thread is at 14.
    h.open(Format::Sbe, 12);
    assert!(h.offer(Format::Sbe, 14), "the task must not move the socket's place back");
    assert!(!h.offer(Format::Sbe, 12), "12..14 is written: offering it again would duplicate it");
}

#[test]
fn a_closed_socket_stays_closed_until_the_task_opens_it() {
    let mut h = open_at_10();
    h.close();
    assert!(!h.offer(Format::Sbe, 10));
    h.open(Format::Sbe, 10);
    assert!(h.offer(Format::Sbe, 10));
}
