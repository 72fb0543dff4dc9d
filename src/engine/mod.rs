//! The reference store-and-forward engine (DESIGN.md §1), run as `drill engine --config FILE`.
//!
//! Data flows: `POST /ingest` (NDJSON) → the writer thread appends the batch to the record log
//! and syncs it (group commit) → only then the HTTP answer lists the write keys → the records go
//! to each output's worker, which forwards them and journals every attempt. `GET /stats` reports
//! held = delivered + waiting + failed from the engine's own state.
//!
//! This module owns the process shell: configuration, the writer thread, the journal of attempts
//! and delivery marks, and the HTTP API. The decisions live in [`output::Output`]; the bytes on
//! disk in [`log`]. The engine never acknowledges a record before it is on disk, never drops a
//! stored record, and never lets an outage expire or spend anything.

pub mod failed;
mod kafka;
pub mod log;
#[cfg(feature = "mutants")]
pub mod mutant;
mod nats;
pub mod output;

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::mqtt::{self, Packet};
use crate::scenario::{Dur, Order, Promise};
use failed::FailedStore;
use log::{DeliveryMarks, RecordLog, StoredRecord};
use output::{AttemptCounts, Effect, Output, RefusalPolicy};

#[cfg(feature = "mutants")]
use mutant::Mutant;

/// `engine.yaml`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Where the HTTP API (ingest, stats) listens.
    pub listen: SocketAddr,
    /// The durable buffer, attempt journal and failed messages.
    pub data_dir: PathBuf,
    pub outputs: Vec<OutputConfig>,
    /// When room runs low: warn, then refuse new ingest (DESIGN.md §1.10). Nothing stored is
    /// ever evicted.
    #[serde(default)]
    pub disk: DiskLimits,
}

/// Free-space thresholds on the data directory's filesystem, and the record log's segment
/// size, in bytes. Every field has a default.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiskLimits {
    /// Below this, `/stats` says `disk_low` and the engine logs a warning.
    pub warn_below_bytes: u64,
    /// Below this, ingest is refused with HTTP 507 (nothing stored, nothing acknowledged) until
    /// space returns.
    pub refuse_below_bytes: u64,
    /// A new segment of the record log starts once the active one is this long; a segment is
    /// deleted whole once every output is past it.
    pub segment_bytes: u64,
}

impl Default for DiskLimits {
    fn default() -> Self {
        DiskLimits {
            warn_below_bytes: 1 << 30,
            refuse_below_bytes: 64 << 20,
            segment_bytes: log::DEFAULT_SEGMENT_BYTES,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    pub name: String,
    pub kind: OutputKind,
    /// The destination (for a drill: the proxy link in front of the broker).
    pub address: SocketAddr,
    /// More servers of the same destination (the other nodes of a NATS cluster, each through
    /// its own link). The client tries them all; it never learns others from the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_addresses: Vec<SocketAddr>,
    pub topic: String,
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub promise: Promise,
    #[serde(default)]
    pub order: Order,
    /// How often a PINGREQ probes an idle connection.
    #[serde(default = "default_keepalive")]
    pub keepalive: DurText,
    /// How long an unanswered probe, connect or blocked write may last before the connection
    /// is declared lost (its open attempts end `possibly_sent`).
    #[serde(default = "default_answer_timeout")]
    pub answer_timeout: DurText,
    /// Open attempts at once.
    #[serde(default = "default_window")]
    pub window: usize,
    #[serde(default)]
    pub refusals: Option<RefusalConfig>,
}

impl OutputConfig {
    /// An MQTT output with every default (at_least_once, in_order, 2 s keepalive, 3 s answer
    /// timeout, 64 open attempts, 10 counted refusals backing off 1 s → 60 s).
    pub fn mqtt(name: &str, address: SocketAddr, topic: &str) -> OutputConfig {
        OutputConfig {
            name: name.to_string(),
            kind: OutputKind::Mqtt,
            address,
            more_addresses: Vec::new(),
            topic: topic.to_string(),
            client_id: None,
            promise: Promise::default(),
            order: Order::default(),
            keepalive: default_keepalive(),
            answer_timeout: default_answer_timeout(),
            window: default_window(),
            refusals: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// MQTT 5, QoS 1; `topic` is the topic. Keeps `at_least_once`.
    Mqtt,
    /// NATS JetStream; `topic` is the subject a stream captures. Keeps `effectively_once`
    /// within the stream's duplicate window (or `at_least_once`, if declared).
    Nats,
    /// Kafka (idempotent producer); `topic` is the topic. Keeps `at_least_once`.
    Kafka,
}

impl OutputKind {
    /// The strongest promise this kind of output can keep (DESIGN.md §1.7).
    pub fn strongest_promise(self) -> Promise {
        match self {
            OutputKind::Mqtt => Promise::AtLeastOnce,
            OutputKind::Nats => Promise::EffectivelyOnce,
            OutputKind::Kafka => Promise::AtLeastOnce,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalConfig {
    pub max: u32,
    /// `[first, cap]`, e.g. `[1s, 60s]`.
    pub backoff: [DurText; 2],
}

/// A duration as text in the config file (`2s`), parsed with the scenario's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurText(pub Duration);

impl Serialize for DurText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}ms", self.0.as_millis()))
    }
}

impl<'de> Deserialize<'de> for DurText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Dur::deserialize(d).map(|d| DurText(d.0))
    }
}

fn default_keepalive() -> DurText {
    DurText(Duration::from_secs(2))
}
fn default_answer_timeout() -> DurText {
    DurText(Duration::from_secs(3))
}
fn default_window() -> usize {
    64
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{path}: cannot read the engine config: {source}")]
    ReadConfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error(transparent)]
    Log(#[from] log::LogError),
    #[error("{0}")]
    Unprotected(String),
    #[error(
        "the writer thread panicked: acknowledged records are safe on disk, but nothing more can be stored; restart the engine"
    )]
    Writer,
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// `DRILL_MUTANT` names no mutant, or this binary has none (see [`refuse_unbuilt_mutant`]).
    #[error("{0}")]
    Mutant(String),
}

/// The variable that asks for a deliberately broken engine (test builds with the cargo feature
/// `mutants` only: `src/engine/mutant.rs`).
pub const MUTANT_ENV: &str = "DRILL_MUTANT";

/// A binary built without the `mutants` feature has no broken engine to offer: asked for one,
/// it refuses to start rather than run the correct engine under a name that says otherwise.
#[cfg(not(feature = "mutants"))]
fn refuse_unbuilt_mutant() -> Result<(), EngineError> {
    match std::env::var_os(MUTANT_ENV) {
        None => Ok(()),
        Some(name) => Err(EngineError::Mutant(format!(
            "{MUTANT_ENV}={:?} is set, but this drill binary was built without the `mutants` feature (deliberately broken engines exist only in test builds); unset it",
            name.to_string_lossy()
        ))),
    }
}

impl EngineConfig {
    pub fn load(path: &Path) -> Result<EngineConfig, EngineError> {
        let text = std::fs::read_to_string(path).map_err(|source| EngineError::ReadConfig {
            path: path.to_path_buf(),
            source,
        })?;
        let config: EngineConfig = serde_saphyr::from_str(&text).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!("{}:{}: ", l.line(), l.column()))
                .unwrap_or_default();
            EngineError::Config {
                path: path.to_path_buf(),
                message: format!("{at}{}", e.to_string().lines().next().unwrap_or("invalid")),
            }
        })?;
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<(), EngineError> {
        let err = |message: String| EngineError::Config {
            path: path.to_path_buf(),
            message,
        };
        if self.outputs.is_empty() {
            return Err(err(
                "`outputs` is empty: give at least one destination".to_string()
            ));
        }
        let mut names = HashSet::new();
        for o in &self.outputs {
            if !names.insert(o.name.as_str()) {
                return Err(err(format!(
                    "output name `{}` is used twice; each output needs its own name (it names its files)",
                    o.name
                )));
            }
            // DESIGN.md §1.7: claiming more than an output can keep is a configuration error.
            let can = o.kind.strongest_promise();
            if o.promise.rank() > can.rank() {
                let why = match o.kind {
                    OutputKind::Mqtt => {
                        "an MQTT 5 QoS 1 output keeps `at_least_once` (a lost PUBACK means a resend)"
                    }
                    OutputKind::Nats => {
                        "a JetStream output keeps `effectively_once` only within the stream's duplicate window"
                    }
                    OutputKind::Kafka => {
                        "a Kafka output keeps `at_least_once` (a new producer session after a crash may add a copy)"
                    }
                };
                return Err(err(format!(
                    "output `{}` declares `{}`, but {why}; declare {} or less",
                    o.name,
                    o.promise.name(),
                    can.name()
                )));
            }
            if o.promise == Promise::AtMostOnce {
                return Err(err(format!(
                    "output `{}` declares `at_most_once`, which this engine does not offer: it never drops a record it could resend; declare {}",
                    o.name,
                    can.name()
                )));
            }
            if o.name.is_empty()
                || !o
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(err(format!(
                    "output name `{}`: use letters, digits, `-` or `_`",
                    o.name
                )));
            }
        }
        Ok(())
    }
}

/// What one output reports in `/stats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OutputStats {
    pub name: String,
    pub connected: bool,
    pub delivered: u64,
    pub waiting: u64,
    pub failed: u64,
    pub in_flight: u64,
    pub attempts: AttemptCountsView,
}

/// Attempts by outcome (DESIGN.md §6).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AttemptCountsView {
    pub delivered: u64,
    pub refused: u64,
    pub possibly_sent: u64,
    pub sent_unconfirmed: u64,
}

impl From<AttemptCounts> for AttemptCountsView {
    fn from(a: AttemptCounts) -> Self {
        AttemptCountsView {
            delivered: a.delivered,
            refused: a.refused,
            possibly_sent: a.possibly_sent,
            sent_unconfirmed: a.sent_unconfirmed,
        }
    }
}

/// `GET /stats` (DESIGN.md §6).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    pub held: u64,
    pub delivered: u64,
    pub waiting: u64,
    pub failed: u64,
    pub attempts: AttemptCountsView,
    pub disk_free_bytes: u64,
    /// Free space is below `disk.warn_below_bytes`.
    #[serde(default)]
    pub disk_low: bool,
    /// Acknowledged records found unreadable (damaged on disk) when the log was opened; not
    /// part of `held`. Always 0 unless the disk corrupted data.
    #[serde(default)]
    pub damaged: u64,
    /// Segments of the record log on disk.
    #[serde(default)]
    pub segments: u64,
    /// Failed writes of the attempt journal, delivery marks or failed store since the start
    /// (each also said on stderr). A drill's report names them.
    #[serde(default)]
    pub errors: u64,
    pub outputs: Vec<OutputStats>,
}

struct Shared {
    held: Arc<AtomicU64>,
    /// Writes that failed on a path that decides durability or a verdict (attempt journal,
    /// delivery marks, failed store): each is said on stderr and counted in `/stats.errors`.
    errors: Arc<AtomicU64>,
    damaged: u64,
    /// The log's oldest sequence and segment count, published by the writer.
    log_state: Arc<LogState>,
    data_dir: PathBuf,
    disk: DiskLimits,
    /// Whether the low-disk warning was last said (so it is said once per crossing).
    disk_warned: std::sync::atomic::AtomicBool,
    outputs: Mutex<Vec<OutputStats>>,
    ingest: mpsc::Sender<WriterJob>,
    /// Each output's worker, for replays.
    to_outputs: Mutex<Vec<mpsc::UnboundedSender<ToOutput>>>,
}

/// What the writer thread and the outputs share about the log.
struct LogState {
    first_seq: AtomicU64,
    segments: AtomicU64,
    /// Per output: everything below this sequence is settled (see [`Output::settled_below`]).
    settled: Vec<AtomicU64>,
}

/// Work for the writer thread.
enum WriterJob {
    Ingest(IngestJob),
    /// Delete segments every output is past.
    Release,
}

struct IngestJob {
    lines: Vec<String>,
    reply: oneshot::Sender<Result<Vec<String>, String>>,
}

/// The append-only journals of one output: attempts, delivery marks, failed messages.
struct Journal {
    attempts: BufWriter<File>,
    failed: FailedStore,
    marks: DeliveryMarks,
    /// Confirmed since the last [`Journal::write_marks`]: (segment, seq).
    pending_marks: Vec<(u64, u64)>,
    /// Replayed failed records not confirmed yet: their confirmation goes to the failed store
    /// (their segment may be gone).
    replayed: HashSet<u64>,
    /// Failed journal writes, shared with `/stats` (see [`Shared::errors`]).
    errors: Arc<AtomicU64>,
}

/// What an output's journals say at start.
struct JournalStart {
    delivered: HashSet<u64>,
    states: std::collections::BTreeMap<u64, failed::State>,
}

/// What reaches an output's worker: new records, or a request to replay failed ones.
pub enum ToOutput {
    Records(Vec<Arc<StoredRecord>>),
    Replay {
        /// Only this write key; every failed record when `None`.
        key: Option<String>,
        reply: oneshot::Sender<Vec<String>>,
    },
    /// `evict-oldest-when-full` only: drop this many of the oldest waiting records.
    #[cfg(feature = "mutants")]
    Evict(usize),
}

impl Journal {
    fn open(
        dir: &Path,
        output: &str,
        first_seq: u64,
        errors: Arc<AtomicU64>,
    ) -> Result<(Journal, JournalStart), EngineError> {
        let (marks, delivered) = DeliveryMarks::open(dir, output, first_seq)?;
        #[cfg(feature = "mutants")]
        let delivered = if mutant::is(Mutant::ForgetDeliveryMarks) {
            // MUTANT: what the destination confirmed is forgotten; every record still in the
            // log goes again as a fresh attempt.
            HashSet::new()
        } else {
            delivered
        };
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| EngineError::Log(log::LogError::Io { path, source })
        };
        let attempts_path = dir.join("attempts.jsonl");
        let attempts = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&attempts_path)
            .map_err(io(&attempts_path))?;
        let states = FailedStore::states(dir, output);
        let failed = FailedStore::open(dir, output).map_err(io(dir))?;
        let replayed = states
            .iter()
            .filter(|(_, s)| matches!(s, failed::State::Replayed(_)))
            .map(|(seq, _)| *seq)
            .collect();
        Ok((
            Journal {
                attempts: BufWriter::new(attempts),
                failed,
                marks,
                pending_marks: Vec::new(),
                replayed,
                errors,
            },
            JournalStart { delivered, states },
        ))
    }

    /// Says a failed journal write on stderr and counts it for `/stats.errors`: the attempt
    /// journal decides which extra copies a drill allows, the marks and the failed store what
    /// is resent after a restart.
    fn error(&self, what: &str, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::SeqCst);
        eprintln!("drill engine: error: {what}: {e}");
    }

    fn record(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Closed(attempt) => match serde_json::to_string(&attempt) {
                    Ok(line) => {
                        if let Err(e) = writeln!(self.attempts, "{line}") {
                            self.error("attempt journal", e);
                        }
                    }
                    Err(e) => self.error("attempt journal", e),
                },
                Effect::Delivered(segment, seq) => {
                    if self.replayed.remove(&seq) {
                        if let Err(e) = self.failed.delivered(seq) {
                            self.error(&self.failed.path().display().to_string(), e);
                        }
                    } else {
                        self.pending_marks.push((segment, seq));
                    }
                }
                Effect::Failed(failed) => {
                    self.replayed.remove(&failed.seq);
                    // A failed message is the only copy from now on: durable at once.
                    if let Err(e) = self.failed.add(&failed) {
                        self.error(&self.failed.path().display().to_string(), e);
                    }
                }
            }
        }
    }

    /// Writes the marks of every confirmation handled so far, in one write and without
    /// fsync: the page cache outlives a killed process, so a SIGKILL only resends what was
    /// really in flight. A power cut may lose the newest marks; those records are then sent
    /// again with their write keys (`at_least_once`).
    fn write_marks(&mut self) {
        if self.pending_marks.is_empty() {
            return;
        }
        if let Err(e) = self.marks.mark(&self.pending_marks) {
            self.error("delivery marks", e);
        }
        self.pending_marks.clear();
    }

    fn flush(&mut self) {
        self.write_marks();
        if let Err(e) = self.attempts.flush() {
            self.error("attempt journal", e);
        }
    }

    /// Puts failed records (all, or the one with `key`) back on the output's queue with their
    /// own write keys, fresh refusal count. Returns the write keys replayed.
    fn replay(&mut self, dir: &Path, out: &mut Output, key: Option<&str>) -> Vec<String> {
        let chosen: Vec<_> = FailedStore::current(dir, &out.name)
            .into_values()
            .filter(|f| key.is_none_or(|k| k == f.key))
            .collect();
        let seqs: Vec<u64> = chosen.iter().map(|f| f.seq).collect();
        if let Err(e) = self.failed.replayed(&seqs) {
            self.error(&self.failed.path().display().to_string(), e);
            return Vec::new();
        }
        out.failed = out.failed.saturating_sub(chosen.len() as u64);
        self.replayed.extend(seqs);
        let keys = chosen.iter().map(|f| f.key.clone()).collect();
        out.ingest(chosen.into_iter().map(replayed_record));
        keys
    }

    /// Handles one message for the output.
    fn take(&mut self, dir: &Path, out: &mut Output, message: ToOutput) {
        match message {
            ToOutput::Records(records) => out.ingest(records),
            ToOutput::Replay { key, reply } => {
                let keys = self.replay(dir, out, key.as_deref());
                let _ = reply.send(keys);
            }
            #[cfg(feature = "mutants")]
            ToOutput::Evict(n) => {
                let evicted = out.evict_oldest(n);
                self.record(evicted);
                self.write_marks();
            }
        }
    }

    /// Every tick of a connected session: journals written out, the marks of deleted segments
    /// closed, stats published.
    fn housekeeping(&mut self, out: &Output, shared: &Shared, index: usize) {
        self.flush();
        self.marks
            .forget_below(shared.log_state.first_seq.load(Ordering::SeqCst));
        publish_stats(shared, index, out, true);
    }

    /// A session ended without certain answers: every open attempt ends `possibly_sent`
    /// (held, and sent again with its write key only after the next probe), journalled and
    /// published.
    fn end_session(&mut self, out: &mut Output, shared: &Shared, index: usize, lost: &str) {
        self.record(out.on_link_lost(lost));
        self.flush();
        publish_stats(shared, index, out, false);
    }

    fn sync(&mut self) {
        self.flush();
        if let Err(e) = self.attempts.get_ref().sync_data() {
            self.error("attempt journal sync", e);
        }
        if let Err(e) = self.marks.sync() {
            self.error("delivery marks sync", e);
        }
    }
}

/// A failed record back on its queue. Its confirmation is kept in the failed store, so the
/// segment it names does not matter (it may be gone).
fn replayed_record(f: output::FailedRecord) -> Arc<StoredRecord> {
    Arc::new(StoredRecord {
        seq: f.seq,
        key: f.key,
        data: f.data,
        segment: 0,
    })
}

fn disk_free(dir: &Path) -> u64 {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0)
}

/// Runs the engine until `cancel` fires. Prints `listening on ADDR` once ready.
pub async fn run(config: EngineConfig, cancel: CancellationToken) -> Result<(), EngineError> {
    #[cfg(not(feature = "mutants"))]
    refuse_unbuilt_mutant()?;
    #[cfg(feature = "mutants")]
    mutant::announce()?;
    let (mut log, records, recovery) =
        RecordLog::open(&config.data_dir, config.disk.segment_bytes)?;
    say_recovery(&recovery);
    let (ingest_tx, mut ingest_rx) = mpsc::channel::<WriterJob>(1024);
    let damaged = recovery.lost_records();
    let log_state = Arc::new(LogState {
        first_seq: AtomicU64::new(log.first_seq()),
        segments: AtomicU64::new(log.segments() as u64),
        settled: config.outputs.iter().map(|_| AtomicU64::new(0)).collect(),
    });
    let errors = Arc::new(AtomicU64::new(0));
    let shared = Arc::new(Shared {
        held: Arc::new(AtomicU64::new(log.next_seq().saturating_sub(damaged))),
        errors: errors.clone(),
        damaged,
        log_state: log_state.clone(),
        data_dir: config.data_dir.clone(),
        disk: config.disk.clone(),
        disk_warned: std::sync::atomic::AtomicBool::new(false),
        outputs: Mutex::new(Vec::new()),
        ingest: ingest_tx.clone(),
        to_outputs: Mutex::new(Vec::new()),
    });

    let mut to_outputs = Vec::new();
    let mut drivers = Vec::new();
    for (index, o) in config.outputs.iter().enumerate() {
        let (journal, start) =
            Journal::open(&config.data_dir, &o.name, log.first_seq(), errors.clone())?;
        let refusals = o
            .refusals
            .as_ref()
            .map(|r| RefusalPolicy {
                max: r.max.max(1),
                backoff_min: r.backoff[0].0,
                backoff_max: r.backoff[1].0,
            })
            .unwrap_or_default();
        let mut out =
            Output::new(&o.name, &o.topic, o.order, refusals, o.window).starting_at(log.next_seq());
        resume(&mut out, &records, start, log.first_seq());
        shared
            .outputs
            .lock()
            .map(|mut v| {
                v.push(OutputStats {
                    name: o.name.clone(),
                    ..OutputStats::default()
                })
            })
            .ok();
        let (tx, rx) = mpsc::unbounded_channel::<ToOutput>();
        if let Ok(mut all) = shared.to_outputs.lock() {
            all.push(tx.clone());
        }
        to_outputs.push(tx);
        let (cfg, shared, cancel) = (o.clone(), shared.clone(), cancel.clone());
        drivers.push(match o.kind {
            OutputKind::Mqtt => {
                tokio::spawn(drive_mqtt(out, cfg, index, rx, journal, shared, cancel))
            }
            OutputKind::Nats => tokio::spawn(nats::drive_nats(
                out, cfg, index, rx, journal, shared, cancel,
            )),
            OutputKind::Kafka => tokio::spawn(kafka::drive_kafka(
                out, cfg, index, rx, journal, shared, cancel,
            )),
        });
    }
    drop(records);

    // The writer thread: group commit. Every job waiting when a sync starts shares it. After
    // each commit (and once a second) it deletes the segments every output is past.
    let held = shared.held.clone();
    let writer = std::thread::spawn(move || {
        #[cfg(feature = "mutants")]
        let mut late = mutant::LateWrites::default();
        #[cfg(feature = "mutants")]
        let mut synced_at = Instant::now();
        while let Some(first) = ingest_rx.blocking_recv() {
            let mut jobs = Vec::new();
            let mut next = Some(first);
            while let Some(job) = next {
                if let WriterJob::Ingest(j) = job {
                    jobs.push(j);
                }
                next = ingest_rx.try_recv().ok();
            }
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::AckBeforeWrite) {
                // MUTANT: the answer goes first; the batch is written a second later (the
                // ticker wakes this thread every second).
                late.answer_now(&log, std::mem::take(&mut jobs));
                late.write_due(&mut log, &held, &to_outputs, false);
            }
            if !jobs.is_empty() {
                commit(&mut log, jobs, &held, &to_outputs);
            }
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::AckBeforeFdatasync) && synced_at.elapsed() >= mutant::SYNC_EVERY {
                // MUTANT: the fdatasync that `append` skipped, long after the answers.
                if let Err(e) = log.sync_late() {
                    eprintln!("drill engine: MUTANT ack-before-fdatasync: late sync failed: {e}");
                }
                synced_at = Instant::now();
            }
            release(&mut log, &log_state);
        }
        #[cfg(feature = "mutants")]
        late.write_due(&mut log, &held, &to_outputs, true);
    });
    let ticker = {
        let tx = ingest_tx;
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = every.tick() => { let _ = tx.try_send(WriterJob::Release); }
                    _ = cancel.cancelled() => break,
                }
            }
        })
    };

    // A writer thread that panics can store nothing more: the engine stops (non-zero exit)
    // rather than go on answering ingest with errors.
    let writer_watch = {
        let cancel = cancel.clone();
        tokio::task::spawn_blocking(move || {
            let panicked = writer.join().is_err();
            if panicked {
                eprintln!("drill engine: the writer thread panicked; stopping");
                cancel.cancel();
            }
            panicked
        })
    };
    // Beyond loopback the API wants DRILL_TOKEN as a bearer token on every request.
    let token = if config.listen.ip().is_loopback() {
        None
    } else {
        crate::control::token_for(config.listen, None).map_err(EngineError::Unprotected)?
    };
    let app = Router::new()
        .route("/ingest", post(ingest))
        .route("/stats", get(stats))
        .route("/failed", get(failed_list))
        .route("/failed/replay", post(failed_replay))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_INGEST_BODY));
    let app = crate::control::guard(app, token).with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| EngineError::Listen {
            addr: config.listen,
            source,
        })?;
    let bound = listener.local_addr().unwrap_or(config.listen);
    println!("listening on {bound}");
    let stop = cancel.clone();
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    for d in drivers {
        let _ = d.await;
    }
    let _ = ticker.await;
    drop(shared);
    let panicked = writer_watch.await.unwrap_or(true);
    if panicked {
        return Err(EngineError::Writer);
    }
    Ok(())
}

fn say_recovery(recovery: &log::Recovery) {
    if recovery.torn_bytes > 0 {
        eprintln!(
            "drill engine: recovered {} records in {} segments; dropped a torn tail of {} bytes (never acknowledged)",
            recovery.records, recovery.segments, recovery.torn_bytes
        );
    }
    for d in &recovery.damage {
        eprintln!(
            "drill engine: DAMAGE: {}: {} unreadable bytes at offset {} inside acknowledged data (the disk changed them after they were synced)",
            d.segment.display(),
            d.bytes,
            d.offset
        );
    }
    if !recovery.lost.is_empty() {
        let ranges: Vec<String> = recovery
            .lost
            .iter()
            .map(|r| format!("{}..={}", r.start(), r.end()))
            .collect();
        eprintln!(
            "drill engine: DAMAGE: {} acknowledged records are unreadable and cannot be forwarded: sequences {}; every other record was kept",
            recovery.lost_records(),
            ranges.join(", ")
        );
    }
}

/// Puts an output back where its journals say it stood: records neither confirmed nor set
/// aside wait again (from the log, or from the failed store when replayed), and its counters
/// are rebuilt so that held = delivered + waiting + failed.
fn resume(out: &mut Output, records: &[Arc<StoredRecord>], start: JournalStart, first_seq: u64) {
    use failed::State;
    let JournalStart { delivered, states } = start;
    out.ingest(
        records
            .iter()
            .filter(|r| !delivered.contains(&r.seq) && !states.contains_key(&r.seq))
            .cloned(),
    );
    // Everything below the log's first sequence was settled when its segment went: delivered
    // unless the failed store still holds it. Above it, marks and the failed store tell.
    let mut delivered_count = first_seq + delivered.len() as u64;
    for (seq, state) in states {
        let below = seq < first_seq;
        match state {
            State::Failed(_) | State::Replayed(_) if below => {
                delivered_count = delivered_count.saturating_sub(1)
            }
            State::Delivered if !below => delivered_count += 1,
            _ => {}
        }
        match state {
            State::Failed(_) => out.failed += 1,
            State::Replayed(f) => out.ingest([replayed_record(f)]),
            State::Delivered => {}
        }
    }
    out.delivered = delivered_count;
}

/// Appends the jobs' lines as one batch, and answers each job once it is synced.
fn commit(
    log: &mut RecordLog,
    mut jobs: Vec<IngestJob>,
    held: &AtomicU64,
    to_outputs: &[mpsc::UnboundedSender<ToOutput>],
) {
    let sizes: Vec<usize> = jobs.iter().map(|j| j.lines.len()).collect();
    let lines: Vec<String> = jobs
        .iter_mut()
        .flat_map(|j| std::mem::take(&mut j.lines))
        .collect();
    match log.append(lines) {
        Ok(stored) => {
            held.fetch_add(stored.len() as u64, Ordering::SeqCst);
            for tx in to_outputs {
                let _ = tx.send(ToOutput::Records(stored.clone()));
            }
            let mut keys = stored.iter().map(|r| r.key.clone());
            for (job, size) in jobs.into_iter().zip(sizes) {
                let mine: Vec<String> = keys.by_ref().take(size).collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.to_string()));
            }
        }
    }
}

/// Deletes the segments every output is past, and publishes where the log now starts.
fn release(log: &mut RecordLog, state: &LogState) {
    let below = state
        .settled
        .iter()
        .map(|s| s.load(Ordering::SeqCst))
        .min()
        .unwrap_or(0);
    if let Err(e) = log.release(below) {
        eprintln!("drill engine: cannot delete a delivered segment: {e}");
    }
    state.first_seq.store(log.first_seq(), Ordering::SeqCst);
    state
        .segments
        .store(log.segments() as u64, Ordering::SeqCst);
}

/// Disk is the only limit (DESIGN.md §1.10): warn once per crossing below the warning level,
/// and below the reserve refuse before storing anything.
fn disk_check(shared: &Shared) -> Option<Response> {
    let free = disk_free(&shared.data_dir);
    let low = free < shared.disk.warn_below_bytes;
    if low != shared.disk_warned.swap(low, Ordering::SeqCst) {
        if low {
            eprintln!(
                "drill engine: warning: {free} bytes free on the data directory's disk, below {}; ingest will be refused below {}",
                shared.disk.warn_below_bytes, shared.disk.refuse_below_bytes
            );
        } else {
            eprintln!(
                "drill engine: disk space is back above {} bytes",
                shared.disk.warn_below_bytes
            );
        }
    }
    (free < shared.disk.refuse_below_bytes).then(|| {
        (
            StatusCode::INSUFFICIENT_STORAGE,
            Json(serde_json::json!({"error": format!(
                "disk full: {free} bytes free on {}, below the reserve of {} bytes; nothing was stored and nothing acknowledged; ingest resumes when space returns (nothing stored is ever evicted)",
                shared.data_dir.display(),
                shared.disk.refuse_below_bytes
            )})),
        )
            .into_response()
    })
}

/// The largest ingest request body: larger ones are answered 413 before anything is read.
pub const MAX_INGEST_BODY: usize = 16 * 1024 * 1024;
/// The largest record (one NDJSON line).
pub const MAX_RECORD: usize = 4 * 1024 * 1024;

/// Checks a batch before anything of it is stored: every line one JSON value, none too large.
/// The error names the first bad line (1-based, counting blank lines too).
pub fn check_batch(body: &str) -> Result<Vec<String>, (StatusCode, String)> {
    let mut lines = Vec::new();
    for (n, line) in body.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line.len() > MAX_RECORD {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "line {}: a record of {} bytes, over the limit of {MAX_RECORD} bytes; nothing of this batch was stored",
                    n + 1,
                    line.len()
                ),
            ));
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(line) {
            return Err((
                StatusCode::BAD_REQUEST,
                format!(
                    "line {}: not JSON ({e}); send one JSON record per line (NDJSON); nothing of this batch was stored",
                    n + 1
                ),
            ));
        }
        lines.push(line.to_string());
    }
    Ok(lines)
}

async fn ingest(
    State(shared): State<Arc<Shared>>,
    body: Result<String, axum::extract::rejection::StringRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let status = e.status();
            let error = if status == StatusCode::PAYLOAD_TOO_LARGE {
                format!(
                    "request body over the limit of {MAX_INGEST_BODY} bytes; send smaller batches; nothing was stored"
                )
            } else {
                format!("{e}; nothing was stored")
            };
            return (status, Json(serde_json::json!({ "error": error }))).into_response();
        }
    };
    let lines = match check_batch(&body) {
        Ok(lines) => lines,
        Err((status, error)) => {
            return (status, Json(serde_json::json!({ "error": error }))).into_response();
        }
    };
    if lines.is_empty() {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": "empty body: send one record per line (NDJSON)"})),
        )
            .into_response();
    }
    'room: {
        let Some(refusal) = disk_check(&shared) else {
            break 'room;
        };
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::EvictOldestWhenFull) {
            // MUTANT: room is made by dropping the oldest waiting records, and the batch is
            // taken (DESIGN.md §1.10: never evict).
            mutant::evict_oldest(&shared, lines.len());
            break 'room;
        }
        return refusal;
    }
    let (reply, answer) = oneshot::channel();
    if shared
        .ingest
        .send(WriterJob::Ingest(IngestJob { lines, reply }))
        .await
        .is_err()
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "engine is stopping").into_response();
    }
    match answer.await {
        Ok(Ok(keys)) => {
            Json(serde_json::json!({ "accepted": keys.len(), "write_keys": keys })).into_response()
        }
        Ok(Err(e)) => (
            StatusCode::INSUFFICIENT_STORAGE,
            Json(serde_json::json!({"error": format!("not stored, nothing acknowledged: {e}")})),
        )
            .into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "engine is stopping").into_response(),
    }
}

/// `GET /failed`: every failed message of every output.
async fn failed_list(State(shared): State<Arc<Shared>>) -> Json<Vec<output::FailedRecord>> {
    let names: Vec<String> = shared
        .outputs
        .lock()
        .map(|o| o.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default();
    Json(
        names
            .iter()
            .flat_map(|n| FailedStore::current(&shared.data_dir, n).into_values())
            .collect(),
    )
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    #[serde(default)]
    key: Option<String>,
}

/// `POST /failed/replay` (`{"key": "..."}` for one, `{}` for all): back on the queue, same
/// write key.
async fn failed_replay(State(shared): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let request: ReplayRequest = if body.is_empty() {
        ReplayRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return (
                    StatusCode::BAD_REQUEST,
                    Json(serde_json::json!({"error": format!("{e}; send {{\"key\":\"...\"}} or {{}}")})),
                )
                    .into_response();
            }
        }
    };
    let senders = shared
        .to_outputs
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    let mut replayed = Vec::new();
    for tx in senders {
        let (reply, answer) = oneshot::channel();
        if tx
            .send(ToOutput::Replay {
                key: request.key.clone(),
                reply,
            })
            .is_ok()
            && let Ok(keys) = answer.await
        {
            replayed.extend(keys);
        }
    }
    Json(serde_json::json!({ "replayed": replayed })).into_response()
}

async fn stats(State(shared): State<Arc<Shared>>) -> Json<Stats> {
    let outputs = shared.outputs.lock().map(|v| v.clone()).unwrap_or_default();
    let held = shared.held.load(Ordering::SeqCst);
    // With several outputs, the top line is the furthest-behind output's (each output's own
    // line closes held = delivered + waiting + failed).
    let behind = outputs.iter().min_by_key(|o| o.delivered);
    let delivered = behind.map_or(0, |o| o.delivered);
    let failed = behind.map_or(0, |o| o.failed);
    let mut attempts = AttemptCountsView::default();
    for o in &outputs {
        attempts.delivered += o.attempts.delivered;
        attempts.refused += o.attempts.refused;
        attempts.possibly_sent += o.attempts.possibly_sent;
        attempts.sent_unconfirmed += o.attempts.sent_unconfirmed;
    }
    let disk_free_bytes = disk_free(&shared.data_dir);
    Json(Stats {
        held,
        delivered,
        waiting: held.saturating_sub(delivered + failed),
        failed,
        attempts,
        disk_free_bytes,
        disk_low: disk_free_bytes < shared.disk.warn_below_bytes,
        damaged: shared.damaged,
        segments: shared.log_state.segments.load(Ordering::SeqCst),
        errors: shared.errors.load(Ordering::SeqCst),
        outputs,
    })
}

fn publish_stats(shared: &Shared, index: usize, out: &Output, connected: bool) {
    if let Some(settled) = shared.log_state.settled.get(index) {
        settled.store(out.settled_below(), Ordering::SeqCst);
    }
    if let Ok(mut outputs) = shared.outputs.lock()
        && let Some(s) = outputs.get_mut(index)
    {
        s.connected = connected;
        s.delivered = out.delivered;
        s.failed = out.failed;
        s.waiting = out.waiting();
        s.in_flight = out.in_flight() as u64;
        s.attempts = out.attempts.into();
    }
}

/// One data-free probe of an output's destination, exactly as its worker makes it before
/// (re)connecting: MQTT CONNECT + PINGREQ, a JetStream account-info request, a Kafka metadata
/// request. For tests that show a probe writes nothing.
pub async fn probe(cfg: &OutputConfig) -> Result<(), String> {
    let name = format!("drill-probe-{}", cfg.name);
    match cfg.kind {
        OutputKind::Mqtt => connect_and_probe(cfg, &name).await.map(drop),
        OutputKind::Nats => nats::connect_and_probe(cfg, &name).await.map(drop),
        OutputKind::Kafka => kafka::connect_and_probe(cfg, &name).await.map(drop),
    }
}

/// Connects and probes: CONNECT/CONNACK, then a PINGREQ/PINGRESP round trip. Writes no data.
async fn connect_and_probe(cfg: &OutputConfig, client_id: &str) -> Result<mqtt::Session, String> {
    #[cfg(feature = "mutants")]
    if mutant::is(Mutant::LocalConnectedFlag) {
        // MUTANT: "connected" once TCP connects: no CONNACK, no PINGRESP round trip.
        return mutant::connect_without_answer(cfg, client_id).await;
    }
    let limit = cfg.answer_timeout.0;
    let mut session = mqtt::connect(cfg.address, client_id, cfg.keepalive.0, limit)
        .await
        .map_err(|e| e.to_string())?;
    let probe = async {
        session
            .framed
            .send(Packet::PingReq(mqtt::PingReq))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            match session.framed.next().await {
                Some(Ok(mqtt::Inbound::Packet(Packet::PingResp(_)))) => return Ok(()),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("closed during probe".to_string()),
            }
        }
    };
    tokio::time::timeout(limit, probe)
        .await
        .map_err(|_| format!("no PINGRESP within {limit:?}"))??;
    Ok(session)
}

/// What an output's driver works on while it is not connected.
struct OutputSide<'a> {
    out: &'a mut Output,
    index: usize,
    rx: &'a mut mpsc::UnboundedReceiver<ToOutput>,
    journal: &'a mut Journal,
    shared: &'a Shared,
}

impl OutputSide<'_> {
    /// Connects and probes with `attempt` until it succeeds, backing off 100 ms → 1 s (a probe
    /// a second during a long outage) and taking in new records meanwhile. Says once that the
    /// destination is down, and that it is back. `None` when the engine stops or ingest closes.
    async fn connect<T, F, Fut>(
        &mut self,
        name: &str,
        said_down: &mut bool,
        cancel: &CancellationToken,
        mut attempt: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let mut retry = Duration::from_millis(100);
        loop {
            let connecting = attempt();
            tokio::pin!(connecting);
            let result = loop {
                tokio::select! {
                    result = &mut connecting => break result,
                    m = self.rx.recv() => self.take(m)?,
                    _ = cancel.cancelled() => return None,
                }
            };
            match result {
                Ok(connected) => {
                    if *said_down {
                        eprintln!("drill engine: output {name}: destination back (probe answered)");
                    }
                    return Some(connected);
                }
                Err(why) => {
                    #[cfg(feature = "mutants")]
                    if mutant::is(Mutant::OutageSpendsAttempts) {
                        // MUTANT: a failed connect is taken for a refusal of every waiting
                        // record (DESIGN.md §1.1: an outage never spends an attempt).
                        self.journal.record(self.out.outage_as_refusal(&why));
                        self.journal.flush();
                        publish_stats(self.shared, self.index, self.out, false);
                    }
                    if !*said_down {
                        eprintln!("drill engine: output {name}: destination unreachable: {why}");
                        *said_down = true;
                    }
                    let wake = tokio::time::sleep(retry);
                    tokio::pin!(wake);
                    loop {
                        tokio::select! {
                            _ = &mut wake => break,
                            m = self.rx.recv() => self.take(m)?,
                            _ = cancel.cancelled() => return None,
                        }
                    }
                    retry = (retry * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Takes one message from the ingest channel while disconnected; `None` once it closed.
    fn take(&mut self, message: Option<ToOutput>) -> Option<()> {
        self.journal.take(&self.shared.data_dir, self.out, message?);
        publish_stats(self.shared, self.index, self.out, false);
        Some(())
    }
}

/// The I/O side of one MQTT output. Runs until `cancel` fires or the ingest channel closes.
async fn drive_mqtt(
    mut out: Output,
    cfg: OutputConfig,
    index: usize,
    mut rx: mpsc::UnboundedReceiver<ToOutput>,
    mut journal: Journal,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let client_id = cfg
        .client_id
        .clone()
        .unwrap_or_else(|| format!("drill-engine-{}", cfg.name));
    let answer_timeout = cfg.answer_timeout.0;
    let mut said_down = false;
    publish_stats(&shared, index, &out, false);
    loop {
        #[cfg(feature = "mutants")]
        let oldest = out.oldest_waiting();
        #[cfg(feature = "mutants")]
        let oldest = oldest.as_deref();
        let mut side = OutputSide {
            out: &mut out,
            index,
            rx: &mut rx,
            journal: &mut journal,
            shared: &shared,
        };
        let (c, id) = (&cfg, client_id.as_str());
        let Some(session) = side
            .connect(&cfg.name, &mut said_down, &cancel, || async move {
                #[cfg(feature = "mutants")]
                if mutant::is(Mutant::ProbeWithOldestRecord)
                    && let Some(record) = oldest
                {
                    // MUTANT: the probe writes data: the oldest waiting record, QoS 0, no
                    // write key (DESIGN.md §1.5).
                    return mutant::probe_with_record(c, id, record).await;
                }
                connect_and_probe(c, id).await
            })
            .await
        else {
            break;
        };
        let (mut tx, incoming) = session.framed.split();
        // Every packet already readable arrives as one batch, so a burst of PUBACKs costs one
        // write of delivery marks, not one per record.
        let mut incoming = incoming.ready_chunks(256);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut last_ping = Instant::now();
        let mut ping_out: Option<Instant> = None;
        let mut last_heard = Instant::now();
        publish_stats(&shared, index, &out, true);
        let lost: String = 'conn: loop {
            let now = Instant::now();
            let sends = out.next_sends(now);
            if !sends.is_empty() {
                let write = async {
                    for p in sends {
                        tx.feed(p).await?;
                    }
                    tx.flush().await
                };
                match tokio::time::timeout(answer_timeout, write).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => break format!("write failed: {e}"),
                    Err(_) => break format!("writes blocked for {answer_timeout:?}"),
                }
            }
            // Wake exactly when a refused record's backoff ends, not on the next tick.
            let due = out.next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    let _ = tx.send(Packet::Disconnect(mqtt::Disconnect::new(
                        mqtt::DisconnectReasonCode::NormalDisconnection,
                    ))).await;
                    break "engine stopping".to_string();
                }
                packets = incoming.next() => {
                    let Some(packets) = packets else { break 'conn "connection closed".to_string() };
                    last_heard = Instant::now();
                    for packet in packets {
                        match packet {
                            Ok(mqtt::Inbound::Ack(ack)) => journal.record(out.on_ack(&ack, last_heard)),
                            Ok(mqtt::Inbound::Packet(Packet::PingResp(_))) => ping_out = None,
                            Ok(mqtt::Inbound::Packet(Packet::Disconnect(d))) => {
                                break 'conn format!("broker disconnected: {:?}", d.reason_code)
                            }
                            Ok(_) => {}
                            Err(e) => break 'conn format!("connection error: {e}"),
                        }
                    }
                    journal.write_marks();
                }
                batch = rx.recv() => match batch {
                    Some(m) => journal.take(&shared.data_dir, &mut out, m),
                    None => break "ingest closed".to_string(),
                },
                _ = async { if let Some(d) = due { tokio::time::sleep_until(d).await } }, if due.is_some() => {}
                _ = tick.tick() => {
                    #[cfg(feature = "mutants")]
                    if mutant::is(Mutant::NoKeepalive) {
                        // MUTANT: no PINGREQ, no answer timeout: only a TCP error ends this
                        // session.
                        journal.housekeeping(&out, &shared, index);
                        continue 'conn;
                    }
                    #[cfg(feature = "mutants")]
                    if mutant::is(Mutant::LocalConnectedFlag) {
                        // MUTANT: the flag says connected, so nothing is probed, and an attempt
                        // unanswered for the answer timeout is a refusal (DESIGN.md §1.2).
                        journal.record(out.unanswered_as_refused(answer_timeout, Instant::now()));
                        journal.housekeeping(&out, &shared, index);
                        continue 'conn;
                    }
                    let now = Instant::now();
                    if let Some(sent) = ping_out {
                        if now.duration_since(sent) > answer_timeout {
                            break format!("no PINGRESP within {answer_timeout:?}");
                        }
                    } else {
                        // Probe when idle for a keepalive, or at once when an attempt has waited
                        // half the answer timeout with nothing heard since.
                        let stalled = out.in_flight() > 0
                            && now.duration_since(last_heard) > answer_timeout / 2;
                        if now.duration_since(last_ping) >= cfg.keepalive.0 || stalled {
                            match tokio::time::timeout(answer_timeout, tx.send(Packet::PingReq(mqtt::PingReq))).await {
                                Ok(Ok(())) => { ping_out = Some(now); last_ping = now; }
                                Ok(Err(e)) => break format!("write failed: {e}"),
                                Err(_) => break format!("writes blocked for {answer_timeout:?}"),
                            }
                        }
                    }
                    journal.housekeeping(&out, &shared, index);
                }
            }
        };
        journal.end_session(&mut out, &shared, index, &lost);
        if cancel.is_cancelled() {
            break;
        }
        eprintln!("drill engine: output {}: connection lost: {lost}", cfg.name);
        said_down = true;
    }
    journal.sync();
    publish_stats(&shared, index, &out, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(outputs: Vec<OutputConfig>) -> EngineConfig {
        EngineConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: "/tmp/x".into(),
            outputs,
            disk: DiskLimits::default(),
        }
    }

    fn output(name: &str, kind: OutputKind, promise: Promise) -> OutputConfig {
        OutputConfig {
            kind,
            promise,
            ..OutputConfig::mqtt(name, "127.0.0.1:1".parse().unwrap(), "t")
        }
    }

    #[test]
    fn an_output_may_declare_only_what_it_can_keep() {
        let path = Path::new("engine.yaml");
        let ok = |o: Vec<OutputConfig>| config(o).validate(path).map_err(|e| e.to_string());
        assert!(ok(vec![output("m", OutputKind::Mqtt, Promise::AtLeastOnce)]).is_ok());
        assert!(
            ok(vec![output(
                "n",
                OutputKind::Nats,
                Promise::EffectivelyOnce
            )])
            .is_ok()
        );
        let e = ok(vec![output(
            "m",
            OutputKind::Mqtt,
            Promise::EffectivelyOnce,
        )])
        .unwrap_err();
        assert!(e.contains("declare at_least_once or less"), "{e}");
        let e = ok(vec![output("n", OutputKind::Nats, Promise::AtMostOnce)]).unwrap_err();
        assert!(e.contains("at_most_once"), "{e}");
        let e = ok(vec![
            output("a", OutputKind::Mqtt, Promise::AtLeastOnce),
            output("a", OutputKind::Nats, Promise::AtLeastOnce),
        ])
        .unwrap_err();
        assert!(e.contains("used twice"), "{e}");
        assert!(ok(vec![]).unwrap_err().contains("empty"));
    }
}
