//! The one error type of this crate.

use std::path::PathBuf;

/// What went wrong, and what would be valid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SteeringError {
    /// A journal or scoreboard file could not be read or written.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`append to the journal`, `read the journal`).
        action: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line of a JSON Lines file is not what this crate wrote.
    #[error("{path}:{line}: not a journal entry: {message}")]
    BadJournalLine {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A network prefix could not be read.
    #[error(
        "invalid prefix {value:?}: {why} (write an address and a length, like 192.0.2.0/24 or 2001:db8::/32)"
    )]
    BadPrefix {
        /// The text given.
        value: String,
        /// Why it was refused.
        why: &'static str,
    },
    /// A line of a prefix table ([`crate::resolve::PrefixTable::from_lines`]) that could not
    /// be read.
    #[error("line {line}: {source}")]
    PrefixTableLine {
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        source: Box<SteeringError>,
    },
    /// Two scoreboards or sketches that cannot be merged.
    #[error("cannot merge: {0}")]
    Merge(String),
    /// A simulated world that cannot be played.
    #[error("cannot simulate: {0}")]
    Sim(String),
    /// A scoreboard or engine setting out of range.
    #[error("invalid setting {field}: {why}")]
    Config {
        /// The setting.
        field: &'static str,
        /// Why, and what would be valid.
        why: String,
    },
    /// A MaxMind database could not be opened or read.
    #[error("{path}: cannot use as a MaxMind database: {message}")]
    MaxMind {
        /// The file.
        path: PathBuf,
        /// The reader's message.
        message: String,
    },
}

impl SteeringError {
    /// Whether trying the same thing again may succeed (I/O errors only).
    pub fn is_retryable(&self) -> bool {
        matches!(self, SteeringError::Io { .. })
    }
}
