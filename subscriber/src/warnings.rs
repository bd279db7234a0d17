//! A budget for warnings about bad input: the network decides how much bad input arrives, so
//! only the first few of each kind are logged; the report's counters cover all of them.

use std::collections::BTreeMap;

/// Warnings of one kind logged before the rest are only counted.
const PER_KIND: u32 = 10;

/// Counts warnings by kind and says which to log.
#[derive(Debug, Default)]
pub struct Warnings {
    seen: BTreeMap<&'static str, u32>,
}

impl Warnings {
    /// True when a warning of `kind` should be logged; says once when a kind goes quiet.
    pub fn allow(&mut self, kind: &'static str) -> bool {
        let n = self.seen.entry(kind).or_default();
        *n = n.saturating_add(1);
        if *n == PER_KIND + 1 {
            tracing::warn!(kind, "further warnings of this kind are counted in the report, not logged");
        }
        *n <= PER_KIND
    }
}
