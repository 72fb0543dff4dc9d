//! The writer thread's work: group commit of ingested batches into the record log (every batch
//! waiting when a sync starts shares it; none is answered before its fdatasync returned), and
//! the deletion of segments every output is past. Owns the append side of the log; never
//! answers before the disk did.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "mutants")]
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::LogState;
use super::journal::ToOutput;
use super::log::RecordLog;
#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

/// Starts the writer thread, which owns the log's append side until `jobs` closes: every job
/// waiting when a sync starts shares it (group commit). After each commit (and once a second,
/// on [`WriterJob::Release`]) it deletes the segments every output is past.
pub(super) fn spawn(
    mut log: RecordLog,
    mut jobs_rx: mpsc::Receiver<WriterJob>,
    held: Arc<AtomicU64>,
    to_outputs: Vec<mpsc::UnboundedSender<ToOutput>>,
    log_state: Arc<LogState>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        #[cfg(feature = "mutants")]
        let mut late = mutant::LateWrites::default();
        #[cfg(feature = "mutants")]
        let mut synced_at = Instant::now();
        while let Some(first) = jobs_rx.blocking_recv() {
            let mut jobs = Vec::new();
            let mut next = Some(first);
            while let Some(job) = next {
                if let WriterJob::Ingest(j) = job {
                    jobs.push(j);
                }
                next = jobs_rx.try_recv().ok();
            }
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::AckBeforeWrite) {
                // MUTANT: the answer goes first; the batch is written a second later (the
                // ticker wakes this thread every second).
                late.answer_now(&log, std::mem::take(&mut jobs));
                late.write_due(&mut log, &held, &to_outputs, false);
            }
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::AckBeforeFdatasync)
                && !jobs.is_empty()
                && synced_at.elapsed() >= mutant::SYNC_EVERY
            {
                // MUTANT: the fdatasync that `append_batch` skipped, long after the answers —
                // and before this round's batch, so the newest acknowledged batch is never
                // durable: a power cut at any instant loses it (syncing after the commit left
                // the whole log durable until the next batch, and a cut there lost nothing).
                if let Err(e) = log.sync_late() {
                    eprintln!("drill engine: MUTANT ack-before-fdatasync: late sync failed: {e}");
                }
                synced_at = Instant::now();
            }
            if !jobs.is_empty() {
                commit(&mut log, jobs, &held, &to_outputs);
            }
            release(&mut log, &log_state);
        }
        #[cfg(feature = "mutants")]
        late.write_due(&mut log, &held, &to_outputs, true);
    })
}

/// Work for the writer thread.
pub(super) enum WriterJob {
    Ingest(IngestJob),
    /// Delete segments every output is past.
    Release,
}

/// One ingest request: its body as received and where each record (one NDJSON line) lies in
/// it, so nothing is copied or allocated per record before the log's frame buffer.
pub(super) struct IngestJob {
    pub(super) body: bytes::Bytes,
    pub(super) lines: Vec<Range<usize>>,
    /// The sequences the batch got (its write keys are `<engine id>-<seq>`), once synced.
    pub(super) reply: oneshot::Sender<Result<Range<u64>, String>>,
}

impl IngestJob {
    /// Every non-blank line of `body` a record (no checks: tests and mutants).
    #[cfg(all(test, feature = "mutants"))]
    pub(super) fn unchecked(
        body: String,
        reply: oneshot::Sender<Result<Range<u64>, String>>,
    ) -> IngestJob {
        let body = bytes::Bytes::from(body);
        let mut lines = Vec::new();
        let mut at = 0;
        for line in body.split_inclusive(|b| *b == b'\n') {
            let trimmed = line.trim_ascii();
            if !trimmed.is_empty() {
                let start = at + (line.len() - line.trim_ascii_start().len());
                lines.push(start..start + trimmed.len());
            }
            at += line.len();
        }
        IngestJob { body, lines, reply }
    }
}

/// Appends the jobs' lines as one batch (one fdatasync for all), and answers each job with
/// its sequences once it is synced. The outputs hear only how far the log now goes.
pub(super) fn commit(
    log: &mut RecordLog,
    jobs: Vec<IngestJob>,
    held: &AtomicU64,
    to_outputs: &[mpsc::UnboundedSender<ToOutput>],
) {
    let count: usize = jobs.iter().map(|j| j.lines.len()).sum();
    let lines = jobs
        .iter()
        .flat_map(|j| j.lines.iter().map(|r| &j.body[r.clone()]));
    match log.append_batch(count, lines) {
        Ok(seqs) => {
            held.fetch_add(count as u64, Ordering::SeqCst);
            for tx in to_outputs {
                let _ = tx.send(ToOutput::Committed(seqs.end));
            }
            let mut next = seqs.start;
            for job in jobs {
                let n = job.lines.len() as u64;
                let _ = job.reply.send(Ok(next..next + n));
                next += n;
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
