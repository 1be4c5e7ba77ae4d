//! State that survives a restart: the engine's memory, the plan in force, the health ledger,
//! the purges each provider still owes, and the journal of rounds.
//!
//! [`FileStore`] keeps them in a directory on local disk: `state.json` is replaced atomically
//! each round (written to a temporary file, flushed to disk, renamed over the old one, the
//! directory flushed), and `journal.ndjson` gets one line per round. The state file carries the
//! latest round's record too, so a crash between the two writes loses nothing: on load, a
//! round the journal lacks is written back from the state, and a line for a round already
//! read (or a torn last line) is dropped. The journal has no gap and no duplicate.
//! [`MemoryStore`] keeps the same in memory (tests, simulations); any other store implements
//! [`StateStore`].

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use multicdn_core::{ProviderId, SteeringPlan};
use multicdn_providers::fanout::Outstanding;
use multicdn_steering::engine::EngineState;
use serde::{Deserialize, Serialize};

use crate::ledger::HealthLedger;
use crate::operator::{OperatorRecord, Overrides};
use crate::record::RoundRecord;

/// The controller's memory between rounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ControllerState {
    /// The last round concluded (0 before the first).
    pub round: u64,
    /// The plan the last round decided.
    pub plan: SteeringPlan,
    /// The engine's memory.
    pub engine: EngineState,
    /// Every provider's reasons to be out.
    pub ledger: HealthLedger,
    /// What each provider still owes of missed purges.
    #[serde(default)]
    pub outstanding: BTreeMap<ProviderId, Outstanding>,
    /// The last round's record (repairs the journal after a crash between the two writes).
    #[serde(default)]
    pub last: Option<RoundRecord>,
    /// The operator's switches in force (static mode, pins).
    #[serde(default)]
    pub overrides: Overrides,
    /// Every operator switch used, oldest first (the last 10,000).
    #[serde(default)]
    pub operator: Vec<OperatorRecord>,
}

/// What a store held at start.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Saved {
    /// The state.
    pub state: ControllerState,
    /// The rounds the store keeps at hand, in order, without gaps or duplicates: every round
    /// for [`FileStore`] and [`MemoryStore`], the last `journal_window` for the shared store
    /// on NATS.
    pub journal: Vec<RoundRecord>,
}

/// A store could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The state file is not what this version writes.
    #[error("{path}: not a controller state: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        source: serde_json::Error,
    },
    /// Another store's failure, as text.
    #[error("{0}")]
    Other(String),
}

/// Where the controller keeps its state.
pub trait StateStore: fmt::Debug + Send + Sync {
    /// What was saved, or `None` for a first start.
    fn load(&self) -> Result<Option<Saved>, StoreError>;
    /// Saves the state after `round` (which is `state.last`'s round) and appends its record to
    /// the journal.
    fn save(&self, state: &ControllerState) -> Result<(), StoreError>;
}

/// Keeps the dedup rule in one place: rounds in order from `first`, each once, then the
/// state's last round.
pub(crate) fn reconcile(
    state: &ControllerState,
    lines: Vec<RoundRecord>,
    first: u64,
) -> (Vec<RoundRecord>, bool) {
    let mut journal: Vec<RoundRecord> = Vec::with_capacity(lines.len());
    for r in lines {
        let next = journal.last().map_or(first, |l| l.round + 1);
        if r.round == next {
            journal.push(r);
        }
    }
    let mut repaired = false;
    if let Some(last) = &state.last {
        let have = journal.last().map_or(first.saturating_sub(1), |l| l.round);
        if last.round == have + 1 {
            journal.push(last.clone());
            repaired = true;
        }
    }
    (journal, repaired)
}

/// The state in memory; clones share it (a "restart" in a test is a new controller on a clone).
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Option<Saved>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }
}

impl StateStore for MemoryStore {
    fn load(&self) -> Result<Option<Saved>, StoreError> {
        Ok(self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }

    fn save(&self, state: &ControllerState) -> Result<(), StoreError> {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut journal = guard.take().map(|s| s.journal).unwrap_or_default();
        if let Some(last) = &state.last
            && journal.last().is_none_or(|l| l.round < last.round)
        {
            journal.push(last.clone());
        }
        *guard = Some(Saved {
            state: state.clone(),
            journal,
        });
        Ok(())
    }
}

/// The state on local disk, in one directory: `state.json` (atomic) and `journal.ndjson`.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// A store in `dir` (created on the first save).
    pub fn new(dir: impl Into<PathBuf>) -> FileStore {
        FileStore { dir: dir.into() }
    }

    /// The state file.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    /// The journal file.
    pub fn journal_path(&self) -> PathBuf {
        self.dir.join("journal.ndjson")
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
        move |source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    fn write_state(&self, state: &ControllerState) -> Result<(), StoreError> {
        let path = self.state_path();
        let tmp = self.dir.join("state.json.tmp");
        let bytes = serde_json::to_vec(state).map_err(|source| StoreError::Corrupt {
            path: path.clone(),
            source,
        })?;
        let mut f = File::create(&tmp).map_err(Self::io(&tmp))?;
        f.write_all(&bytes).map_err(Self::io(&tmp))?;
        f.sync_all().map_err(Self::io(&tmp))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(Self::io(&path))?;
        // The rename itself reaches the disk with the directory.
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn append(&self, records: &[RoundRecord]) -> Result<(), StoreError> {
        let path = self.journal_path();
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(Self::io(&path))?;
        let mut buf = Vec::new();
        for r in records {
            serde_json::to_writer(&mut buf, r).map_err(|source| StoreError::Corrupt {
                path: path.clone(),
                source,
            })?;
            buf.push(b'\n');
        }
        f.write_all(&buf).map_err(Self::io(&path))?;
        f.sync_data().map_err(Self::io(&path))
    }
}

impl StateStore for FileStore {
    fn load(&self) -> Result<Option<Saved>, StoreError> {
        let path = self.state_path();
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Self::io(&path)(e)),
        };
        let state: ControllerState =
            serde_json::from_slice(&text).map_err(|source| StoreError::Corrupt {
                path: path.clone(),
                source,
            })?;
        let jpath = self.journal_path();
        let mut lines = Vec::new();
        match File::open(&jpath) {
            Ok(f) => {
                for line in BufReader::new(f).split(b'\n') {
                    let line = line.map_err(Self::io(&jpath))?;
                    // A torn last line (a crash mid-append) is not a round; the state's copy
                    // of the last round stands in for it.
                    if let Ok(r) = serde_json::from_slice::<RoundRecord>(&line) {
                        lines.push(r);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Self::io(&jpath)(e)),
        }
        let (journal, repaired) = reconcile(&state, lines, 1);
        if repaired {
            // Rewrite the journal whole: a torn line must not sit between two rounds.
            let tmp = self.dir.join("journal.ndjson.tmp");
            let mut buf = Vec::new();
            for r in &journal {
                if serde_json::to_writer(&mut buf, r).is_ok() {
                    buf.push(b'\n');
                }
            }
            let mut f = File::create(&tmp).map_err(Self::io(&tmp))?;
            f.write_all(&buf).map_err(Self::io(&tmp))?;
            f.sync_all().map_err(Self::io(&tmp))?;
            fs::rename(&tmp, &jpath).map_err(Self::io(&jpath))?;
        }
        Ok(Some(Saved { state, journal }))
    }

    fn save(&self, state: &ControllerState) -> Result<(), StoreError> {
        fs::create_dir_all(&self.dir).map_err(Self::io(&self.dir))?;
        self.write_state(state)?;
        if let Some(last) = &state.last {
            self.append(std::slice::from_ref(last))?;
        }
        Ok(())
    }
}
