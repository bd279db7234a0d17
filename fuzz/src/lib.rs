//! Fuzz target bodies.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
