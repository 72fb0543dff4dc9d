//! The system under test, as a drill drives it, behind one small interface: start, ingest,
//! an account of what it holds (if it gives one), kill / stop / pause / resume / restart with
//! the same data directory, stop.
//!
//! Two kinds: [`System::Builtin`], drill's own engine as a child process, and (see
//! `command`) an engine nobody here wrote, started from the user's argv. The runner only ever
//! talks to a [`System`]; a new kind is one file and one arm here. This module never judges:
//! it reports what the system said, and says when it cannot know.

pub mod builtin;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use builtin::EngineProcess;

use crate::engine::Stats;

#[derive(Debug, thiserror::Error)]
pub enum SutError {
    #[error("the engine did not start: {0}")]
    Start(String),
    #[error("cannot write the engine config {path}: {source}")]
    Config {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("engine stats: {0}")]
    Stats(String),
}

/// The system a drill drives.
pub enum System {
    /// drill's reference engine (`drill engine --config`), with its full account and attempt
    /// journal.
    Builtin(EngineProcess),
}

impl System {
    /// One line for the console: what runs and where its API is.
    pub fn describe(&self) -> String {
        match self {
            System::Builtin(e) => format!("built-in, pid-managed, api http://{}", e.addr()),
        }
    }

    /// Where the workload posts records.
    pub fn ingest_addr(&self) -> SocketAddr {
        match self {
            System::Builtin(e) => e.addr(),
        }
    }

    pub fn data_dir(&self) -> &Path {
        match self {
            System::Builtin(e) => e.data_dir(),
        }
    }

    pub fn is_running(&self) -> bool {
        match self {
            System::Builtin(e) => e.is_running(),
        }
    }

    /// (Re)starts it with the same configuration and data directory, and waits until ready.
    pub async fn start(&mut self) -> Result<(), SutError> {
        match self {
            System::Builtin(e) => e.spawn().await,
        }
    }

    /// SIGKILL: no chance to flush anything.
    pub async fn kill(&mut self) {
        match self {
            System::Builtin(e) => e.kill().await,
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        match self {
            System::Builtin(e) => e.stop(grace).await,
        }
    }

    /// What the system says it holds, if it says.
    pub async fn stats(&self) -> Option<Stats> {
        match self {
            System::Builtin(e) => e.stats().await.ok(),
        }
    }

    /// Write keys that had an attempt end `possibly_sent` (the built-in engine's journal).
    pub fn possibly_sent_keys(&self) -> HashSet<String> {
        match self {
            System::Builtin(e) => possibly_sent_keys(&e.data_dir().join("attempts.jsonl")),
        }
    }

    /// Appends drill's own note to the system's log.
    pub async fn note(&self, line: &str) {
        match self {
            System::Builtin(e) => e.note(line).await,
        }
    }
}

/// Write keys that had an attempt end `possibly_sent` (from the engine's attempt journal).
fn possibly_sent_keys(path: &Path) -> HashSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("outcome").and_then(|o| o.as_str()) == Some("possibly_sent"))
        .filter_map(|v| v.get("key").and_then(|k| k.as_str()).map(str::to_string))
        .collect()
}
