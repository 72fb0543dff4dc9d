//! Scenario files: YAML in, a validated [`Plan`] out.
//!
//! This module owns the scenario language (docs/src/design.md#4-scenario-file) and the [`Plan`] it
//! becomes: the contract the runner reads. Parsing is two steps, as in ripgrep: raw YAML is
//! deserialized with `serde-saphyr` into the `Raw*` types of `raw.rs`, which reject unknown
//! fields, and then `validate.rs` turns them into a [`Plan`] whose values can be trusted — one
//! function per section, each the owner of its section's fields (`command.rs` for a user's
//! engine). `Dur` and `Rate`, the units a scenario writes, are in `units.rs`. Every error names
//! the file, line, column and field, and says what to write instead. Nothing is started on an
//! invalid plan: the runner only ever sees a `Plan`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::dest;
use crate::promise::{Order, Promise};
use crate::proxy::FaultSpec;
use crate::workload::WorkloadSpec;

pub mod command;
mod links;
mod raw;
pub mod source;
mod validate;

pub use command::{CommandSpec, IngestSpec, Ready, StatsSpec};
pub use links::RemoteSpec;

/// Why a scenario could not be turned into a plan. Both variants mean "invalid input" (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("{path}: cannot read the scenario: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: String,
        line: u32,
        column: u32,
        message: String,
    },
}

/// A process fault (docs/src/design.md#3-fault-vocabulary): `kill` and `stop` for the engine,
/// `restart` for the proxy.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ProcessAction {
    /// SIGKILL, then (with `restart_after`) start again on the same data directory.
    Kill,
    /// SIGTERM, then (with `restart_after`) start again.
    Stop,
    /// A broker: crashed in its own way (PostgreSQL: immediate shutdown, as `pg_ctl stop -m
    /// immediate` — no checkpoint, crash recovery at the next start; elsewhere SIGKILL), then
    /// (with `restart_after`) started again on the same data.
    Crash,
    /// The proxy: every connection dropped, the port refused for `down_for`, then listening
    /// again on the same port.
    Restart,
    /// A broker in a container: frozen (SIGSTOP-like, `docker pause`), then resumed after
    /// `restart_after`.
    Pause,
    /// The engine: SIGKILL, and every write to its data directory not yet made durable by
    /// fsync/fdatasync is thrown away (its data directory is mounted through drill's
    /// power-cut filesystem); started again after `restart_after`.
    PowerCut,
    /// The engine's data directory: the disk is full (no space reported, writes that grow a
    /// file fail with ENOSPC) for `for`, then space returns.
    FillDisk,
    /// The source file (`target: source`): rotated as its `rotate:` says (rename by default).
    Rotate,
    /// The source file: cut to zero length.
    Truncate,
    /// The source file: deleted, and a new one created under its name.
    Delete,
    /// The source file: the next line written in two `write()` calls, `for` apart.
    Stall,
}

impl ProcessAction {
    pub fn name(self) -> &'static str {
        match self {
            ProcessAction::Kill => "kill",
            ProcessAction::Stop => "stop",
            ProcessAction::Crash => "crash",
            ProcessAction::Restart => "restart",
            ProcessAction::Pause => "pause",
            ProcessAction::PowerCut => "power_cut",
            ProcessAction::FillDisk => "fill_disk",
            ProcessAction::Rotate => "rotate",
            ProcessAction::Truncate => "truncate",
            ProcessAction::Delete => "delete",
            ProcessAction::Stall => "stall",
        }
    }

    /// Needs the engine's data directory on drill's power-cut filesystem.
    pub fn needs_powerfs(self) -> bool {
        matches!(self, ProcessAction::PowerCut | ProcessAction::FillDisk)
    }
}

/// A validated drill: everything the runner needs, nothing it has to check again.
#[derive(Debug, Clone)]
pub struct Plan {
    pub name: String,
    pub about: Option<String>,
    pub source: PathBuf,
    /// The folder `{scenario_dir}` and templates are relative to: the file's own, or its
    /// `scenario_dir:`.
    pub dir: PathBuf,
    pub seed: u64,
    /// The validated `destination:` section, with the kind's own settings and rules.
    pub destination: dest::Spec,
    /// The built-in engine's settings, and the promise the system under test declares
    /// (`engine.promise`, whichever engine runs).
    pub engine: EngineSpec,
    /// A user's engine, when the scenario gives `system.command`; else the built-in one runs.
    pub command: Option<CommandSpec>,
    pub workload: WorkloadSpec,
    pub faults: Vec<ScheduledFault>,
    pub expect: Expectations,
    pub drain_timeout: Duration,
    pub tags: Vec<String>,
    /// Links served by a `drill proxy` on another host, by link name (`links:`).
    pub remote_links: std::collections::BTreeMap<String, RemoteSpec>,
    /// The `drill agent` whose host runs the user's engine (`system.agent`).
    pub agent: Option<RemoteSpec>,
}

/// Settings of the built-in engine under test.
#[derive(Debug, Clone)]
pub struct EngineSpec {
    pub order: Order,
    pub promise: Promise,
    pub keepalive: Duration,
    pub answer_timeout: Duration,
    /// Open attempts at once; `None`: the destination's default ([`dest::Destination::default_window`]).
    pub window: Option<usize>,
    /// (max counted refusals, first backoff, backoff cap).
    pub refusals: (u32, Duration, Duration),
    /// `segment:`: the record log's segment size in bytes; `None`: the engine's default.
    pub segment_bytes: Option<u64>,
    /// `system.ingest: { kind: file }` with the built-in engine: it tails the file instead of
    /// taking records over HTTP.
    pub tail: Option<source::FileSpec>,
    /// `system.ingest: { kind: kafka }` with the built-in engine: it consumes the source topic
    /// instead of taking records over HTTP.
    pub consume: Option<source::KafkaSourceSpec>,
    /// `system.ingest: { kind: postgres_outbox }` with the built-in engine: it polls the outbox
    /// table instead of taking records over HTTP.
    pub outbox: Option<source::OutboxSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledFault {
    pub at: Duration,
    pub what: FaultAction,
    /// Its entry's place in the scenario's `faults:` list: a flapping link fault (`repeat`)
    /// is one entry carried out several times, and is judged as one.
    pub entry: usize,
}

/// How a `power_cut` cuts: torn or clean, now or at a crash point armed now (its
/// `restart_after` then counts from the crash).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PowerCut {
    pub torn: bool,
    /// The directory changes the cut forgets (`dirents:`); none without a model.
    pub dirents: Option<crate::powerfs::Dirents>,
    pub crash_at: Option<crate::powerfs::CrashPoint>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    Link {
        link: String,
        spec: FaultSpec,
        /// `for:` — the link heals by itself this long after `at`.
        lasts: Option<Duration>,
    },
    ProxyRestart {
        down_for: Duration,
    },
    Heal {
        link: String,
    },
    Engine {
        action: ProcessAction,
        restart_after: Option<Duration>,
        wipe_data: bool,
        /// `fill_disk`'s `for`: space returns this long after `at`.
        lasts: Option<Duration>,
        /// `power_cut`: how the power goes.
        power: PowerCut,
    },
    Broker {
        node: dest::Node,
        action: ProcessAction,
        restart_after: Option<Duration>,
    },
    /// `target: source`: drill does this to the file the engine tails.
    Source(source::SourceAction),
    /// `target: engine, disk: io_error`: the engine's disk answers errors, for `lasts` (or to
    /// the end of the drill).
    Disk {
        fault: crate::powerfs::IoFault,
        lasts: Option<Duration>,
    },
    /// `target: engine, clock: jump`: the engine's wall clock steps by `by_s` seconds (signed)
    /// and stays there; `clock: drift` (`over` given): it gains `by_s` gradually over `over`.
    Clock {
        by_s: i64,
        over: Option<Duration>,
    },
    /// `target: destination`: a destination drill hosts answers otherwise for `lasts`.
    Answer {
        fault: dest::AnswerFault,
        lasts: Duration,
    },
}

impl Plan {
    /// How long the drill plays: its workload, or its last fault if that comes later.
    pub fn plays_for(&self) -> Duration {
        let last_fault = self.faults.iter().map(|f| f.at).max().unwrap_or_default();
        self.workload.duration.max(last_fault)
    }

    /// The topic drill produces the records into, when the engine consumes one.
    pub fn kafka_source(&self) -> Option<&source::KafkaSourceSpec> {
        match self.command.as_ref().map(|c| &c.ingest) {
            Some(IngestSpec::Kafka(k)) => Some(k),
            Some(_) => None,
            None => self.engine.consume.as_ref(),
        }
    }

    /// The outbox table drill inserts the records into, when the engine polls one.
    pub fn outbox_source(&self) -> Option<&source::OutboxSpec> {
        match self.command.as_ref().map(|c| &c.ingest) {
            Some(IngestSpec::PostgresOutbox(o)) => Some(o),
            Some(_) => None,
            None => self.engine.outbox.as_ref(),
        }
    }

    /// The file drill writes the records to, when the engine tails one.
    pub fn file_source(&self) -> Option<&source::FileSpec> {
        match self.command.as_ref().map(|c| &c.ingest) {
            Some(IngestSpec::File(f)) => Some(f),
            Some(_) => None,
            None => self.engine.tail.as_ref(),
        }
    }

    /// Whether the engine's data directory must be on drill's power-cut filesystem
    /// (a `power_cut` or `fill_disk` fault).
    pub fn needs_powerfs(&self) -> bool {
        self.faults.iter().any(|f| match &f.what {
            FaultAction::Engine { action, .. } => action.needs_powerfs(),
            FaultAction::Disk { .. } => true,
            _ => false,
        })
    }

    /// The strictest `dirents:` model of the drill's power cuts: the power-cut filesystem
    /// logs directory changes for it from the start (`posix` keeps them longest).
    pub fn dirents(&self) -> Option<crate::powerfs::Dirents> {
        use crate::powerfs::Dirents;
        let models = self.faults.iter().filter_map(|f| match &f.what {
            FaultAction::Engine { power, .. } => power.dirents,
            _ => None,
        });
        models.max_by_key(|m| match m {
            Dirents::Posix => 1,
            Dirents::Ext4 => 0,
        })
    }

    /// Whether the engine runs under a wall clock drill moves (a clock fault).
    pub fn needs_clock(&self) -> bool {
        self.faults
            .iter()
            .any(|f| matches!(f.what, FaultAction::Clock { .. }))
    }
}

/// The longest stretch any one fault keeps the destination out of reach: a link fault until it
/// heals (by `for`, by a later `heal`, or at the end of the drill), a proxy restart's
/// `down_for`, an engine's `restart_after`.
pub fn longest_outage(faults: &[ScheduledFault], drill_ends: Duration) -> Duration {
    faults
        .iter()
        .map(|f| match &f.what {
            FaultAction::Link { lasts: Some(d), .. } => *d,
            FaultAction::Link {
                link, lasts: None, ..
            } => {
                let heal = faults.iter().find(|h| {
                    h.at > f.at && matches!(&h.what, FaultAction::Heal { link: l } if l == link)
                });
                heal.map_or(drill_ends, |h| h.at).saturating_sub(f.at)
            }
            FaultAction::ProxyRestart { down_for } => *down_for,
            FaultAction::Answer { lasts, .. } => *lasts,
            FaultAction::Engine { restart_after, .. }
            | FaultAction::Broker { restart_after, .. } => restart_after.unwrap_or_default(),
            FaultAction::Heal { .. }
            | FaultAction::Source(_)
            | FaultAction::Disk { .. }
            | FaultAction::Clock { over: None, .. } => Duration::ZERO,
            FaultAction::Clock { over: Some(d), .. } => *d,
        })
        .max()
        .unwrap_or_default()
}

#[derive(Debug, Clone, Default)]
pub struct Expectations {
    /// At most this many lost (default 0; `None`: `lost: any`).
    pub lost: Option<u64>,
    /// At most this many held records still with the engine when the drain ends, never
    /// delivered (default 0; `None`: `undelivered: any`).
    pub undelivered: Option<u64>,
    /// At most this many writes that arrived while an attempt with their write key was open,
    /// where the destination can tell (default 0; `None`: `overlapping_attempts: any`).
    pub overlapping_attempts: Option<u64>,
    pub duplicates: Option<u64>,
    pub reordered: Option<u64>,
    pub ledger_closes: bool,
    pub recovery_within: Option<Duration>,
    /// Records set aside as failed: exactly this many (default: the number of poison records,
    /// the only writes drill's brokers refuse), so that an engine that quietly drops records
    /// and calls them failed does not pass.
    pub failed: Option<u64>,
    /// Copies at the destination the engine never accepted (default 0).
    pub unexpected: Option<u64>,
    /// Copies that arrived with other bytes than the source sent (default 0).
    pub altered: Option<u64>,
    /// Ingests whose answer was lost and that never reached the destination (no default).
    pub not_accepted: Option<u64>,
    /// How long the drain may take after the workload and the timeline.
    pub drain_within: Option<Duration>,
    /// The most copies of one record (a correct at-least-once engine makes at most 2 after
    /// one cut).
    pub max_copies: Option<u64>,
}

/// The JSON Schema of the scenario file, generated from the same types the parser reads.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(raw::RawScenario);
    let mut v = serde_json::to_value(&schema).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("title".to_string(), "drill scenario".into());
    }
    v
}

/// Reads and validates a scenario file.
pub fn load(path: &Path) -> Result<Plan, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(path, &text)
}

/// Validates scenario text; `path` is only used to name the file in errors.
pub fn parse(path: &Path, text: &str) -> Result<Plan, ScenarioError> {
    let shown = path.display().to_string();
    let invalid = |e: crate::located::Located| ScenarioError::Invalid {
        path: shown.clone(),
        line: e.at.line() as u32,
        column: e.at.column() as u32,
        message: e.message,
    };
    let raw: raw::RawScenario = crate::located::read(text).map_err(invalid)?;
    validate::validate(raw, text, path).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
name: t
destination: { kind: mqtt }
workload: { rate: 100/s, duration: 10s }
faults:
  - { at: 2s, link: mqtt, fault: swallow, for: 3s }
  - { at: 4s, target: engine, action: kill, restart_after: 1s }
";

    fn err(text: &str) -> String {
        parse(Path::new("s.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn a_good_scenario_becomes_a_plan() {
        let plan = parse(Path::new("s.yaml"), GOOD).unwrap();
        assert_eq!(plan.workload.total_records(), 1000);
        assert_eq!(plan.faults.len(), 2);
        assert!(plan.expect.ledger_closes);
    }

    #[test]
    fn unknown_field_names_file_line_column_and_field() {
        let text = GOOD.replace("fault: swallow", "fualt: swallow");
        let e = err(&text);
        assert!(e.starts_with("s.yaml:5:"), "{e}");
        assert!(e.contains("fualt"), "{e}");
    }

    #[test]
    fn bad_values_are_located() {
        let e = err(&GOOD.replace("100/s", "-100/s"));
        assert!(e.starts_with("s.yaml:3:"), "{e}");
        assert!(e.contains("greater than zero"), "{e}");
        let e = err(&GOOD.replace("10s", "10 seconds"));
        assert!(e.starts_with("s.yaml:3:"), "{e}");
        let e = err(&GOOD.replace("link: mqtt", "link: kafka"));
        assert!(e.starts_with("s.yaml:5:"), "{e}");
        assert!(e.contains("faults[0].link"), "{e}");
    }
}
