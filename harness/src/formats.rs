//! The wire formats a test covers.

use mdrelay_codec::Format;

/// Every format, unless `MDRELAY_FORMATS=sbe,raw` narrows the run while someone works on one
/// format (CI never sets it); panics on a name that is not a format.
pub fn formats() -> Vec<Format> {
    match std::env::var("MDRELAY_FORMATS") {
        Ok(list) => list
            .split(',')
            .map(|f| f.trim().parse().unwrap_or_else(|_| panic!("MDRELAY_FORMATS: {f:?} is not a format")))
            .collect(),
        Err(_) => Format::ALL.to_vec(),
    }
}
