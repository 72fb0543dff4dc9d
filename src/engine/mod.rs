//! The reference store-and-forward engine (docs/src/design.md#1-engine-rules), run as
//! `drill engine --config FILE`.
//!
//! Data flows: `POST /ingest` (NDJSON) → the writer thread appends every batch waiting to the
//! record log and syncs them once (group commit) → only then each HTTP answer gives its batch's
//! sequences (write keys `<engine id>-<seq>`) → each output's worker hears how far the log goes
//! and reads its backlog from the log itself ([`log::LogReader`]: a cursor and a bounded
//! read-ahead, so memory stays flat however large the backlog), forwards, and journals every
//! attempt. `GET /stats` reports held = delivered + waiting + failed from the engine's own
//! state.
//!
//! The rules (docs/src/design.md#1-engine-rules) and where each is kept:
//!
//! - acceptance is durable, disk is the only limit: [`writer`] (group commit), [`ingest`]
//!   (the disk check), [`log`] (the bytes on disk);
//! - write keys, one open attempt per key, refusals counted, outcomes, order, the window:
//!   [`output::Output`], the synchronous state machine of one output;
//! - probes carry no data, an outage spends nothing: [`session`], the one loop over a
//!   destination's [`Sink`] (each kind's sink is in `src/dest/<kind>/sink.rs`; the engine
//!   names no kind and speaks no protocol);
//! - what an output must remember across a crash: `journal` and [`failed`];
//! - the promise each output may declare: [`config`].
//!
//! This module only wires the parts: it opens the log, resumes each output from its journals,
//! starts one worker per output and the writer thread, and serves the HTTP API. The engine
//! never acknowledges a record before it is on disk, never drops a stored record, and never
//! lets an outage expire or spend anything.

pub mod config;
pub mod consume;
pub mod failed;
mod ingest;
mod journal;
pub mod log;
#[cfg(feature = "mutants")]
pub mod mutant;
pub mod outbox;
pub mod output;
pub mod seqset;
pub mod session;
pub mod sink;
mod stats;
pub mod tail;
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

pub use config::{DiskLimits, DurText, EngineConfig, OutputConfig, RefusalConfig};
pub use ingest::{MAX_INGEST_BODY, MAX_RECORD, check_batch, check_lines};
pub use journal::ToOutput;
pub use session::OutputTask;
pub use sink::{Sink, SinkKind, Sinks};
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
    /// The file-tail input's checkpoint as last saved (`/stats.tail`), when it tails a file.
    tail_at: tail::Published,
}

/// What the writer thread and the outputs share about the log.
struct LogState {
    first_seq: AtomicU64,
    segments: AtomicU64,
    /// Per output: everything below this sequence is settled (see [`Output::settled_below`]).
    settled: Vec<AtomicU64>,
}

/// Runs the engine until `cancel` fires, with the destination kinds `sinks` names. Prints
/// `listening on ADDR` once ready.
///
/// In order: recover the log (and say what a crash left), start one worker per output
/// (resumed from its journals), start the writer thread, serve the HTTP API until `cancel`;
/// then wait for the workers and the writer to finish.
pub async fn run(
    config: EngineConfig,
    sinks: &dyn Sinks,
    cancel: CancellationToken,
) -> Result<(), EngineError> {
    #[cfg(not(feature = "mutants"))]
    refuse_unbuilt_mutant()?;
    #[cfg(feature = "mutants")]
    mutant::announce()?;
    let (log, recovery) = RecordLog::recover(&config.data_dir, config.disk.segment_bytes)?;
    say_recovery(&recovery);
    let (ingest_tx, ingest_rx) = mpsc::channel::<WriterJob>(1024);
    let log_state = Arc::new(LogState {
        first_seq: AtomicU64::new(log.first_seq()),
        segments: AtomicU64::new(log.segments() as u64),
        settled: config.outputs.iter().map(|_| AtomicU64::new(0)).collect(),
    });
    let damaged = recovery.lost_records();
    let shared = Arc::new(Shared {
        held: Arc::new(AtomicU64::new(log.next_seq().saturating_sub(damaged))),
        key_prefix: log.key_prefix().to_string(),
        errors: Arc::new(AtomicU64::new(0)),
        damaged,
        log_state: log_state.clone(),
        data_dir: config.data_dir.clone(),
        disk: config.disk.clone(),
        disk_warned: std::sync::atomic::AtomicBool::new(false),
        outputs: Mutex::new(Vec::new()),
        ingest: ingest_tx.clone(),
        to_outputs: Mutex::new(Vec::new()),
        tail_at: tail::Published::default(),
    });
    let (to_outputs, drivers) = start_outputs(&config, sinks, &log, &recovery, &shared, &cancel)?;
    // The writer thread: group commit, and deleting the segments every output is past.
    let writer = writer::spawn(log, ingest_rx, shared.held.clone(), to_outputs, log_state);
    let tail = config.tail.clone().map(|t| {
        tail::spawn(
            t,
            config.data_dir.clone(),
            ingest_tx.clone(),
            shared.tail_at.clone(),
            cancel.clone(),
        )
    });
    let consume = config.consume.clone().map(|c| {
        consume::spawn(
            c,
            config.data_dir.clone(),
            ingest_tx.clone(),
            cancel.clone(),
        )
    });
    let outbox = config.outbox.clone().map(|o| {
        outbox::spawn(
            o,
            config.data_dir.clone(),
            ingest_tx.clone(),
            cancel.clone(),
        )
    });
    let ticker = release_every_second(ingest_tx, cancel.clone());
    let writer_watch = watch_writer(writer, cancel.clone());
    serve(&config, shared.clone(), cancel).await?;
    for d in drivers {
        let _ = d.await;
    }
    let _ = ticker.await;
    for t in tail.into_iter().chain(consume) {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
    if let Some(o) = outbox {
        let _ = o.await;
    }
    drop(shared);
    let panicked = writer_watch.await.unwrap_or(true);
    if panicked {
        return Err(EngineError::Writer);
    }
    Ok(())
}

/// One worker per output, each resumed from its journals, on its kind's sink; the channels
/// that reach them.
fn start_outputs(
    config: &EngineConfig,
    sinks: &dyn Sinks,
    log: &RecordLog,
    recovery: &log::Recovery,
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
) -> Result<Workers, EngineError> {
    let mut to_outputs = Vec::new();
    let mut drivers = Vec::new();
    for (index, o) in config.outputs.iter().enumerate() {
        let kind = sinks.kind(&o.kind).ok_or_else(|| EngineError::Config {
            path: PathBuf::from("engine.yaml"),
            message: format!(
                "output `{}`: unknown kind `{}`; this build has {}",
                o.name,
                o.kind,
                sinks.names().join(", ")
            ),
        })?;
        let errors = shared.errors.clone();
        let first = log.first_seq();
        let (journal, start) =
            Journal::open(&config.data_dir, &o.name, first, errors, log.reader())?;
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
            Output::new(&o.name, o.order, refusals, o.window_with(kind)),
            start,
            first,
            log.next_seq(),
            &recovery.lost,
        );
        if let Ok(mut v) = shared.outputs.lock() {
            v.push(OutputStats {
                name: o.name.clone(),
                ..OutputStats::default()
            });
        }
        let (tx, rx) = mpsc::unbounded_channel::<ToOutput>();
        if let Ok(mut all) = shared.to_outputs.lock() {
            all.push(tx.clone());
        }
        to_outputs.push(tx);
        let (shared, cancel) = (shared.clone(), cancel.clone());
        let task = OutputTask::new(out, o.clone(), index, rx, journal, shared, cancel);
        drivers.push(kind.spawn(task));
    }
    Ok((to_outputs, drivers))
}

/// The outputs' channels and their workers.
type Workers = (
    Vec<mpsc::UnboundedSender<ToOutput>>,
    Vec<tokio::task::JoinHandle<()>>,
);

/// Asks the writer once a second to delete the segments every output is past.
fn release_every_second(
    tx: mpsc::Sender<WriterJob>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = every.tick() => { let _ = tx.try_send(WriterJob::Release); }
                _ = cancel.cancelled() => break,
            }
        }
    })
}

/// A writer thread that panics can store nothing more: the engine stops (non-zero exit)
/// rather than go on answering ingest with errors. `true` when it panicked.
fn watch_writer(
    writer: std::thread::JoinHandle<()>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<bool> {
    tokio::task::spawn_blocking(move || {
        let panicked = writer.join().is_err();
        if panicked {
            eprintln!("drill engine: the writer thread panicked; stopping");
            cancel.cancel();
        }
        panicked
    })
}

/// The HTTP API (ingest, stats, failed messages) until `cancel`. Beyond loopback it wants
/// `DRILL_TOKEN` as a bearer token on every request.
async fn serve(
    config: &EngineConfig,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) -> Result<(), EngineError> {
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
    let app = crate::control::guard(app, token).with_state(shared);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| EngineError::Listen {
            addr: config.listen,
            source,
        })?;
    let bound = listener.local_addr().unwrap_or(config.listen);
    println!("listening on {bound}");
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
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
