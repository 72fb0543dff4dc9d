//! The writer thread's work: group commit of ingested batches into the record log (every batch
//! waiting when a sync starts shares it; none is answered before its fdatasync returned), and
//! the deletion of segments every output is past. Owns the append side of the log; never
//! answers before the disk did.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use super::LogState;
use super::journal::ToOutput;
use super::log::RecordLog;

/// Work for the writer thread.
pub(super) enum WriterJob {
    Ingest(IngestJob),
    /// Delete segments every output is past.
    Release,
}

pub(super) struct IngestJob {
    pub(super) lines: Vec<String>,
    pub(super) reply: oneshot::Sender<Result<Vec<String>, String>>,
}

/// Appends the jobs' lines as one batch, and answers each job once it is synced.
pub(super) fn commit(
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
pub(super) fn release(log: &mut RecordLog, state: &LogState) {
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
