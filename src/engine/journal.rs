//! The append-only journals of one output — attempts (`attempts.jsonl`), delivery marks, failed
//! messages — and how an output resumes from them after a restart. Owns what an output must
//! remember across a crash; never decides what to send.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::oneshot;

use super::failed::{self, FailedStore};
use super::log::{self, DeliveryMarks, LogReader, StoredRecord};
use super::output::{self, Effect, Output};
use super::seqset::SeqSet;
use super::stats::publish_stats;
use super::{EngineError, Shared};

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

/// The append-only journals of one output: attempts, delivery marks, failed messages.
pub(super) struct Journal {
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
    /// The output's place in the record log: its backlog is read from disk, a read-ahead at a
    /// time.
    reader: LogReader,
}

/// What an output's journals say at start.
pub(super) struct JournalStart {
    pub(super) delivered: SeqSet,
    pub(super) states: std::collections::BTreeMap<u64, failed::State>,
}

/// What reaches an output's worker: word of newly committed records (they are read from the
/// log, not passed in memory), or a request to replay failed ones.
pub enum ToOutput {
    /// The log now holds every sequence below this one, synced.
    Committed(u64),
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
    pub(super) fn open(
        dir: &Path,
        output: &str,
        first_seq: u64,
        errors: Arc<AtomicU64>,
        reader: LogReader,
    ) -> Result<(Journal, JournalStart), EngineError> {
        let (marks, delivered) = DeliveryMarks::open(dir, output, first_seq)?;
        #[cfg(feature = "mutants")]
        let delivered = if mutant::is(Mutant::ForgetDeliveryMarks) {
            // MUTANT: what the destination confirmed is forgotten; every record still in the
            // log goes again as a fresh attempt.
            SeqSet::new()
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
        // Their names are as durable as what will be written in them.
        log::sync_dir(dir)?;
        let replayed = states
            .iter()
            .filter(|(_, s)| matches!(s, failed::State::Replayed(_)))
            .map(|(seq, _)| *seq)
            .collect();
        Ok((
            Journal {
                attempts: BufWriter::with_capacity(256 << 10, attempts),
                failed,
                marks,
                pending_marks: Vec::new(),
                replayed,
                errors,
                reader,
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

    pub(super) fn record(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Closed(attempt) => {
                    // Straight into the buffered file: no line string per attempt.
                    let written = serde_json::to_writer(&mut self.attempts, &attempt)
                        .map_err(std::io::Error::from)
                        .and_then(|()| self.attempts.write_all(b"\n"));
                    if let Err(e) = written {
                        self.error("attempt journal", e);
                    }
                }
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
    pub(super) fn write_marks(&mut self) {
        if self.pending_marks.is_empty() {
            return;
        }
        if let Err(e) = self.marks.mark(&self.pending_marks) {
            self.error("delivery marks", e);
        }
        self.pending_marks.clear();
    }

    /// at_most_once: the delivery marks of `attempts`, written before they go on the wire (a
    /// SIGKILL after the send can then never send them again; the page cache keeps the marks).
    /// A record whose send then fails stays open in memory and goes in a later session of this
    /// run; only a crash in between loses it, as at_most_once allows. Replayed failed messages
    /// are settled by their answer, as always.
    pub(super) fn settle_before_sending(&mut self, attempts: &super::sink::Attempts) {
        for (_, record) in attempts {
            if !self.replayed.contains(&record.seq) {
                self.pending_marks.push((record.segment, record.seq));
            }
        }
        self.write_marks();
    }

    pub(super) fn flush(&mut self) {
        self.write_marks();
        if let Err(e) = self.attempts.flush() {
            self.error("attempt journal", e);
        }
    }

    /// Puts failed records (all, or the one with `key`) back on the output's queue with their
    /// own write keys, fresh refusal count. Returns the write keys replayed.
    pub(super) fn replay(
        &mut self,
        dir: &Path,
        out: &mut Output,
        key: Option<&str>,
    ) -> Vec<String> {
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
        out.replay(chosen.into_iter().map(replayed_record));
        keys
    }

    /// Reads on from the output's backlog in the log, as far as its read-ahead allows.
    pub(super) fn refill(&mut self, out: &mut Output) {
        if let Err(e) = out.refill(&mut self.reader) {
            self.error("reading the record log", e);
        }
    }

    /// Handles one message for the output.
    pub(super) fn take(&mut self, dir: &Path, out: &mut Output, message: ToOutput) {
        match message {
            ToOutput::Committed(next_seq) => out.committed_through(next_seq),
            ToOutput::Replay { key, reply } => {
                let keys = self.replay(dir, out, key.as_deref());
                let _ = reply.send(keys);
            }
            #[cfg(feature = "mutants")]
            ToOutput::Evict(n) => {
                // The oldest waiting records, read from the log as far as needed.
                let mut left = n;
                while left > 0 {
                    self.refill(out);
                    let evicted = out.evict_oldest(left);
                    if evicted.is_empty() {
                        break;
                    }
                    left = left.saturating_sub(evicted.len());
                    self.record(evicted);
                }
                self.write_marks();
            }
        }
    }

    /// Every tick of a connected session: journals written out, the marks of deleted segments
    /// closed, stats published.
    pub(super) fn housekeeping(&mut self, out: &Output, shared: &Shared, index: usize) {
        self.flush();
        self.marks
            .forget_below(shared.log_state.first_seq.load(Ordering::SeqCst));
        publish_stats(shared, index, out, true);
    }

    /// A session ended without certain answers: every open attempt ends `possibly_sent`
    /// (held, and sent again with its write key only after the next probe), journalled and
    /// published.
    pub(super) fn end_session(
        &mut self,
        out: &mut Output,
        shared: &Shared,
        index: usize,
        lost: &str,
    ) {
        self.record(out.on_link_lost(lost));
        self.flush();
        publish_stats(shared, index, out, false);
    }

    pub(super) fn sync(&mut self) {
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
pub(super) fn replayed_record(f: output::FailedRecord) -> Arc<StoredRecord> {
    Arc::new(StoredRecord {
        seq: f.seq,
        key: f.key,
        data: f.data,
        segment: 0,
    })
}

/// Puts an output back where its journals say it stood: records neither confirmed nor set
/// aside wait again (read from the log from `first_seq` on, or from the failed store when
/// replayed), and its counters are rebuilt so that held = delivered + waiting + failed.
/// Nothing of the backlog is read here: the output skips, as it reads, the sequences its
/// marks and failed store settled, and those `lost` to damage.
pub(super) fn resume(
    out: Output,
    start: JournalStart,
    first_seq: u64,
    next_seq: u64,
    lost: &[std::ops::RangeInclusive<u64>],
) -> Output {
    use failed::State;
    let JournalStart { delivered, states } = start;
    // Everything below the log's first sequence was settled when its segment went: delivered
    // unless the failed store still holds it. Above it, marks and the failed store tell.
    let mut delivered_count = first_seq + delivered.len();
    let mut skip = delivered;
    for r in lost {
        skip.insert_range(*r.start()..r.end() + 1);
    }
    let mut failed_count = 0;
    let mut replays = Vec::new();
    for (seq, state) in states {
        let below = seq < first_seq;
        if !below {
            skip.insert(seq);
        }
        match state {
            State::Failed(_) | State::Replayed(_) if below => {
                delivered_count = delivered_count.saturating_sub(1)
            }
            State::Delivered if !below => delivered_count += 1,
            _ => {}
        }
        match state {
            State::Failed(_) => failed_count += 1,
            State::Replayed(f) => replays.push(replayed_record(f)),
            State::Delivered => {}
        }
    }
    let mut out = out.resuming(first_seq, next_seq, skip);
    out.replay(replays);
    out.failed = failed_count;
    out.delivered = delivered_count;
    out
}
