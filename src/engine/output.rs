//! One output of the engine: the attempt ledger as a state machine.
//!
//! [`Output`] is synchronous state (STYLE.md, crucible's `apply`): it decides what to send next,
//! opens and closes attempts, and classifies outcomes. It never touches a socket, so it is unit
//! tested without one, and it names no protocol: an attempt is a record and a tag, an answer is
//! [`Answer`]. The session loop (`session.rs`, over a destination's sink) is the I/O side: it
//! turns the socket, the ingest channel and timers into calls on `Output`, and persists what
//! `Output` reports.
//!
//! An output's backlog stays in the record log: `Output` holds a cursor into it and, in
//! memory, only a read-ahead (ready, backing off or open: at most [`readahead_for`] its window),
//! refilled from a [`Backlog`] when the window could use more. What it must skip when it gets
//! there (settled before a restart, lost to damage) is a [`SeqSet`] of ranges. Memory does not
//! grow with the backlog.
//!
//! Rules kept here (docs/src/design.md#1-engine-rules): no age limit anywhere; at most one open
//! attempt per write key (a record with an open attempt is never put on the wire again); every
//! attempt ends `delivered`, `refused` or `possibly_sent` — or, on a destination that cannot
//! confirm (plain TCP, UDP), `sent_unconfirmed` once the operating system took the bytes; only a
//! refusal (the destination itself said no to this record while the connection worked: an MQTT
//! PUBACK with an error reason, a JetStream API error) counts toward the refusal limit — a cut, a
//! timeout or a refused connect spends nothing; a record whose attempt ended `possibly_sent` is
//! held and sent again with the same write key only after a data-free probe shows the destination
//! back.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::log::{LogReader, StoredRecord};
#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};
use super::seqset::SeqSet;
use crate::promise::Order;

/// How counted refusals back off and when a record is set aside as failed.
#[derive(Debug, Clone, Copy)]
pub struct RefusalPolicy {
    pub max: u32,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for RefusalPolicy {
    fn default() -> Self {
        RefusalPolicy {
            max: 10,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
        }
    }
}

impl RefusalPolicy {
    /// Backoff after the `n`th refusal (1-based): min, 2·min, 4·min … capped at max.
    pub fn backoff(&self, n: u32) -> Duration {
        let factor = 2u32.saturating_pow(n.saturating_sub(1).min(30));
        self.backoff_min
            .saturating_mul(factor)
            .min(self.backoff_max)
    }
}

/// How an attempt ended (docs/src/design.md#rule-1-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Delivered,
    Refused,
    PossiblySent,
    SentUnconfirmed,
}

/// One closed attempt, as written to `attempts.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptRecord {
    pub output: String,
    pub key: String,
    pub seq: u64,
    pub attempt: u32,
    pub opened_ms: u64,
    pub closed_ms: u64,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A record set aside after its last counted refusal (`failed-<output>.jsonl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FailedRecord {
    pub output: String,
    pub key: String,
    pub seq: u64,
    pub data: String,
    pub error: String,
    pub refusals: u32,
    pub first_attempt_ms: u64,
    pub last_attempt_ms: u64,
}

/// What a destination said to one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Stored (for JetStream also a `duplicate: true` PubAck: the copy it has is this one).
    Accepted,
    /// The destination said no to this record, in these words, while the connection worked.
    Refused(String),
    /// The operating system took the bytes, and that is all anyone will ever know (plain TCP,
    /// UDP): the record is settled as sent, never resent, and the report counts it apart if
    /// it is missing (docs/src/design.md#rule-1-6).
    SentUnconfirmed,
}

/// What the I/O side must persist after a call on [`Output`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Closed(AttemptRecord),
    /// Confirmed: `(segment, seq)` of the record, for its delivery mark.
    Delivered(u64, u64),
    Failed(FailedRecord),
}

#[derive(Debug, Clone)]
struct Entry {
    record: Arc<StoredRecord>,
    attempts: u32,
    refusals: u32,
    first_attempt_ms: Option<u64>,
    /// When this output was given the record (`expire-by-age`), and by the wall clock
    /// (`expire-by-wall-clock`).
    #[cfg(feature = "mutants")]
    given: (Instant, SystemTime),
}

#[derive(Debug)]
struct Open {
    entry: Entry,
    /// When it opened, for the journal (wall clock).
    opened_ms: u64,
    /// When it opened, for timeouts (monotonic: a wall-clock step neither fires nor holds them).
    opened: Instant,
    #[cfg(feature = "mutants")]
    marks: mutant::OpenMarks,
}

/// Attempts by outcome, for `/stats`.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct AttemptCounts {
    pub delivered: u64,
    pub refused: u64,
    pub possibly_sent: u64,
    pub sent_unconfirmed: u64,
}

/// Milliseconds since the Unix epoch, as attempts are journalled.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The state of one output: which records wait, which have an open attempt, what happened.
pub struct Output {
    pub name: String,
    order: Order,
    refusals: RefusalPolicy,
    /// Open attempts at once, at most: the configured window, or less if the destination
    /// allows less (see [`Output::limit_window`]).
    window: usize,
    configured_window: usize,
    /// Waiting records with no open attempt, by sequence.
    ready: BTreeMap<u64, Entry>,
    /// Refused records waiting out their backoff: sequence → (not before, entry).
    delayed: BTreeMap<u64, (Instant, Entry)>,
    /// Open attempts by attempt id (16 bits, so the MQTT sink sends it as the packet id).
    open: HashMap<u16, Open>,
    next_pkid: u16,
    pub attempts: AttemptCounts,
    /// Records settled by the destination's answer; on a destination that cannot confirm,
    /// records settled as sent (`attempts.sent_unconfirmed` says how many of this run).
    pub delivered: u64,
    pub failed: u64,
    /// The next sequence to read from the log: every record below it is in memory (ready,
    /// delayed or open) or settled. The backlog from here on stays on disk.
    cursor: u64,
    /// One past the newest sequence the log has committed (synced and acknowledged).
    committed: u64,
    /// Sequences at or above `cursor` not to read: settled before a restart (delivery marks,
    /// failed messages) or lost to damage. Ranges, a few bytes per run.
    skip: SeqSet,
    /// Records in memory (ready, delayed and open) at most: the read-ahead.
    readahead: usize,
    /// What one read from the backlog returned, kept between reads: no allocation per refill
    /// (a fresh, growing buffer each time made glibc consolidate its free lists, a large share
    /// of a drain's CPU by `perf`).
    chunk: Vec<StoredRecord>,
    /// `expire-by-age`: when each commit reached this output, `(one past its last sequence,
    /// when)`: the age of a record read from the log later is its commit's.
    #[cfg(feature = "mutants")]
    commits: std::collections::VecDeque<(u64, (Instant, SystemTime))>,
}

/// Where an output reads its backlog from: the record log ([`LogReader`]), or memory in tests.
pub trait Backlog {
    /// Appends to `into` the records with sequences in `from..upto`, oldest first, at most
    /// `max`; returns the sequence to read from next.
    fn read(
        &mut self,
        from: u64,
        upto: u64,
        max: usize,
        into: &mut Vec<StoredRecord>,
    ) -> Result<u64, String>;
}

impl Backlog for LogReader {
    fn read(
        &mut self,
        from: u64,
        upto: u64,
        max: usize,
        into: &mut Vec<StoredRecord>,
    ) -> Result<u64, String> {
        LogReader::read(self, from, upto, max, into).map_err(|e| e.to_string())
    }
}

/// The read-ahead of an output with this window: enough to refill the window many times over
/// between reads, bounded whatever the backlog.
pub fn readahead_for(window: usize) -> usize {
    (window * 2).clamp(1024, 1 << 16)
}

impl Output {
    pub fn new(name: &str, order: Order, refusals: RefusalPolicy, window: usize) -> Output {
        Output {
            name: name.to_string(),
            order,
            refusals,
            window: window.clamp(1, 65_000),
            configured_window: window.clamp(1, 65_000),
            ready: BTreeMap::new(),
            delayed: BTreeMap::new(),
            open: HashMap::new(),
            next_pkid: 1,
            attempts: AttemptCounts::default(),
            delivered: 0,
            failed: 0,
            cursor: 0,
            committed: 0,
            skip: SeqSet::new(),
            readahead: readahead_for(window.clamp(1, 65_000)),
            chunk: Vec::new(),
            #[cfg(feature = "mutants")]
            commits: std::collections::VecDeque::new(),
        }
    }

    /// Every record below the returned sequence is settled for this output: delivered, or set
    /// aside in its failed messages. Records it was not given yet lie above it, so the log may
    /// delete whole segments below it.
    pub fn settled_below(&self) -> u64 {
        let open = self.open.values().map(|o| o.entry.record.seq).min();
        [
            self.ready.first_key_value().map(|(s, _)| *s),
            self.delayed.first_key_value().map(|(s, _)| *s),
            open,
        ]
        .into_iter()
        .flatten()
        .fold(self.cursor, u64::min)
    }

    /// A fresh output over a log whose next sequence is `next_seq`: nothing below it to send.
    pub fn starting_at(mut self, next_seq: u64) -> Output {
        self.cursor = next_seq;
        self.committed = next_seq;
        self
    }

    /// An output resuming over a log that holds `first_seq..next_seq`: it reads its backlog
    /// from `first_seq` on, passing over the sequences in `skip`.
    pub fn resuming(mut self, first_seq: u64, next_seq: u64, mut skip: SeqSet) -> Output {
        skip.remove_below(first_seq);
        self.cursor = first_seq;
        self.committed = next_seq.max(first_seq);
        self.skip = skip;
        self
    }

    /// The log committed every sequence below `next_seq`: this output has them to send.
    pub fn committed_through(&mut self, next_seq: u64) {
        #[cfg(feature = "mutants")]
        if next_seq > self.committed
            && (mutant::is(Mutant::ExpireByAge) || mutant::is(Mutant::ExpireByWallClock))
        {
            self.commits
                .push_back((next_seq, (Instant::now(), SystemTime::now())));
        }
        self.committed = self.committed.max(next_seq);
    }

    /// The destination allows at most `max` open attempts (MQTT 5's Receive Maximum, said in
    /// CONNACK): for this session the window is the smaller of that and the configured one.
    pub fn limit_window(&mut self, max: Option<usize>) {
        self.window = match max {
            Some(m) => self.configured_window.min(m.max(1)),
            None => self.configured_window,
        };
    }

    /// Records in memory: ready, backing off, or open.
    fn loaded(&self) -> usize {
        self.ready.len() + self.delayed.len() + self.open.len()
    }

    /// Reads on from the backlog while the window could use more records and the read-ahead
    /// has room. Costs nothing when there is nothing to read.
    pub fn refill(&mut self, backlog: &mut dyn Backlog) -> Result<(), String> {
        let mut chunk = std::mem::take(&mut self.chunk);
        let read = self.refill_from(backlog, &mut chunk);
        self.chunk = chunk;
        read
    }

    fn refill_from(
        &mut self,
        backlog: &mut dyn Backlog,
        chunk: &mut Vec<StoredRecord>,
    ) -> Result<(), String> {
        while self.cursor < self.committed
            && self.ready.len() < self.window
            && self.loaded() < self.readahead
        {
            let max = self.readahead - self.loaded();
            chunk.clear();
            let next = backlog.read(self.cursor, self.committed, max, chunk)?;
            let moved = next > self.cursor;
            for record in chunk.drain(..) {
                if record.seq < self.cursor || self.skip.contains(record.seq) {
                    continue;
                }
                self.take_in(Arc::new(record));
            }
            self.cursor = self.cursor.max(next);
            self.skip.remove_below(self.cursor);
            #[cfg(feature = "mutants")]
            while self.commits.front().is_some_and(|(n, _)| *n <= self.cursor) {
                self.commits.pop_front();
            }
            if !moved {
                break;
            }
        }
        Ok(())
    }

    fn take_in(&mut self, record: Arc<StoredRecord>) {
        #[cfg(feature = "mutants")]
        let given = self
            .commits
            .iter()
            .find(|(n, _)| *n > record.seq)
            .map_or_else(|| (Instant::now(), SystemTime::now()), |(_, at)| *at);
        self.ready.insert(
            record.seq,
            Entry {
                record,
                attempts: 0,
                refusals: 0,
                first_attempt_ms: None,
                #[cfg(feature = "mutants")]
                given,
            },
        );
    }

    /// Records given in memory (tests): as if read from a log that holds them.
    pub fn ingest(&mut self, records: impl IntoIterator<Item = Arc<StoredRecord>>) {
        for record in records {
            let next = record.seq + 1;
            self.take_in(record);
            if next > self.cursor {
                self.cursor = next;
                self.committed = self.committed.max(next);
            }
        }
    }

    /// Failed records put back on the queue (their copy comes from the failed messages, not
    /// the log): they wait again with a fresh refusal count.
    pub fn replay(&mut self, records: impl IntoIterator<Item = Arc<StoredRecord>>) {
        for record in records {
            self.take_in(record);
        }
    }

    /// Records this output holds and has not settled: in memory, plus the backlog still on
    /// disk.
    pub fn waiting(&self) -> u64 {
        let on_disk = self
            .committed
            .saturating_sub(self.cursor)
            .saturating_sub(self.skip.len());
        self.loaded() as u64 + on_disk
    }

    pub fn in_flight(&self) -> usize {
        self.open.len()
    }

    /// Is there a write key with two open attempts? (Never; checked by tests.)
    pub fn open_keys_unique(&self) -> bool {
        let mut seen = std::collections::HashSet::new();
        self.open.values().all(|o| seen.insert(o.entry.record.seq))
    }

    /// Opens attempts for as many waiting records as the window allows: each gets a tag (unique
    /// among open attempts) to answer it by. In order of sequence.
    pub fn next_attempts(&mut self, now: Instant) -> Vec<(u16, Arc<StoredRecord>)> {
        let mut sends = Vec::new();
        self.next_attempts_into(now, &mut sends);
        sends
    }

    /// [`Output::next_attempts`] appended to `sends`, a buffer the caller keeps between calls
    /// (no allocation per call on a drain's hot path).
    pub fn next_attempts_into(&mut self, now: Instant, sends: &mut Vec<(u16, Arc<StoredRecord>)>) {
        let due: Vec<u64> = self
            .delayed
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            if let Some((_, entry)) = self.delayed.remove(&seq) {
                self.ready.insert(seq, entry);
            }
        }
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::ExpireByAge) {
            // MUTANT: old records are dropped and counted delivered (docs/src/design.md#rule-1-1:
            // no age limit anywhere).
            self.expire("expire-by-age", |e| {
                now.saturating_duration_since(e.given.0) > mutant::MAX_AGE
            });
        }
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::ExpireByWallClock) {
            // MUTANT: records older than an hour by the wall clock are dropped and counted
            // delivered: an outage of minutes never ages them that far, a clock jump does.
            let wall = SystemTime::now();
            self.expire("expire-by-wall-clock", |e| {
                wall.duration_since(e.given.1)
                    .is_ok_and(|age| age > mutant::MAX_WALL_AGE)
            });
        }
        while self.open.len() < self.window {
            let Some((&seq, _)) = self.ready.first_key_value() else {
                break;
            };
            #[cfg(feature = "mutants")]
            let seq = match self.ready.last_key_value() {
                // MUTANT: a backlog goes newest first (docs/src/design.md#rule-1-9).
                Some((&newest, _))
                    if mutant::is(Mutant::ResendOutOfOrder) && self.ready.len() > self.window =>
                {
                    newest
                }
                _ => seq,
            };
            if self.order == Order::InOrder
                && self
                    .delayed
                    .first_key_value()
                    .is_some_and(|(d, _)| *d < seq)
            {
                // A refused record blocks those behind it until it is delivered or set aside.
                break;
            }
            let Some(mut entry) = self.ready.remove(&seq) else {
                break;
            };
            let pkid = self.free_pkid();
            entry.attempts += 1;
            let opened_ms = wall_ms();
            entry.first_attempt_ms.get_or_insert(opened_ms);
            sends.push((pkid, entry.record.clone()));
            self.open.insert(
                pkid,
                Open {
                    entry,
                    opened_ms,
                    opened: now,
                    #[cfg(feature = "mutants")]
                    marks: mutant::OpenMarks::new(now),
                },
            );
        }
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::ResendOnTimer) {
            // MUTANT: an unanswered attempt's record goes on the wire again, on a timer
            // (docs/src/design.md#rule-1-4 and docs/src/design.md#rule-1-6: never resent on a
            // timer).
            sends.extend(self.resend_on_timer(now));
        }
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::SecondAttemptWhileOpen) {
            // MUTANT: a second open attempt for the same write key (docs/src/design.md#rule-1-4).
            sends.extend(self.open_second_attempts(now));
        }
    }

    fn free_pkid(&mut self) -> u16 {
        loop {
            let pkid = self.next_pkid;
            self.next_pkid = self.next_pkid.checked_add(1).unwrap_or(1);
            if !self.open.contains_key(&pkid) {
                return pkid;
            }
        }
    }

    /// When the next delayed (refused) record may be sent again.
    pub fn next_due(&self) -> Option<Instant> {
        self.delayed.values().map(|(at, _)| *at).min()
    }

    /// The destination answered the attempt tagged `tag`.
    pub fn on_answer(&mut self, tag: u16, answer: Answer, now: Instant) -> Vec<Effect> {
        let Some(open) = self.open.remove(&tag) else {
            return Vec::new();
        };
        let closed_ms = wall_ms();
        let mut entry = open.entry;
        let attempt = |outcome, error| AttemptRecord {
            output: self.name.clone(),
            key: entry.record.key.clone(),
            seq: entry.record.seq,
            attempt: entry.attempts,
            opened_ms: open.opened_ms,
            closed_ms,
            outcome,
            error,
        };
        let error = match answer {
            Answer::Refused(error) => error,
            Answer::SentUnconfirmed => {
                self.attempts.sent_unconfirmed += 1;
                self.delivered += 1;
                return vec![
                    Effect::Closed(attempt(Outcome::SentUnconfirmed, None)),
                    Effect::Delivered(entry.record.segment, entry.record.seq),
                ];
            }
            Answer::Accepted => {
                self.attempts.delivered += 1;
                self.delivered += 1;
                return vec![
                    Effect::Closed(attempt(Outcome::Delivered, None)),
                    Effect::Delivered(entry.record.segment, entry.record.seq),
                ];
            }
        };
        self.attempts.refused += 1;
        let closed = Effect::Closed(attempt(Outcome::Refused, Some(error.clone())));
        entry.refusals += 1;
        if entry.refusals >= self.refusals.max {
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::DropRefusedSilently) {
                // MUTANT: not set aside in Failed messages: gone, and counted done
                // (docs/src/design.md#rule-1-2).
                eprintln!(
                    "drill engine: MUTANT drop-refused-silently: dropped {} after {} refusals",
                    entry.record.key, entry.refusals
                );
                self.delivered += 1;
                return vec![
                    closed,
                    Effect::Delivered(entry.record.segment, entry.record.seq),
                ];
            }
            self.failed += 1;
            let failed = FailedRecord {
                output: self.name.clone(),
                key: entry.record.key.clone(),
                seq: entry.record.seq,
                data: entry.record.data.clone(),
                error,
                refusals: entry.refusals,
                first_attempt_ms: entry.first_attempt_ms.unwrap_or(open.opened_ms),
                last_attempt_ms: open.opened_ms,
            };
            return vec![closed, Effect::Failed(failed)];
        }
        let at = now + self.refusals.backoff(entry.refusals);
        self.delayed.insert(entry.record.seq, (at, entry));
        vec![closed]
    }

    /// The connection is gone (cut, reset, or silent past the answer timeout). Every open
    /// attempt ends `possibly_sent`; its record is held for a resend after the next probe.
    /// No refusal is counted: an outage spends nothing.
    pub fn on_link_lost(&mut self, reason: &str) -> Vec<Effect> {
        let closed_ms = wall_ms();
        let mut effects = Vec::new();
        let mut open: Vec<Open> = self.open.drain().map(|(_, o)| o).collect();
        open.sort_by_key(|o| o.entry.record.seq);
        for o in open {
            self.attempts.possibly_sent += 1;
            effects.push(Effect::Closed(AttemptRecord {
                output: self.name.clone(),
                key: o.entry.record.key.clone(),
                seq: o.entry.record.seq,
                attempt: o.entry.attempts,
                opened_ms: o.opened_ms,
                closed_ms,
                outcome: Outcome::PossiblySent,
                error: Some(reason.to_string()),
            }));
            self.ready.insert(o.entry.record.seq, o.entry);
        }
        effects
    }

    /// How long the oldest open attempt has waited for its answer at `now`.
    pub fn oldest_open_waited(&self, now: Instant) -> Option<Duration> {
        self.open
            .values()
            .map(|o| now.saturating_duration_since(o.opened))
            .max()
    }
}

/// What the mutants (`src/engine/mutant.rs`, test builds only) do to the state machine. Each
/// is called from one `mutant::is` switch; none is reachable in a correct engine.
#[cfg(feature = "mutants")]
impl Output {
    /// `expire-by-age`, `expire-by-wall-clock`: waiting records (no open attempt) that are
    /// `old` are dropped and counted delivered. No attempt is journalled: none was made.
    fn expire(&mut self, mutant: &str, old: impl Fn(&Entry) -> bool) {
        let before = self.ready.len() + self.delayed.len();
        self.ready.retain(|_, e| !old(e));
        self.delayed.retain(|_, (_, e)| !old(e));
        let expired = before - self.ready.len() - self.delayed.len();
        if expired > 0 {
            self.delivered += expired as u64;
            eprintln!(
                "drill engine: MUTANT {mutant}: output {}: dropped {expired} old records, counted delivered",
                self.name,
            );
        }
    }

    /// `resend-on-timer`: every open attempt unanswered for [`mutant::RESEND_AFTER`] since its
    /// record last went on the wire, again, under the same tag.
    fn resend_on_timer(&mut self, now: Instant) -> Vec<(u16, Arc<StoredRecord>)> {
        let mut again = Vec::new();
        for (tag, open) in &mut self.open {
            if now.saturating_duration_since(open.marks.on_wire) >= mutant::RESEND_AFTER {
                open.marks.on_wire = now;
                again.push((*tag, open.entry.record.clone()));
            }
        }
        again.sort_by_key(|(_, r)| r.seq);
        again
    }

    /// `second-attempt-while-open`: beside every attempt open for
    /// [`mutant::SECOND_ATTEMPT_AFTER`], a second one for the same record, under a new tag; the
    /// first stays open. Each is journalled when it closes.
    fn open_second_attempts(&mut self, now: Instant) -> Vec<(u16, Arc<StoredRecord>)> {
        let late: Vec<u16> = self
            .open
            .iter()
            .filter(|(_, o)| {
                !o.marks.twinned
                    && now.saturating_duration_since(o.marks.on_wire)
                        >= mutant::SECOND_ATTEMPT_AFTER
            })
            .map(|(tag, _)| *tag)
            .collect();
        let mut sends = Vec::new();
        for tag in late {
            let Some(first) = self.open.get_mut(&tag) else {
                continue;
            };
            first.marks.twinned = true;
            let mut entry = first.entry.clone();
            entry.attempts += 1;
            let pkid = self.free_pkid();
            sends.push((pkid, entry.record.clone()));
            let mut marks = mutant::OpenMarks::new(now);
            marks.twinned = true;
            self.open.insert(
                pkid,
                Open {
                    entry,
                    opened_ms: wall_ms(),
                    opened: now,
                    marks,
                },
            );
        }
        sends.sort_by_key(|(_, r)| r.seq);
        sends
    }

    /// `outage-spends-attempts`: a failed connect taken for one refused attempt of every
    /// waiting record; after [`mutant::OUTAGE_REFUSALS`] the record is set aside as failed with
    /// the connect error as "the destination's words". Journalled as refused attempts, which is
    /// what this engine believes they were.
    pub fn outage_as_refusal(&mut self, why: &str) -> Vec<Effect> {
        let now_ms = wall_ms();
        let error = format!("connect failed, counted as a refusal: {why}");
        let mut entries: Vec<Entry> = std::mem::take(&mut self.ready).into_values().collect();
        entries.extend(
            std::mem::take(&mut self.delayed)
                .into_values()
                .map(|(_, e)| e),
        );
        let mut effects = Vec::new();
        for mut entry in entries {
            entry.attempts += 1;
            entry.refusals += 1;
            entry.first_attempt_ms.get_or_insert(now_ms);
            self.attempts.refused += 1;
            effects.push(Effect::Closed(AttemptRecord {
                output: self.name.clone(),
                key: entry.record.key.clone(),
                seq: entry.record.seq,
                attempt: entry.attempts,
                opened_ms: now_ms,
                closed_ms: now_ms,
                outcome: Outcome::Refused,
                error: Some(error.clone()),
            }));
            if entry.refusals >= mutant::OUTAGE_REFUSALS {
                self.failed += 1;
                effects.push(Effect::Failed(FailedRecord {
                    output: self.name.clone(),
                    key: entry.record.key.clone(),
                    seq: entry.record.seq,
                    data: entry.record.data.clone(),
                    error: error.clone(),
                    refusals: entry.refusals,
                    first_attempt_ms: entry.first_attempt_ms.unwrap_or(now_ms),
                    last_attempt_ms: now_ms,
                }));
            } else {
                self.ready.insert(entry.record.seq, entry);
            }
        }
        effects
    }

    /// `local-connected-flag`: every attempt open longer than `limit` is closed as refused
    /// ("the destination is up, so no answer means no").
    pub fn unanswered_as_refused(&mut self, limit: Duration, now: Instant) -> Vec<Effect> {
        let cutoff = wall_ms().saturating_sub(limit.as_millis() as u64);
        let mut late: Vec<(u64, u16)> = self
            .open
            .iter()
            .filter(|(_, o)| o.opened_ms < cutoff)
            .map(|(tag, o)| (o.entry.record.seq, *tag))
            .collect();
        late.sort();
        let mut effects = Vec::new();
        for (_, tag) in late {
            let answer = Answer::Refused(format!(
                "no answer within {limit:?} while connected, counted as a refusal"
            ));
            effects.extend(self.on_answer(tag, answer, now));
        }
        effects
    }

    /// `evict-oldest-when-full`: the `n` oldest waiting records without an open attempt are
    /// dropped and counted done (marked, so that a restart does not bring them back). No
    /// attempt is journalled: none was made.
    pub fn evict_oldest(&mut self, n: usize) -> Vec<Effect> {
        let mut evicted = Vec::new();
        while evicted.len() < n {
            let oldest_ready = self.ready.first_key_value().map(|(s, _)| *s);
            let oldest_delayed = self.delayed.first_key_value().map(|(s, _)| *s);
            let entry = match (oldest_ready, oldest_delayed) {
                (Some(r), Some(d)) if d < r => self.delayed.remove(&d).map(|(_, e)| e),
                (Some(r), _) => self.ready.remove(&r),
                (None, Some(d)) => self.delayed.remove(&d).map(|(_, e)| e),
                (None, None) => None,
            };
            let Some(entry) = entry else { break };
            self.delivered += 1;
            evicted.push(Effect::Delivered(entry.record.segment, entry.record.seq));
        }
        if !evicted.is_empty() {
            eprintln!(
                "drill engine: MUTANT evict-oldest-when-full: output {}: evicted the {} oldest waiting records to make room",
                self.name,
                evicted.len()
            );
        }
        evicted
    }

    /// `probe-with-oldest-record`: the oldest record waiting (open or not).
    pub fn oldest_waiting(&self) -> Option<Arc<StoredRecord>> {
        let open = self.open.values().map(|o| &o.entry);
        let delayed = self.delayed.values().map(|(_, e)| e);
        self.ready
            .values()
            .chain(delayed)
            .chain(open)
            .min_by_key(|e| e.record.seq)
            .map(|e| e.record.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(n: u64) -> Vec<Arc<StoredRecord>> {
        (0..n)
            .map(|seq| {
                Arc::new(StoredRecord {
                    seq,
                    key: format!("k-{seq}"),
                    data: format!("{{\"seq\":{seq}}}"),
                    segment: 0,
                })
            })
            .collect()
    }

    impl Output {
        /// Opens at most `n` attempts at `now` (the window permitting); their tags.
        fn next_attempts_into_vec(&mut self, now: Instant, n: usize) -> Vec<u16> {
            let window = std::mem::replace(&mut self.window, self.open.len() + n);
            let tags = self
                .next_attempts(now)
                .into_iter()
                .map(|(t, _)| t)
                .collect();
            self.window = window;
            tags
        }
    }

    /// Opens what the window allows at `now`: (tag, write key) of each attempt.
    fn sends(out: &mut Output, now: Instant) -> Vec<(u16, String)> {
        out.next_attempts(now)
            .into_iter()
            .map(|(tag, r)| (tag, r.key.clone()))
            .collect()
    }

    fn tags(sent: &[(u16, String)]) -> Vec<u16> {
        sent.iter().map(|(t, _)| *t).collect()
    }

    fn keys(sent: &[(u16, String)]) -> Vec<String> {
        sent.iter().map(|(_, k)| k.clone()).collect()
    }

    fn accept(out: &mut Output, tag: u16, now: Instant) -> Vec<Effect> {
        out.on_answer(tag, Answer::Accepted, now)
    }

    /// What mosquitto says of a publish over its quota.
    fn refuse(out: &mut Output, tag: u16, now: Instant) -> Vec<Effect> {
        out.on_answer(
            tag,
            Answer::Refused("quota exceeded (0x97)".to_string()),
            now,
        )
    }

    fn policy() -> RefusalPolicy {
        RefusalPolicy {
            max: 3,
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(40),
        }
    }

    #[test]
    fn the_window_bounds_open_attempts_and_keys_are_never_open_twice() {
        let mut out = Output::new("o", Order::InOrder, policy(), 4);
        out.ingest(records(10));
        let now = Instant::now();
        assert_eq!(sends(&mut out, now).len(), 4);
        assert!(sends(&mut out, now).is_empty(), "window is full");
        assert!(out.open_keys_unique());
        assert_eq!(out.waiting(), 10);
    }

    /// The answer timeout of the JetStream output reads this: the oldest attempt still open,
    /// measured on the monotonic clock from when it opened.
    #[test]
    fn the_oldest_open_attempt_says_how_long_an_answer_is_awaited() {
        let mut out = Output::new("o", Order::InOrder, policy(), 3);
        out.ingest(records(3));
        let t0 = Instant::now();
        assert_eq!(out.oldest_open_waited(t0), None, "nothing open");
        let first = out.next_attempts_into_vec(t0, 2);
        let later = t0 + Duration::from_secs(5);
        let second = out.next_attempts_into_vec(later, 1);
        let at = t0 + Duration::from_secs(10);
        assert_eq!(out.oldest_open_waited(at), Some(Duration::from_secs(10)));
        for tag in first {
            out.on_answer(tag, Answer::Accepted, at);
        }
        assert_eq!(out.oldest_open_waited(at), Some(Duration::from_secs(5)));
        out.on_answer(second[0], Answer::Accepted, at);
        assert_eq!(out.oldest_open_waited(at), None);
    }

    #[test]
    fn a_cut_ends_open_attempts_possibly_sent_and_spends_no_refusal() {
        let mut out = Output::new("o", Order::InOrder, policy(), 2);
        out.ingest(records(3));
        let now = Instant::now();
        sends(&mut out, now);
        let effects = out.on_link_lost("cut");
        assert_eq!(effects.len(), 2);
        assert!(effects.iter().all(|e| matches!(e,
            Effect::Closed(a) if a.outcome == Outcome::PossiblySent)));
        assert_eq!(out.attempts.possibly_sent, 2);
        assert_eq!(out.attempts.refused, 0);
        // Resent in order, same keys, after the link is back.
        let again = sends(&mut out, now);
        assert_eq!(keys(&again), vec!["k-0", "k-1"]);
    }

    #[test]
    fn settled_below_is_the_oldest_record_not_yet_settled() {
        let mut out = Output::new("o", Order::Any, policy(), 8).starting_at(0);
        assert_eq!(out.settled_below(), 0);
        out.ingest(records(3));
        let now = Instant::now();
        let sent = tags(&sends(&mut out, now));
        assert_eq!(out.settled_below(), 0, "all three open");
        accept(&mut out, sent[1], now);
        assert_eq!(out.settled_below(), 0, "record 0 still open");
        refuse(&mut out, sent[0], now);
        assert_eq!(out.settled_below(), 0, "record 0 refused, backing off");
        accept(&mut out, sent[2], now);
        out.on_link_lost("cut");
        assert_eq!(out.settled_below(), 0);
        // Record 0 fails for good (policy: 3 refusals): everything given is settled.
        for _ in 2..=3 {
            let due = out.next_due().unwrap();
            let again = tags(&sends(&mut out, due));
            refuse(&mut out, again[0], due);
        }
        assert_eq!(out.failed, 1);
        assert_eq!(out.settled_below(), 3);
        // A fresh output over a log that already holds 10 sequences starts past them.
        assert_eq!(
            Output::new("o", Order::Any, policy(), 8)
                .starting_at(10)
                .settled_below(),
            10
        );
    }

    #[test]
    fn refusals_back_off_then_the_record_fails_and_the_rest_flows() {
        let mut out = Output::new("o", Order::InOrder, policy(), 8);
        out.ingest(records(3));
        let mut now = Instant::now();
        let sent = tags(&sends(&mut out, now));
        assert_eq!(sent.len(), 3);
        // Record 0 refused; 1 and 2 delivered.
        refuse(&mut out, sent[0], now);
        accept(&mut out, sent[1], now);
        accept(&mut out, sent[2], now);
        assert_eq!(out.delivered, 2);
        assert!(sends(&mut out, now).is_empty(), "backing off");
        let mut failed = None;
        for refusal in 2..=3 {
            now = out.next_due().unwrap();
            let sent = tags(&sends(&mut out, now));
            assert_eq!(sent.len(), 1);
            let effects = refuse(&mut out, sent[0], now);
            if refusal == 3 {
                failed = effects.into_iter().find_map(|e| match e {
                    Effect::Failed(f) => Some(f),
                    _ => None,
                });
            }
        }
        let failed = failed.expect("set aside after 3 refusals");
        assert_eq!((failed.seq, failed.refusals), (0, 3));
        assert!(failed.error.contains("quota exceeded"), "{}", failed.error);
        assert_eq!((out.failed, out.waiting()), (1, 0));
    }

    #[test]
    fn in_order_blocks_behind_a_refused_record() {
        let mut out = Output::new("o", Order::InOrder, policy(), 1);
        out.ingest(records(2));
        let now = Instant::now();
        let sent = tags(&sends(&mut out, now));
        refuse(&mut out, sent[0], now);
        assert!(sends(&mut out, now).is_empty(), "record 1 waits behind 0");
        let mut any = Output::new("o", Order::Any, policy(), 1);
        any.ingest(records(2));
        let sent = tags(&sends(&mut any, now));
        refuse(&mut any, sent[0], now);
        assert_eq!(sends(&mut any, now).len(), 1, "record 1 overtakes");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RefusalPolicy::default();
        assert_eq!(p.backoff(1), Duration::from_secs(1));
        assert_eq!(p.backoff(2), Duration::from_secs(2));
        assert_eq!(p.backoff(7), Duration::from_secs(60));
    }

    /// The mutants break the rules the tests above check, each at its switch.
    #[cfg(feature = "mutants")]
    mod mutants {
        use super::*;
        use crate::engine::mutant::{self, Mutant};

        /// `m` is active on this thread until the guard drops.
        struct Active;
        fn active(m: Mutant) -> Active {
            mutant::set_for_this_thread(Some(m));
            Active
        }
        impl Drop for Active {
            fn drop(&mut self) {
                mutant::set_for_this_thread(None);
            }
        }

        #[test]
        fn resend_on_timer_puts_an_unanswered_record_on_the_wire_again() {
            let _m = active(Mutant::ResendOnTimer);
            let mut out = Output::new("o", Order::InOrder, policy(), 8);
            out.ingest(records(2));
            let t0 = Instant::now();
            let first = sends(&mut out, t0);
            assert_eq!(tags(&first), vec![1, 2]);
            assert!(sends(&mut out, t0 + Duration::from_millis(500)).is_empty());
            let again = sends(&mut out, t0 + mutant::RESEND_AFTER);
            assert_eq!(
                tags(&again),
                vec![1, 2],
                "the same attempts, on the wire again"
            );
            assert_eq!(keys(&again), vec!["k-0", "k-1"]);
            // Both copies answered: one attempt, delivered once; the second answer is ignored.
            let effects = accept(&mut out, 1, t0);
            assert!(matches!(&effects[0], Effect::Closed(a) if a.outcome == Outcome::Delivered));
            assert!(accept(&mut out, 1, t0).is_empty());
            assert_eq!((out.delivered, out.attempts.possibly_sent), (1, 0));
        }

        #[test]
        fn second_attempt_while_open_opens_two_attempts_for_one_key() {
            let _m = active(Mutant::SecondAttemptWhileOpen);
            let mut out = Output::new("o", Order::InOrder, policy(), 8);
            out.ingest(records(1));
            let t0 = Instant::now();
            sends(&mut out, t0);
            assert!(out.open_keys_unique());
            let second = sends(&mut out, t0 + mutant::SECOND_ATTEMPT_AFTER);
            assert_eq!(keys(&second), vec!["k-0"]);
            assert!(!out.open_keys_unique(), "two open attempts for k-0");
            assert!(sends(&mut out, t0 + 3 * mutant::SECOND_ATTEMPT_AFTER).is_empty());
            // Both answered delivered: two delivered attempts, counted twice.
            let both = [1, tags(&second)[0]];
            for (n, tag) in both.into_iter().enumerate() {
                let effects = accept(&mut out, tag, t0);
                assert!(matches!(&effects[0],
                    Effect::Closed(a) if a.outcome == Outcome::Delivered && a.attempt == n as u32 + 1));
            }
            assert_eq!(out.delivered, 2);
        }

        #[test]
        fn outage_spends_attempts_fails_waiting_records_after_three_connect_errors() {
            let _m = active(Mutant::OutageSpendsAttempts);
            let mut out = Output::new("o", Order::InOrder, RefusalPolicy::default(), 8);
            out.ingest(records(2));
            for n in 1..=mutant::OUTAGE_REFUSALS {
                let effects = out.outage_as_refusal("connection refused");
                let failed = effects
                    .iter()
                    .filter(|e| matches!(e, Effect::Failed(_)))
                    .count();
                assert_eq!(failed, if n == mutant::OUTAGE_REFUSALS { 2 } else { 0 });
            }
            assert_eq!((out.failed, out.waiting(), out.attempts.refused), (2, 0, 6));
        }

        #[test]
        fn expire_by_age_drops_old_waiting_records_and_counts_them_delivered() {
            let _m = active(Mutant::ExpireByAge);
            let mut out = Output::new("o", Order::InOrder, policy(), 8);
            out.ingest(records(3));
            let later = Instant::now() + mutant::MAX_AGE + Duration::from_millis(1);
            assert!(sends(&mut out, later).is_empty(), "nothing left to send");
            assert_eq!((out.delivered, out.waiting()), (3, 0));
        }

        #[test]
        fn drop_refused_silently_sets_nothing_aside() {
            let _m = active(Mutant::DropRefusedSilently);
            let mut out = Output::new("o", Order::Any, policy(), 8);
            out.ingest(records(1));
            let mut now = Instant::now();
            for _ in 0..policy().max {
                let sent = tags(&sends(&mut out, now));
                let effects = refuse(&mut out, sent[0], now);
                assert!(!effects.iter().any(|e| matches!(e, Effect::Failed(_))));
                now = out.next_due().unwrap_or(now);
            }
            assert_eq!(
                (out.failed, out.delivered, out.waiting()),
                (0, 1, 0),
                "gone"
            );
        }

        #[test]
        fn resend_out_of_order_sends_a_backlog_newest_first() {
            let _m = active(Mutant::ResendOutOfOrder);
            let mut out = Output::new("o", Order::InOrder, policy(), 2);
            out.ingest(records(5));
            assert_eq!(keys(&sends(&mut out, Instant::now())), vec!["k-4", "k-3"]);
            // No backlog (no more waiting than the window): oldest first again.
            let mut small = Output::new("o", Order::InOrder, policy(), 2);
            small.ingest(records(2));
            assert_eq!(keys(&sends(&mut small, Instant::now())), vec!["k-0", "k-1"]);
        }

        #[test]
        fn local_connected_flag_counts_a_silence_as_a_refusal() {
            let mut out = Output::new("o", Order::Any, policy(), 8);
            out.ingest(records(1));
            let mut now = Instant::now();
            let mut failed = None;
            for _ in 0..policy().max {
                sends(&mut out, now);
                std::thread::sleep(Duration::from_millis(3));
                let effects = out.unanswered_as_refused(Duration::from_millis(1), now);
                assert!(matches!(&effects[0], Effect::Closed(a) if a.outcome == Outcome::Refused));
                failed = effects.into_iter().find_map(|e| match e {
                    Effect::Failed(f) => Some(f),
                    _ => None,
                });
                now = out.next_due().unwrap_or(now);
            }
            let failed = failed.expect("a silent destination failed a good record");
            assert!(
                failed.error.contains("no answer within"),
                "{}",
                failed.error
            );
            assert_eq!(out.attempts.possibly_sent, 0);
        }

        #[test]
        fn evict_oldest_drops_the_oldest_waiting_records() {
            let mut out = Output::new("o", Order::InOrder, policy(), 1);
            out.ingest(records(4));
            let now = Instant::now();
            sends(&mut out, now); // k-0 open: not evicted
            assert_eq!(out.evict_oldest(2).len(), 2);
            assert_eq!((out.waiting(), out.delivered), (2, 2));
            assert_eq!(out.oldest_waiting().unwrap().seq, 0);
            accept(&mut out, 1, now);
            assert_eq!(keys(&sends(&mut out, now)), vec!["k-3"]);
        }
    }
}
