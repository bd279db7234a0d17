//! Who writes a TCP subscriber's socket, decided without I/O: the publisher's hot thread, when
//! the subscriber is current and its socket has room, or the subscriber's own task.
//!
//! A record written by the subscriber's task waits for that task to wake up, which on a quiet
//! machine costs tens of microseconds: more than the rest of the relay's latency put together.
//! So the hot thread writes a DATA record straight into the socket of a subscriber that is
//! *open*: its task has written everything it took, has nothing queued, replays nothing, and
//! the record is the very next one it is owed, in the format it was last sent. Everything else
//! (FORMAT records, replays, snapshots, END, a socket that would block, records behind others
//! still queued) stays with the task, which still takes every record from the shared queue, so
//! the slow-subscriber policies see the same queue as before.
//!
//! The two sides share one [`Handover`] under a lock the hot thread only try-locks (a task
//! holding it means the task is writing: the record is then the task's). The task asks, for
//! each DATA record it takes, whether the hot thread wrote it ([`Handover::taken`]): whole (it
//! only keeps its accounts), in part (it writes the rest) or not at all (it writes it, and
//! takes the socket back until it is current again, [`Handover::open`]). Frames are numbered
//! without gaps, so "the very next one it is owed" is a comparison of frame numbers: a record
//! that starts anywhere else is not the hot thread's to write.

use mdrelay_codec::Format;

/// The state one subscriber's socket is shared by: see the module's documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handover {
    /// The hot thread may write the next record: the task is current and idle.
    open: bool,
    /// The format the subscriber was last sent (valid while open).
    format: Option<Format>,
    /// The frame the socket is owed next (valid while open).
    next: u64,
    /// Every DATA record ending at or below this frame was written whole by the hot thread.
    written_until: u64,
    /// A record the hot thread wrote only in part: its first frame and the bytes written.
    partial: Option<(u64, usize)>,
}

/// What the hot thread did with a record it was offered ([`Handover::wrote`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrote {
    /// The socket took all of it.
    Whole,
    /// The socket took this many bytes, fewer than the record's (and more than none).
    Part(usize),
    /// The socket took nothing: it would block, or failed (the task finds out why itself).
    Nothing,
}

/// What the task is to do with a DATA record it took from the queue ([`Handover::taken`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// The hot thread wrote it whole: keep the accounts, write nothing.
    Written,
    /// The hot thread wrote its first bytes: write the rest, from this offset.
    From(usize),
    /// Not written: write it all.
    Own,
}

impl Handover {
    /// Whether the hot thread may write the DATA record of `format` starting at frame `first`
    /// now: the subscriber is current, and this is the record it is owed next.
    pub fn offer(&self, format: Format, first: u64) -> bool {
        self.open && self.format == Some(format) && self.next == first
    }

    /// Notes what the hot thread's write of a record offered (frames `first..next`) came to.
    pub fn wrote(&mut self, first: u64, next: u64, wrote: Wrote) {
        match wrote {
            Wrote::Whole => {
                self.next = next;
                self.written_until = next;
            }
            Wrote::Part(bytes) => {
                self.partial = Some((first, bytes));
                self.open = false;
            }
            Wrote::Nothing => self.open = false,
        }
    }

    /// The task took the DATA record starting at `first` and ending before `next` from the
    /// queue: what it is to write of it. A record it writes itself takes the socket back.
    pub fn taken(&mut self, first: u64, next: u64) -> Taken {
        if let Some((at, bytes)) = self.partial
            && at == first
        {
            self.partial = None;
            self.written_until = self.written_until.max(next);
            return Taken::From(bytes);
        }
        if next <= self.written_until {
            return Taken::Written;
        }
        self.open = false;
        Taken::Own
    }

    /// The task wrote everything it took and waits for the next record: from frame `next` of
    /// `format` on, the hot thread may write. Ignored while the hot thread is ahead of the task
    /// (records it wrote are still on their way to the task) or a record is written in part:
    /// the task opens again once it has taken them.
    pub fn open(&mut self, format: Format, next: u64) {
        if self.open || self.partial.is_some() || next < self.written_until {
            return;
        }
        self.open = true;
        self.format = Some(format);
        self.next = next;
    }

    /// The hot thread may no longer write: the task writes something of its own (END, a
    /// snapshot) or is done with the socket.
    pub fn close(&mut self) {
        self.open = false;
    }

    /// Whether the hot thread may write the next record.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Frames up to this one were written whole by the hot thread.
    pub fn written_until(&self) -> u64 {
        self.written_until
    }
}
