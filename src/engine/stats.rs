//! `GET /stats`: held = delivered + waiting + failed, from the engine's own state. Each output's
//! worker publishes its counters here; the handler only reads them. Never decides anything.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::Shared;
use super::ingest::disk_free;
use super::output::{AttemptCounts, Output};
use super::tail::Checkpoint;

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

/// Attempts by outcome (docs/src/design.md#6-interfaces).
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

/// `GET /stats` (docs/src/design.md#6-interfaces).
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
    /// The file-tail input's checkpoint as last saved durably (inode and offset), when the
    /// engine tails a file: what `checkpoint: { from: stats }` reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<Checkpoint>,
}

pub(super) async fn stats(State(shared): State<Arc<Shared>>) -> Json<Stats> {
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
        tail: shared.tail_at.get(),
    })
}

pub(super) fn publish_stats(shared: &Shared, index: usize, out: &Output, connected: bool) {
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
