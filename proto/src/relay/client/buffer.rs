//! A reusable byte buffer whose storage starts on an 8-byte boundary (ported from the
//! subscriber's read buffer, which it replaces).
//!
//! A connection's driver reads into it and the machine parses records out of it: no per-record
//! allocation. Relay
//! headers are multiples of 8 bytes, so a record that starts 8-aligned has an 8-aligned payload,
//! and Cap'n Proto frames (multiples of 8 themselves) stay aligned; but a publisher packs frames
//! back to back without padding, so a raw or SBE record can leave the next one misaligned. The
//! reader then copies that one payload into a second, aligned `RecordBuf` (see
//! [`RecordBuf::hold`]) when its format cares; shifting the whole buffer after every such record
//! would cost far more. The storage grows only as bytes actually arrive (doubling when full),
//! never because a length field asks for it.

/// Bytes kept ahead of the aligned start so the start can always be moved to an 8-aligned
/// address inside the allocation.
const SLACK: usize = 8;

/// A byte buffer read into at its end and consumed from its start.
#[derive(Debug)]
pub struct RecordBuf {
    storage: Vec<u8>,
    /// Index in `storage` of the first 8-aligned byte: position 0 of the buffer.
    base: usize,
    /// First unread byte, relative to `base`.
    start: usize,
    /// One past the last byte read, relative to `base`.
    end: usize,
}

fn aligned_base(storage: &[u8]) -> usize {
    // align_offset may in principle refuse (usize::MAX); a 0 base then only costs the
    // zero-copy read for aligned formats, which check alignment themselves.
    let offset = storage.as_ptr().align_offset(8);
    if offset < SLACK { offset } else { 0 }
}

impl RecordBuf {
    /// A buffer holding up to `capacity` bytes before it has to grow.
    pub fn new(capacity: usize) -> RecordBuf {
        let storage = vec![0u8; capacity + SLACK];
        let base = aligned_base(&storage);
        RecordBuf { storage, base, start: 0, end: 0 }
    }

    /// Bytes the buffer holds without growing.
    pub fn capacity(&self) -> usize {
        self.storage.len() - SLACK
    }

    /// The unread bytes.
    pub fn data(&self) -> &[u8] {
        &self.storage[self.base + self.start..self.base + self.end]
    }

    /// Unread byte count.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// True when nothing is unread.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Free space after the unread bytes, to read into; see [`RecordBuf::commit`].
    pub fn spare(&mut self) -> &mut [u8] {
        let end = self.base + self.capacity();
        &mut self.storage[self.base + self.end..end]
    }

    /// Marks `n` bytes of [`RecordBuf::spare`] as read.
    pub fn commit(&mut self, n: usize) {
        self.end = (self.end + n).min(self.capacity());
    }

    /// Drops `n` unread bytes from the start.
    pub fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            // Empty: the next read lands at the aligned start again.
            self.start = 0;
            self.end = 0;
        }
    }

    /// Replaces the contents with a copy of `bytes` and returns it, 8-aligned.
    pub fn hold(&mut self, bytes: &[u8]) -> &[u8] {
        self.clear();
        if bytes.len() > self.capacity() {
            self.grow(bytes.len().max(self.capacity() * 2));
        }
        self.spare()[..bytes.len()].copy_from_slice(bytes);
        self.commit(bytes.len());
        self.data()
    }

    /// Forgets every unread byte.
    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Moves the unread bytes to the start of the storage.
    fn compact(&mut self) {
        if self.start > 0 {
            self.storage.copy_within(self.base + self.start..self.base + self.end, self.base);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Makes room to read more, for a unit (record) of `want` bytes starting at the unread data:
    /// compacts when the unit would not fit behind the start or little room is left, and doubles
    /// the storage (up to `want`) when the buffer is full. Returns false when `want` exceeds
    /// `limit`; the caller refuses that unit.
    pub fn reserve_for(&mut self, want: usize, limit: usize) -> bool {
        if want > limit {
            return false;
        }
        let capacity = self.capacity();
        // Compact when the unit cannot fit where it is, or when the spare space has become too
        // small for efficient reads.
        if self.start > 0 && (self.start + want > capacity || capacity - self.end < capacity / 4) {
            self.compact();
        }
        if self.end == capacity && self.len() < want {
            // Here the buffer is full from an aligned start and holds less than `want`, so
            // capacity < want <= limit: doubling (up to the limit) always makes room.
            self.grow((capacity * 2).min(limit));
        }
        true
    }

    fn grow(&mut self, capacity: usize) {
        let mut storage = vec![0u8; capacity + SLACK];
        let base = aligned_base(&storage);
        let len = self.len();
        storage[base..base + len].copy_from_slice(self.data());
        self.storage = storage;
        self.base = base;
        self.start = 0;
        self.end = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aligned(b: &[u8]) -> bool {
        (b.as_ptr() as usize).is_multiple_of(8)
    }

    #[test]
    fn storage_is_aligned_and_grows_only_when_full() {
        let mut buf = RecordBuf::new(64);
        assert!(aligned(buf.data()));
        buf.spare()[..20].copy_from_slice(&[7; 20]);
        buf.commit(20);
        buf.consume(3);
        assert_eq!(buf.len(), 17);
        let mut scratch = RecordBuf::new(8);
        let held = scratch.hold(buf.data());
        assert!(aligned(held) && held == [7; 17]);
        buf.consume(17);
        assert!(buf.is_empty());
        assert!(aligned(buf.data()));

        // A unit larger than the buffer: the buffer doubles once it is full, not before.
        assert!(buf.reserve_for(1000, 4096));
        assert_eq!(buf.capacity(), 64);
        let n = buf.spare().len();
        buf.commit(n);
        assert!(buf.reserve_for(1000, 4096));
        assert_eq!(buf.capacity(), 128);
        assert!(aligned(buf.data()));
        assert!(!buf.reserve_for(5000, 4096));
    }
}
