//! What the server machines' tests share.

use proptest::prelude::*;

/// Up to `max` bytes and up to 5 points to cut them at (sorted, inside the bytes).
pub(crate) fn bytes_and_cuts(max: usize) -> impl Strategy<Value = (Vec<u8>, Vec<usize>)> {
    (proptest::collection::vec(any::<u8>(), 0..max), proptest::collection::vec(0..max, 0..6)).prop_map(
        |(bytes, cuts)| {
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < bytes.len()).collect();
            cuts.sort_unstable();
            (bytes, cuts)
        },
    )
}
