//! The reference store-and-forward engine (DESIGN.md §1), run as `drill engine --config FILE`.
//!
//! Data flows: `POST /ingest` (NDJSON) → the writer thread appends every batch waiting to the
//! record log and syncs them once (group commit) → only then each HTTP answer gives its batch's
//! sequences (write keys `<engine id>-<seq>`) → each output's worker hears how far the log goes
//! and reads its backlog from the log itself ([`log::LogReader`]: a cursor and a bounded
//! read-ahead, so memory stays flat however large the backlog), forwards, and journals every
//! attempt. `GET /stats` reports held = delivered + waiting + failed from the engine's own
//! state.
//!
//! The rules (DESIGN.md §1) and where each is kept:
//!
//! - acceptance is durable, disk is the only limit: [`writer`] (group commit), [`ingest`]
//!   (the disk check), [`log`] (the bytes on disk);
//! - write keys, one open attempt per key, refusals counted, outcomes, order, the window:
//!   [`output::Output`], the synchronous state machine of one output;
//! - probes carry no data, an outage spends nothing: `session` and the destination drivers
//!   (`mqtt`, `nats`, `kafka`);
//! - what an output must remember across a crash: `journal` and [`failed`];
//! - the promise each output may declare: [`config`].
//!
//! This module only wires the parts: it opens the log, resumes each output from its journals,
//! starts one worker per output and the writer thread, and serves the HTTP API. The engine
//! never acknowledges a record before it is on disk, never drops a stored record, and never
//! lets an outage expire or spend anything.

pub mod config;
pub mod failed;
mod ingest;
mod journal;
mod kafka;
pub mod log;
mod mqtt;
#[cfg(feature = "mutants")]
pub mod mutant;
mod nats;
pub mod output;
pub mod seqset;
mod session;
mod stats;
mod writer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use config::{DiskLimits, DurText, EngineConfig, OutputConfig, OutputKind, RefusalConfig};
pub use ingest::{MAX_INGEST_BODY, MAX_RECORD, check_batch, check_lines};
pub use journal::ToOutput;
pub use stats::{AttemptCountsView, OutputStats, Stats};

use journal::Journal;
use log::RecordLog;
use output::{Output, RefusalPolicy};
use writer::WriterJob;

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

struct Shared {
    held: Arc<AtomicU64>,
    /// `<engine id>-`: a record's write key is this and its sequence.
    key_prefix: String,
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

/// Runs the engine until `cancel` fires. Prints `listening on ADDR` once ready.
pub async fn run(config: EngineConfig, cancel: CancellationToken) -> Result<(), EngineError> {
    #[cfg(not(feature = "mutants"))]
    refuse_unbuilt_mutant()?;
    #[cfg(feature = "mutants")]
    mutant::announce()?;
    let (log, recovery) = RecordLog::recover(&config.data_dir, config.disk.segment_bytes)?;
    say_recovery(&recovery);
    let (ingest_tx, ingest_rx) = mpsc::channel::<WriterJob>(1024);
    let damaged = recovery.lost_records();
    let log_state = Arc::new(LogState {
        first_seq: AtomicU64::new(log.first_seq()),
        segments: AtomicU64::new(log.segments() as u64),
        settled: config.outputs.iter().map(|_| AtomicU64::new(0)).collect(),
    });
    let errors = Arc::new(AtomicU64::new(0));
    let shared = Arc::new(Shared {
        held: Arc::new(AtomicU64::new(log.next_seq().saturating_sub(damaged))),
        key_prefix: log.key_prefix().to_string(),
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
        let (journal, start) = Journal::open(
            &config.data_dir,
            &o.name,
            log.first_seq(),
            errors.clone(),
            log.reader(),
        )?;
        let refusals = o
            .refusals
            .as_ref()
            .map(|r| RefusalPolicy {
                max: r.max.max(1),
                backoff_min: r.backoff[0].0,
                backoff_max: r.backoff[1].0,
            })
            .unwrap_or_default();
        let out = journal::resume(
            Output::new(&o.name, &o.topic, o.order, refusals, o.window()),
            start,
            log.first_seq(),
            log.next_seq(),
            &recovery.lost,
        );
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
            OutputKind::Mqtt => tokio::spawn(mqtt::drive_mqtt(
                out, cfg, index, rx, journal, shared, cancel,
            )),
            OutputKind::Nats => tokio::spawn(nats::drive_nats(
                out, cfg, index, rx, journal, shared, cancel,
            )),
            OutputKind::Kafka => tokio::spawn(kafka::drive_kafka(
                out, cfg, index, rx, journal, shared, cancel,
            )),
        });
    }

    // The writer thread: group commit, and deleting the segments every output is past.
    let writer = writer::spawn(log, ingest_rx, shared.held.clone(), to_outputs, log_state);
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
        .route("/ingest", post(ingest::ingest))
        .route("/stats", get(stats::stats))
        .route("/failed", get(ingest::failed_list))
        .route("/failed/replay", post(ingest::failed_replay))
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

/// One data-free probe of an output's destination, exactly as its worker makes it before
/// (re)connecting: MQTT CONNECT + PINGREQ, a JetStream account-info request, a Kafka metadata
/// request. For tests that show a probe writes nothing.
pub async fn probe(cfg: &OutputConfig) -> Result<(), String> {
    let name = format!("drill-probe-{}", cfg.name);
    match cfg.kind {
        OutputKind::Mqtt => mqtt::connect_and_probe(cfg, &name).await.map(drop),
        OutputKind::Nats => nats::connect_and_probe(cfg, &name).await.map(drop),
        OutputKind::Kafka => kafka::connect_and_probe(cfg, &name).await.map(drop),
    }
}
