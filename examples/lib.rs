//! Shared helpers for the multicdn example programs: summaries and tables they print.

#![forbid(unsafe_code)]

pub mod scenario;
pub mod summary;
