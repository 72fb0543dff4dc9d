//! The system under test, as a drill drives it, behind one small interface: start, ingest,
//! an account of what it holds (if it gives one), kill / stop / pause / resume / restart with
//! the same data directory, stop.
//!
//! Two kinds: [`System::Builtin`], drill's own engine as a child process, and (see
//! `command`) an engine nobody here wrote, started from the user's argv. The runner only ever
//! talks to a [`System`]; a new kind is one file and one arm here. This module never judges:
//! it reports what the system said, and says when it cannot know.

pub mod builtin;
pub mod command;
pub mod ingest;
pub mod remote;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use builtin::EngineProcess;
pub use command::CommandEngine;
pub use ingest::Ingest;
pub use remote::RemoteEngine;

use crate::engine::{AttemptCountsView, Stats};
use crate::scenario::{IngestSpec, StatsSpec};

/// What a system says it holds. The built-in engine gives every field; a user's engine gives
/// what its stats endpoint has (`waiting` at least), or nothing at all.
#[derive(Debug, Clone, Default, serde::Serialize, PartialEq, Eq)]
pub struct Account {
    pub held: Option<u64>,
    pub delivered: Option<u64>,
    pub waiting: u64,
    pub failed: u64,
    /// Sent and not answered yet (the built-in engine); 0 when unknown.
    pub in_flight: u64,
    /// Attempts by outcome, when the system reports them.
    pub attempts: Option<AttemptCountsView>,
    /// Failed journal writes the system reported (drill's engine: `/stats.errors`).
    pub errors: u64,
}

/// Where a system's account can be read, apart from the system itself: a sampler polls it
/// once a second without ever holding up the drill's timeline.
#[derive(Debug, Clone)]
pub enum AccountSource {
    /// The system gives no account.
    None,
    /// drill's engine: `GET /stats` in its own format.
    Builtin { url: String },
    /// A user's engine: `GET url`, numbers read by field name (dotted for nested fields).
    Command { url: String, fields: StatsSpec },
}

impl AccountSource {
    /// A user's engine's account: `GET url` read with `fields`, when it has both.
    pub fn stats(url: &Option<String>, fields: &Option<StatsSpec>) -> AccountSource {
        match (url, fields) {
            (Some(url), Some(fields)) => AccountSource::Command {
                url: url.clone(),
                fields: fields.clone(),
            },
            _ => AccountSource::None,
        }
    }

    /// The stats as the endpoint gives them (for what a scenario reads from them beyond the
    /// account: a checkpoint).
    pub async fn json(&self) -> Result<serde_json::Value, String> {
        let url = match self {
            AccountSource::None => return Err("the engine gives no stats".to_string()),
            AccountSource::Builtin { url } | AccountSource::Command { url, .. } => url,
        };
        let answer = reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("the engine's stats {url}: {e}"))?;
        answer
            .json()
            .await
            .map_err(|e| format!("the engine's stats {url}: not JSON: {e}"))
    }

    /// The data of the records the engine lists as failed now: drill's engine answers `GET
    /// /failed` beside its `/stats`; `None` for another engine, or no answer within 5 s.
    pub async fn failed_data(&self) -> Option<Vec<String>> {
        let AccountSource::Builtin { url } = self else {
            return None;
        };
        let url = format!("{}/failed", url.strip_suffix("/stats")?);
        let answer = reqwest::Client::new()
            .get(&url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .ok()?;
        let failed: Vec<crate::engine::output::FailedRecord> = answer.json().await.ok()?;
        Some(failed.into_iter().map(|f| f.data).collect())
    }

    /// The account now, or `None` when there is none or it did not answer within 2 s.
    pub async fn fetch(&self, http: &reqwest::Client) -> Option<Account> {
        let get = |url: &str| http.get(url).timeout(Duration::from_secs(2)).send();
        match self {
            AccountSource::None => None,
            AccountSource::Builtin { url } => get(url)
                .await
                .ok()?
                .json::<Stats>()
                .await
                .ok()
                .map(Account::from),
            AccountSource::Command { url, fields } => {
                let v: serde_json::Value = get(url).await.ok()?.json().await.ok()?;
                let number = |name: &str| -> Option<u64> {
                    name.split('.')
                        .try_fold(&v, |v, part| v.get(part))
                        .and_then(serde_json::Value::as_u64)
                };
                Some(Account {
                    held: fields.held.as_deref().and_then(number),
                    delivered: fields.delivered.as_deref().and_then(number),
                    waiting: number(&fields.waiting)?,
                    failed: number(&fields.failed).unwrap_or(0),
                    in_flight: 0,
                    attempts: None,
                    errors: 0,
                })
            }
        }
    }
}

impl From<Stats> for Account {
    fn from(s: Stats) -> Account {
        Account {
            held: Some(s.held),
            delivered: Some(s.delivered),
            waiting: s.waiting,
            failed: s.failed,
            in_flight: s.outputs.iter().map(|o| o.in_flight).sum(),
            attempts: Some(s.attempts),
            errors: s.errors,
        }
    }
}

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
    #[error("{0}")]
    Exited(String),
    /// Bad input only found at start (an agent that refuses the token): exit 2.
    #[error("{0}")]
    Refused(String),
}

/// How many of a log's last lines an error or a verdict quotes.
const TAIL_LINES: usize = 5;

/// The last [`TAIL_LINES`] lines of the log at `path` that say something, joined with ` | `
/// for one line, and the log's path. Only the log's last 64 KiB are read (an engine's log may
/// be long).
pub fn log_tail(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut text = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let _ = f.read_to_end(&mut text);
    }
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .rev()
        .take(TAIL_LINES)
        .collect();
    if lines.is_empty() {
        return format!("(no output; log {})", path.display());
    }
    format!(
        "{} (log {})",
        lines.into_iter().rev().collect::<Vec<_>>().join(" | "),
        path.display()
    )
}

/// The system a drill drives.
pub enum System {
    /// drill's reference engine (`drill engine --config`), with its full account and attempt
    /// journal.
    Builtin(Box<EngineProcess>),
    /// A user's engine started from the scenario's argv; drill sees no attempts, and an
    /// account only if it has a stats endpoint.
    Command(Box<CommandEngine>),
    /// A user's engine run by a `drill agent` on another host (`system.agent`).
    Remote(Box<RemoteEngine>),
}

impl System {
    /// One line for the console: what runs and where its API is.
    pub fn describe(&self) -> String {
        match self {
            System::Builtin(e) => format!("built-in, pid-managed, api http://{}", e.addr()),
            System::Command(e) => e.describe(),
            System::Remote(e) => e.describe(),
        }
    }

    /// Where the workload posts records.
    pub fn ingest_addr(&self) -> SocketAddr {
        match self {
            System::Builtin(e) => e.addr(),
            System::Command(e) => e.ingest_addr(),
            System::Remote(e) => e.ingest_addr(),
        }
    }

    pub fn data_dir(&self) -> &Path {
        match self {
            System::Builtin(e) => e.data_dir(),
            System::Command(e) => e.data_dir(),
            System::Remote(e) => e.data_dir(),
        }
    }

    pub fn is_running(&self) -> bool {
        match self {
            System::Builtin(e) => e.is_running(),
            System::Command(e) => e.is_running(),
            System::Remote(e) => e.is_running(),
        }
    }

    /// The engine's wall clock, when a clock fault moves it (an engine on drill's host only).
    pub fn clock(&self) -> Option<&crate::clock::FakeClock> {
        match self {
            System::Builtin(e) => e.clock(),
            System::Command(e) => e.clock(),
            System::Remote(_) => None,
        }
    }

    /// (Re)starts it with the same configuration and data directory, and waits until ready.
    pub async fn start(&mut self) -> Result<(), SutError> {
        match self {
            System::Builtin(e) => e.spawn().await,
            System::Command(e) => e.spawn().await,
            System::Remote(e) => e.spawn().await,
        }
    }

    /// SIGKILL: no chance to flush anything.
    pub async fn kill(&mut self) {
        match self {
            System::Builtin(e) => e.kill().await,
            System::Command(e) => e.kill().await,
            System::Remote(e) => e.kill().await,
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        match self {
            System::Builtin(e) => e.stop(grace).await,
            System::Command(e) => e.stop(grace.max(e.stop_grace())).await,
            System::Remote(e) => e.stop(grace.max(e.stop_grace())).await,
        }
    }

    /// What the system says it holds, if it says.
    pub async fn account(&self) -> Option<Account> {
        match self {
            System::Builtin(e) => e.stats().await.ok().map(Account::from),
            System::Command(e) => e.account().await,
            System::Remote(e) => e.account().await,
        }
    }

    /// Where its account is read, for the once-a-second sampler.
    pub fn account_source(&self) -> AccountSource {
        match self {
            System::Builtin(e) => AccountSource::Builtin {
                url: format!("http://{}/stats", e.addr()),
            },
            System::Command(e) => e.account_source(),
            System::Remote(e) => e.account_source(),
        }
    }

    /// Whether the system gives an account at all (a user's engine without `stats` does not).
    pub fn gives_account(&self) -> bool {
        match self {
            System::Builtin(_) => true,
            System::Command(e) => e.gives_account(),
            System::Remote(e) => e.gives_account(),
        }
    }

    /// The last lines of the engine's log on this host, joined for one line (`None`: an engine
    /// on another host, whose log its agent keeps).
    pub fn log_tail(&self) -> Option<String> {
        match self {
            System::Builtin(e) => Some(log_tail(e.log_path())),
            System::Command(e) => Some(e.tail()),
            System::Remote(_) => None,
        }
    }

    /// Whether drill can see the system's attempts (only the built-in engine's journal).
    pub fn sees_attempts(&self) -> bool {
        matches!(self, System::Builtin(_))
    }

    /// The built-in engine's attempt journal, over all its runs in the drill; `None` when the
    /// system keeps no journal drill can read.
    pub fn journal(&self) -> Option<Journal> {
        match self {
            System::Builtin(e) => Some(read_journal(&e.data_dir().join("attempts.jsonl"))),
            System::Command(_) | System::Remote(_) => None,
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`), to the whole process group of a user's engine.
    pub async fn pause(&self, paused: bool) -> Result<(), SutError> {
        match self {
            System::Builtin(_) => Err(SutError::Start(
                "pausing the built-in engine is not supported; use kill or stop".to_string(),
            )),
            System::Command(e) => {
                e.pause(paused);
                Ok(())
            }
            System::Remote(e) => e.pause(paused).await,
        }
    }

    /// A disk fault carried out on the agent's host, for an engine there: `None` for an engine
    /// on this host (drill's own power-cut filesystem acts on it).
    pub async fn remote_disk(
        &self,
        act: remote::EngineAct,
    ) -> Option<Result<Option<crate::powerfs::CutReport>, SutError>> {
        match self {
            System::Remote(e) => Some(e.disk(act).await),
            _ => None,
        }
    }

    /// Ends a system that runs elsewhere and gives its host back, its log copied here;
    /// nothing for one on this host (stopping it is enough).
    pub async fn release(&mut self) {
        if let System::Remote(e) = self {
            e.release().await;
        }
    }

    /// Which processes are the engine now, for reading where it is in a file source (`None`
    /// parts: not running, or on another host).
    pub fn procs(&self) -> crate::source::EngineProcs {
        match self {
            System::Builtin(e) => crate::source::EngineProcs {
                pid: e.pid(),
                group: None,
            },
            System::Command(e) => crate::source::EngineProcs {
                pid: e.group(),
                group: e.group(),
            },
            System::Remote(_) => crate::source::EngineProcs::default(),
        }
    }

    /// `Some(why)` when the system ended on its own (checked during the drill).
    pub fn exited(&mut self) -> Option<String> {
        match self {
            System::Builtin(_) => None,
            System::Command(e) => e.exited(),
            System::Remote(e) => e.exited(),
        }
    }

    /// How the workload reaches this system.
    pub fn ingest(&self, spec: Option<&IngestSpec>, run: &str) -> Result<Ingest, String> {
        let builtin = IngestSpec::Http {
            path: "/ingest".to_string(),
            batch: usize::MAX,
        };
        Ingest::new(spec.unwrap_or(&builtin), self.ingest_addr(), run)
    }

    /// Appends drill's own note to the system's log.
    pub async fn note(&self, line: &str) {
        match self {
            System::Builtin(e) => e.note(line).await,
            System::Command(e) => e.note(line),
            System::Remote(e) => e.note(line).await,
        }
    }
}

/// What the built-in engine's attempt journal says, over every run of the engine in the drill:
/// its `/stats` counts start again at each restart, the journal (in the data directory) does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Journal {
    /// Write keys that had an attempt end `possibly_sent`.
    pub possibly_sent_keys: HashSet<String>,
    /// Write keys whose attempt ended `sent_unconfirmed`: the OS took them, nothing more is
    /// known (a destination that cannot confirm).
    pub sent_unconfirmed_keys: HashSet<String>,
    /// Every attempt the journal closed, by outcome.
    pub attempts: AttemptCountsView,
}

/// Reads the attempt journal at `path` (an unreadable or absent one reads as empty; a line
/// that is not an attempt, e.g. torn by a kill, is passed over).
fn read_journal(path: &Path) -> Journal {
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        #[serde(borrow, default)]
        key: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        outcome: Option<std::borrow::Cow<'a, str>>,
    }
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut journal = Journal::default();
    for line in text.lines() {
        let Ok(Line { key, outcome }) = serde_json::from_str::<Line>(line) else {
            continue;
        };
        let a = &mut journal.attempts;
        match outcome.as_deref() {
            Some("delivered") => a.delivered += 1,
            Some("refused") => a.refused += 1,
            Some("sent_unconfirmed") => {
                a.sent_unconfirmed += 1;
                if let Some(key) = key {
                    journal.sent_unconfirmed_keys.insert(key.into_owned());
                }
            }
            Some("possibly_sent") => {
                a.possibly_sent += 1;
                if let Some(key) = key {
                    journal.possibly_sent_keys.insert(key.into_owned());
                }
            }
            _ => {}
        }
    }
    journal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_counts_every_run_of_the_engine_and_passes_over_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attempts.jsonl");
        let line = |key: &str, outcome: &str| {
            format!(
                "{{\"output\":\"m\",\"key\":\"{key}\",\"seq\":0,\"attempt\":1,\"opened_ms\":1,\"closed_ms\":2,\"outcome\":\"{outcome}\"}}\n"
            )
        };
        // A first run, killed mid-line; the restarted run appends to the same journal.
        let text = [
            line("k-0", "possibly_sent"),
            line("k-1", "refused"),
            "{\"output\":\"m\",\"key\":\"k-2\",\"outc".to_string() + "\n",
            line("k-0", "delivered"),
            line("k-1", "delivered"),
            line("k-3", "sent_unconfirmed"),
        ]
        .concat();
        std::fs::write(&path, text).unwrap();
        let j = read_journal(&path);
        assert_eq!(
            j.attempts,
            AttemptCountsView {
                delivered: 2,
                refused: 1,
                possibly_sent: 1,
                sent_unconfirmed: 1,
            }
        );
        assert_eq!(j.possibly_sent_keys, HashSet::from(["k-0".to_string()]));
        assert_eq!(j.sent_unconfirmed_keys, HashSet::from(["k-3".to_string()]));
        assert_eq!(read_journal(&dir.path().join("none")), Journal::default());
    }
}
