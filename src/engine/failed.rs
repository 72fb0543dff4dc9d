//! Failed messages: records an output set aside after their last counted refusal, kept with
//! the destination's own error text and replayable with the same write key.
//!
//! One append-only file per output, `failed-<output>.jsonl`, holds three events in order: a
//! [`FailedRecord`] when a record is set aside, `{"replayed": SEQ}` when it is put back on its
//! output's queue, and `{"delivered": SEQ}` when a replayed record was confirmed. What each
//! record is *now* is the fold of those lines ([`State`]), so a record that fails again after a
//! replay is simply failed again. Every line is synced before it counts: a failed message is
//! the only copy of a record the output will not retry by itself, and once the record log has
//! deleted its segment (failed records count as settled), this file is where a replayed record
//! lives until its delivery.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::output::FailedRecord;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Replayed {
    replayed: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveredAfterReplay {
    delivered: u64,
}

/// Where a record that once failed stands now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Failed(FailedRecord),
    /// Back on its output's queue, not confirmed yet.
    Replayed(FailedRecord),
    Delivered,
}

/// The failed messages of one output.
pub struct FailedStore {
    path: PathBuf,
    file: File,
}

fn path(dir: &Path, output: &str) -> PathBuf {
    dir.join(format!("failed-{output}.jsonl"))
}

impl FailedStore {
    pub fn open(dir: &Path, output: &str) -> std::io::Result<FailedStore> {
        let path = path(dir, output);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(FailedStore { path, file })
    }

    /// Every record that ever failed, and where it stands now (read from disk).
    pub fn states(dir: &Path, output: &str) -> BTreeMap<u64, State> {
        let mut now = BTreeMap::new();
        let text = std::fs::read_to_string(path(dir, output)).unwrap_or_default();
        for line in text.lines() {
            if let Ok(r) = serde_json::from_str::<Replayed>(line) {
                if let Some(State::Failed(f)) = now.remove(&r.replayed) {
                    now.insert(r.replayed, State::Replayed(f));
                }
            } else if let Ok(d) = serde_json::from_str::<DeliveredAfterReplay>(line) {
                now.insert(d.delivered, State::Delivered);
            } else if let Ok(f) = serde_json::from_str::<FailedRecord>(line) {
                now.insert(f.seq, State::Failed(f));
            }
        }
        now
    }

    /// The records failed now, by sequence (read from disk; usable while the engine runs).
    pub fn current(dir: &Path, output: &str) -> BTreeMap<u64, FailedRecord> {
        Self::states(dir, output)
            .into_iter()
            .filter_map(|(seq, s)| match s {
                State::Failed(f) => Some((seq, f)),
                _ => None,
            })
            .collect()
    }

    fn append(&mut self, line: String) -> std::io::Result<()> {
        writeln!(self.file, "{line}")?;
        self.file.sync_data()
    }

    /// Sets a record aside (synced before it returns).
    pub fn add(&mut self, failed: &FailedRecord) -> std::io::Result<()> {
        self.append(serde_json::to_string(failed).map_err(std::io::Error::other)?)
    }

    /// Marks records as put back on their output's queue (synced before it returns).
    pub fn replayed(&mut self, seqs: &[u64]) -> std::io::Result<()> {
        for &seq in seqs {
            self.append(
                serde_json::to_string(&Replayed { replayed: seq })
                    .map_err(std::io::Error::other)?,
            )?;
        }
        Ok(())
    }

    /// A replayed record was confirmed (synced before it returns).
    pub fn delivered(&mut self, seq: u64) -> std::io::Result<()> {
        self.append(
            serde_json::to_string(&DeliveredAfterReplay { delivered: seq })
                .map_err(std::io::Error::other)?,
        )
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(seq: u64) -> FailedRecord {
        FailedRecord {
            output: "o".into(),
            key: format!("k-{seq}"),
            seq,
            data: "{}".into(),
            error: "PUBACK 0x95 packet too large".into(),
            refusals: 10,
            first_attempt_ms: 1,
            last_attempt_ms: 2,
        }
    }

    #[test]
    fn failed_replayed_and_failed_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = FailedStore::open(dir.path(), "o").unwrap();
        store.add(&failed(3)).unwrap();
        store.add(&failed(7)).unwrap();
        store.replayed(&[3]).unwrap();
        assert_eq!(
            FailedStore::current(dir.path(), "o")
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![7]
        );
        store.add(&failed(3)).unwrap();
        let now = FailedStore::current(dir.path(), "o");
        assert_eq!(now.len(), 2);
        assert_eq!(now[&3].error, "PUBACK 0x95 packet too large");
        store.replayed(&[3, 7]).unwrap();
        store.delivered(7).unwrap();
        let states = FailedStore::states(dir.path(), "o");
        assert_eq!(states[&3], State::Replayed(failed(3)));
        assert_eq!(states[&7], State::Delivered);
    }
}
