//! What every source hands the engine: one IEX-TP segment, its time, and for a frame relayed
//! from another publisher the origin's stamp and number.
//!
//! A module of its own because [`upstream`](crate::upstream) yields these items and
//! [`source`](crate::source) wraps the upstream source: defined in either, the two modules would
//! depend on each other.

/// One segment from the source.
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    /// Its time on the source's clock (capture time or IEX send time), ns, for pacing.
    pub time_ns: i64,
    /// The IEX-TP segment bytes.
    pub bytes: &'a [u8],
    /// For a frame relayed from another publisher: the origin's stamp and number, which the
    /// frame keeps instead of new ones.
    pub origin: Option<Origin>,
}

/// The first publisher of a chain's stamp and number for one frame, carried through every relay
/// so a leaf measures origin-to-leaf latency and sees the origin's gaps as gaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The origin's publish time, ns since the epoch.
    pub publish_time: i64,
    /// The origin's sequence number for the frame.
    pub sequence: u64,
}
