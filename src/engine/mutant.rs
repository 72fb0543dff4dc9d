//! Deliberately broken engines ("mutants") for `drill selftest`: test builds only.
//!
//! Compiled only with the cargo feature `mutants` (CI builds with it, ci/test.sh; a release
//! binary never has it, and a binary without it refuses to start when `DRILL_MUTANT` is set).
//! `DRILL_MUTANT=<name>` is read once, when the engine starts (`drill engine` is spawned by the
//! drill runner and inherits the variable); an unknown name refuses to start and lists the
//! known ones. A mutant engine says so on stderr in its first line:
//!
//! ```text
//! drill engine: MUTANT ack-before-write: answers the ingest … (a deliberately broken engine for drill selftest)
//! ```
//!
//! Each mutant breaks one rule of docs/src/design.md#1-engine-rules at the one place where the
//! correct engine keeps it, behind `#[cfg(feature = "mutants")] if mutant::is(Mutant::X)` (grep
//! `Mutant::` to find them all). The breakage is meant to be plain, so that a drill with the right
//! fault fails it; the attempt journal records what the mutant really did (only
//! `forget-delivery-marks` forgets, by design, what its journals said). Where each switch is, and
//! which fault and count catch it, is said on each [`Mutant`] variant.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::journal::ToOutput;
use super::log::RecordLog;
use super::writer::IngestJob;
use super::{EngineError, Shared};
use crate::check::Signature;

/// The environment variable that names the mutant.
pub const ENV: &str = super::MUTANT_ENV;

/// Every mutant: name, and what it does wrong (one line). In the order of [`Mutant::ALL`].
pub const MUTANTS: &[(&str, &str)] = &[
    (
        "ack-before-write",
        "answers the ingest 200 at once and writes the batch to the log about a second later: a SIGKILL in between loses acknowledged records",
    ),
    (
        "ack-before-fdatasync",
        "writes the batch and answers before fdatasync, which runs every 2 s: survives a SIGKILL (page cache), not a power cut",
    ),
    (
        "memory-only",
        "keeps its buffer as if only in memory: on start it discards the last run's record log, delivery marks and failed messages, so a restart forgets everything not delivered",
    ),
    (
        "resend-on-timer",
        "puts an attempt's record on the wire again every second while the attempt is unanswered (and Kafka without idempotence): a slow link makes extra copies with no possibly_sent attempt",
    ),
    (
        "outage-spends-attempts",
        "counts every failed connect as a refusal of every waiting record and sets a record aside after 3: a long outage fails good records",
    ),
    (
        "expire-by-age",
        "drops waiting records accepted more than 5 s ago, counting them delivered: an outage longer than that loses them",
    ),
    (
        "probe-with-oldest-record",
        "asks \"is the MQTT destination back?\" by publishing the oldest waiting record at QoS 0 without its write key instead of a PINGREQ: an extra copy after every outage",
    ),
    (
        "local-connected-flag",
        "MQTT: calls itself connected once TCP connects (no CONNACK or PINGRESP awaited), never probes, and counts an attempt unanswered for the answer timeout as a refusal: a hung link fails good records",
    ),
    (
        "second-attempt-while-open",
        "opens a second attempt for a write key whose attempt has been open 1.5 s without closing the first: both answered delivered on a slow link, copies with no possibly_sent attempt",
    ),
    (
        "drop-refused-silently",
        "drops a record after its last counted refusal instead of setting it aside in Failed messages: lost, not failed",
    ),
    (
        "evict-oldest-when-full",
        "when the disk is full, evicts the oldest waiting records (counted done) to take the new ones instead of refusing ingest",
    ),
    (
        "forget-delivery-marks",
        "ignores its delivery marks on start and sends every record still in the log again, as fresh attempts",
    ),
    (
        "resend-out-of-order",
        "sends a backlog (more records waiting than the window) newest first: records reordered per key after an outage",
    ),
    (
        "no-keepalive",
        "MQTT: no PINGREQ and no answer timeout in a session; it sees a dead link only when TCP reports an error, so a link gone silent stalls it for good",
    ),
    (
        "trust-torn-tail",
        "skips the frames' CRC check when it reads its log: after a power cut that tore the last write, the torn record (zeros where its last sector never landed) is recovered and sent as if whole",
    ),
    (
        "outage-status-spends-attempts",
        "HTTP: counts a 503 (any 5xx, 408 or 429: the destination is away) as a refusal of the record, so an outage answered by a status burns through the record's refusals into Failed messages",
    ),
    (
        "handshake-failure-is-refusal",
        "TLS: counts a failed handshake (a certificate the engine does not trust) as a refusal of every waiting record, so a wrong certificate for a while burns through the records' refusals into Failed messages",
    ),
    (
        "stop-after-outage",
        "after its first failed connect or lost session it opens no destination connection again; ingest and stats go on, honestly: every record accepted after that waits for good",
    ),
    (
        "sent-without-writing",
        "syslog over TCP or UDP: journals every tenth message as sent (the OS took it) without writing it; nothing on those transports answers, so only the link can tell",
    ),
    (
        "checkpoint-before-store",
        "file tail: moves its checkpoint past the lines it read before they are stored: a power cut while they are written loses them for good (the source will not give them again)",
    ),
    (
        "skip-on-rotate",
        "file tail: follows the file by name and keeps its offset when the name points at a new file (and on start): the old file's unread rest and the new file's first bytes are skipped",
    ),
    (
        "commit-on-poll",
        "Kafka-consumer input: commits the group's offset as soon as a poll returns, before the records are stored: a crash between the commit and the store loses them",
    ),
    (
        "mark-on-poll",
        "outbox input: marks the rows it polled as sent before it stores them: a crash between the mark and the store loses them",
    ),
    (
        "fsync-retry-believes",
        "record log: when an fdatasync fails it retries, and the retry's 0 (Linux marked the pages clean, never wrote them) is believed: the batch is acknowledged and a later power cut loses it",
    ),
    (
        "no-dir-fsync",
        "record log: starts new segment files without fsyncing their directory: their data is fdatasynced and acknowledged, and a power cut that forgets the unsynced name takes every batch in them",
    ),
    (
        "expire-by-wall-clock",
        "drops waiting records accepted more than an hour ago by the wall clock, counting them delivered: no outage of minutes ages them that far, a clock jumped forward does",
    ),
    (
        "backoff-by-wall-clock",
        "waits out its reconnect backoff until a wall-clock time instead of on the monotonic clock: a clock jumped back during an outage keeps it from reconnecting for as long as the jump",
    ),
    (
        "bulk-status-only",
        "reads an Elasticsearch _bulk answer by its top-level 200 alone: every item counted delivered, the ones the answer rejected (429) or refused (400) among them",
    ),
    (
        "bulk-items-off-by-one",
        "reads an Elasticsearch _bulk answer's items one place off: each record gets the status of the item before it (the first the last's), so a refused record is counted delivered and a stored one failed",
    ),
    (
        "puback-reason-ignored",
        "reads an MQTT 5 PUBACK as delivered whatever its reason code: the publishes the broker answered 0x97 (quota exceeded) or refused (0x99) are counted delivered",
    ),
    (
        "nack-as-confirm",
        "AMQP: reads a basic.nack as a confirm: the publishes the broker did not take (a reject-publish overflow) are counted delivered",
    ),
    (
        "no-mandatory",
        "AMQP: publishes without `mandatory` and probes with the handshake alone: while the queue is missing, every publish is unroutable, confirmed and dropped",
    ),
];

/// One deliberately broken behaviour. Each variant says where its switch is and how a drill
/// catches it (measured with throwaway scenarios at 200 records/s on MQTT unless said).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    /// The writer thread in [`super::run`]. Caught by an engine `kill` while records flow
    /// (`engine-crash.yaml`: 202 lost, the ledger does not close).
    AckBeforeWrite,
    /// [`RecordLog::append_batch`] skips the sync; the writer thread syncs every [`SYNC_EVERY`].
    /// Survives a SIGKILL; only a power cut loses records (`mqtt-power-cut`: 396 lost).
    AckBeforeFdatasync,
    /// [`RecordLog::recover`]. Caught by an engine `kill` while records wait (`engine-crash.yaml`:
    /// 800 lost; the engine's `held` disagrees with the source's).
    MemoryOnly,
    /// [`super::output::Output::next_attempts`] (every output kind; NATS drops the copies by
    /// message id) and, for Kafka, `producer_config`. Caught by a `delay` whose round trip
    /// exceeds a second but not the answer timeout (1 s each way for 15 s: 792 duplicates
    /// beyond `at_least_once`) and by the shortened Kafka half-open drill (`tests/drill_run.rs`).
    /// Its journal has one attempt per record however often the record went on the wire: to
    /// this engine the copies are that one attempt.
    ResendOnTimer,
    /// `OutputTask::outage` in `session.rs` (every output kind). Caught by a `refuse` outage (20 s: 3446
    /// failed, expected 0; NATS, 12 s: 1789). Since outputs read their backlog from the log,
    /// "every waiting record" is every record in the output's read-ahead: each failed connect
    /// first reads on from the log, so an outage still fails the records that wait.
    OutageSpendsAttempts,
    /// [`super::output::Output::next_attempts`] (every output kind). Caught by an outage over
    /// [`MAX_AGE`] (`refuse` 20 s: 3108 lost; NATS, 12 s: 1524). A record's age is that of
    /// the commit that stored it (kept per commit, not per record), whenever it is read from
    /// the log.
    ExpireByAge,
    /// MQTT: `MqttSink::connect` (`src/dest/mqtt/sink.rs`). Caught by `refuse` outages: a copy without the
    /// write key per outage, beyond `at_least_once` (five 2 s outages: 5). A keyless copy that
    /// arrives first, of a record whose attempt ended `possibly_sent`, passes for the original.
    ProbeWithOldestRecord,
    /// MQTT: `connect_and_probe` and `MqttSession::tick` (`src/dest/mqtt/sink.rs`); the
    /// session loop applies what the tick asks. Caught by a `hang` longer than
    /// refusals × (answer timeout + backoff) (20 s with `refusals: { max: 3, backoff: [200ms,
    /// 1s] }`: 104 failed, expected 0).
    LocalConnectedFlag,
    /// [`super::output::Output::next_attempts`] (every output kind). Caught by a `delay` whose
    /// round trip exceeds [`SECOND_ATTEMPT_AFTER`] (1 s each way: 256 duplicates beyond
    /// `at_least_once`, and the engine counts them delivered twice: the ledger does not close).
    SecondAttemptWhileOpen,
    /// [`super::output::Output::on_answer`] (every output kind). Caught by a poison record
    /// (`poison-record.yaml`: failed 0, expected 1; 1 lost).
    DropRefusedSilently,
    /// The ingest handler's disk check, and [`super::output::Output::evict_oldest`] (reading on
    /// from the log until enough were evicted). Caught by a full disk (`mqtt-disk-full`: 400
    /// lost).
    EvictOldestWhenFull,
    /// `journal::Journal::open`. After an engine restart every record still in the log goes
    /// again, journalled as fresh attempts with no `possibly_sent`. A SIGKILL excuses a copy
    /// only of what it could have left unnoted (not confirmed 5 s or more before it), so
    /// `engine-crash` catches it: duplicates beyond at_least_once 1398.
    ForgetDeliveryMarks,
    /// [`super::output::Output::next_attempts`] (every output kind). Caught by an outage that
    /// builds a backlog (`refuse` 20 s: 4107 reordered; NATS, 12 s: 2526). Newest first within
    /// the read-ahead: a backlog larger than it goes in reversed chunks, still reordered.
    ResendOutOfOrder,
    /// MQTT: `MqttSession::tick` (`src/dest/mqtt/sink.rs`). Sits through a `hang` or `swallow` until the heal ends
    /// the connection, so those pass it; caught by a `strand` (`mqtt-strand`): no delivery after it
    /// (the `recovery` expectation), records left waiting.
    NoKeepalive,
    /// `look_at` in `super::log` (recovery and every reader). Caught by a torn power cut
    /// (`power-cut-torn`: the torn record delivered with zeros in its body, `altered`, or with
    /// its id torn, `unexpected`).
    TrustTornTail,
    /// HTTP: `HttpSession::classify` (`src/dest/http/sink.rs`). Caught by an `answer: 503`
    /// window on the endpoint (`http-503`): records set aside as failed, expected 0.
    OutageStatusSpendsAttempts,
    /// `Session::outage` (`super::session`, every output kind over TLS). Caught by a
    /// `bad_certificate` window on a TLS link (`mqtt-tls-bad-certificate`): records set aside
    /// as failed, expected 0.
    HandshakeFailureIsRefusal,
    /// `OutputTask::run` and `OutputTask::connect` (`super::session`, every output kind). Gives
    /// up on its destination after the first failed connect or lost session and holds every
    /// record from then on, reporting them waiting. Caught by `undelivered` on any drill whose
    /// link or broker fault ends a session.
    StopAfterOutage,
    /// Syslog over TCP and UDP: `SyslogSession::send` (`src/dest/syslog/sink.rs`). Skips every
    /// [`SKIP_EVERY`]th message and answers it `sent_unconfirmed` as if the OS had taken it.
    /// Caught by the link's tap on any TCP or UDP syslog drill (`syslog-udp-loss`,
    /// `syslog-tcp-half-open`): what the journal calls sent that the link never read from the
    /// engine is lost before sending.
    SentWithoutWriting,
    /// `Tail::store_lines` (`super::tail`). Caught by a power cut armed at the record log's
    /// fdatasync while the tail stores a burst (`file-power-cut`): the lines of the batch the
    /// cut took are behind a checkpoint that survived it, lost ("checkpoint ahead of the
    /// store").
    CheckpointBeforeStore,
    /// `Tail::open_first` and `Tail::follow` (`super::tail`). Caught by a rotation while the
    /// engine is down (`file-rotate-during-outage`): what it had not read of the old file and
    /// the new file's first bytes are lost.
    SkipOnRotate,
    /// `Input::step` (`super::consume`). Caught by a power cut armed at the record log's
    /// fdatasync while the consumer stores a burst (`kafka-source-kill-mid-drain`): the
    /// records of the batch the cut took are behind a committed offset, lost ("checkpoint
    /// ahead of the store").
    CommitOnPoll,
    /// `Session::run` (`super::outbox`). Caught by a power cut armed at the record log's
    /// fdatasync while the input stores a burst (`outbox-kill-mid-drain`): the rows of the
    /// burst the cut took are marked, lost ("checkpoint ahead of the store").
    MarkOnPoll,
    /// [`RecordLog::append_batch`]. Caught by an fdatasync error on the record log followed
    /// by a power cut (`disk-fsync-error`): the batch the failed fdatasync covered was
    /// acknowledged, and the cut takes it.
    FsyncRetryBelieves,
    /// `sync_new_segment` in `super::log` (segment roll and the first segment). Caught by a
    /// power cut that forgets directory entries not synced (`power-cut-dirents`, `dirents:
    /// posix`) while small segments roll during an outage: the segments started since the
    /// last directory fsync vanish with every acknowledged batch in them.
    NoDirFsync,
    /// [`super::output::Output::next_attempts`] (every output kind). Caught by a forward
    /// jump of the wall clock past [`MAX_WALL_AGE`] while records wait (`clock-jump-forward`),
    /// never by an outage of minutes (unlike `expire-by-age`). A record's wall-clock age is that
    /// of the commit that stored it.
    ExpireByWallClock,
    /// `OutputTask::connect` in `session.rs` (every output kind). Caught by a backward jump of
    /// the wall clock during an outage (`clock-jump-back`): its next connect waits out the
    /// jump, and the records held wait past the drain (`undelivered`).
    BackoffByWallClock,
    /// HTTP `_bulk`: `HttpSession::send_bulk` (`src/dest/http/sink.rs`). Caught by a
    /// `reject` fault (`http-bulk-reject`): the items rejected 429 are never resent and the
    /// ones refused 400 never counted failed, all lost.
    BulkStatusOnly,
    /// MQTT 5: `MqttSession::answers` (`src/dest/mqtt/sink.rs`). Caught by a `reject` fault
    /// on the embedded broker (`mqtt-puback-reject`): the publishes answered 0x97 are never
    /// resent and the ones refused 0x99 never counted failed, all lost.
    PubackReasonIgnored,
    /// HTTP `_bulk`: `HttpSession::send_bulk` through [`off_by_one`]. Where a batch holds a
    /// refused item, the refused record is counted delivered (lost) and a stored one failed:
    /// the counts agree, the ids do not (`http-bulk-off-by-one`: 13 lost, the 13 failed all
    /// stored, caught by reading the engine's failed records by id). Batches of one, as on
    /// `http-bulk-reject` (window 1), hide it.
    BulkItemsOffByOne,
    /// AMQP: `classify` in `src/dest/amqp/sink.rs`. Caught by `broker: nack` on a classic
    /// queue (`amqp-nack`): every nacked publish counted delivered, lost.
    NackAsConfirm,
    /// AMQP: `AmqpSession::send` and `connect_and_probe` in `src/dest/amqp/sink.rs`. Caught by
    /// `broker: queue_deleted` (`amqp-queue-deleted`): the publishes made while the queue is
    /// gone are confirmed and dropped, lost.
    NoMandatory,
}

impl Mutant {
    /// In the order of [`MUTANTS`].
    pub const ALL: [Mutant; 32] = [
        Mutant::AckBeforeWrite,
        Mutant::AckBeforeFdatasync,
        Mutant::MemoryOnly,
        Mutant::ResendOnTimer,
        Mutant::OutageSpendsAttempts,
        Mutant::ExpireByAge,
        Mutant::ProbeWithOldestRecord,
        Mutant::LocalConnectedFlag,
        Mutant::SecondAttemptWhileOpen,
        Mutant::DropRefusedSilently,
        Mutant::EvictOldestWhenFull,
        Mutant::ForgetDeliveryMarks,
        Mutant::ResendOutOfOrder,
        Mutant::NoKeepalive,
        Mutant::TrustTornTail,
        Mutant::OutageStatusSpendsAttempts,
        Mutant::HandshakeFailureIsRefusal,
        Mutant::StopAfterOutage,
        Mutant::SentWithoutWriting,
        Mutant::CheckpointBeforeStore,
        Mutant::SkipOnRotate,
        Mutant::CommitOnPoll,
        Mutant::MarkOnPoll,
        Mutant::FsyncRetryBelieves,
        Mutant::NoDirFsync,
        Mutant::ExpireByWallClock,
        Mutant::BackoffByWallClock,
        Mutant::BulkStatusOnly,
        Mutant::BulkItemsOffByOne,
        Mutant::PubackReasonIgnored,
        Mutant::NackAsConfirm,
        Mutant::NoMandatory,
    ];

    fn index(self) -> usize {
        Mutant::ALL.iter().position(|m| *m == self).unwrap_or(0)
    }

    pub fn name(self) -> &'static str {
        MUTANTS[self.index()].0
    }

    pub fn about(self) -> &'static str {
        MUTANTS[self.index()].1
    }

    /// What a drill must find to have caught this mutant: a failed expectation in the sense
    /// the [`Signature`] names (`recovery: none`, not a late recovery; `keyless_copies`, not
    /// any copy). A drill that fails it for another reason (another expectation, inconclusive)
    /// has not caught it.
    pub fn signature(self) -> &'static [Signature] {
        match self {
            Mutant::AckBeforeWrite
            | Mutant::AckBeforeFdatasync
            | Mutant::MemoryOnly
            | Mutant::ExpireByAge
            | Mutant::EvictOldestWhenFull
            | Mutant::SentWithoutWriting
            | Mutant::CheckpointBeforeStore
            | Mutant::SkipOnRotate
            | Mutant::CommitOnPoll
            | Mutant::MarkOnPoll
            | Mutant::FsyncRetryBelieves
            | Mutant::NoDirFsync
            | Mutant::ExpireByWallClock
            | Mutant::BulkStatusOnly
            | Mutant::PubackReasonIgnored
            | Mutant::BulkItemsOffByOne
            | Mutant::NackAsConfirm
            | Mutant::NoMandatory => &[Signature::Lost],
            // Where drill is the destination (HTTP) or the link pairs statements with answers
            // (PostgreSQL), the second attempt itself is seen.
            Mutant::ResendOnTimer | Mutant::SecondAttemptWhileOpen => {
                &[Signature::Duplicates, Signature::OverlappingAttempts]
            }
            Mutant::ForgetDeliveryMarks => &[Signature::Duplicates],
            Mutant::OutageSpendsAttempts
            | Mutant::LocalConnectedFlag
            | Mutant::OutageStatusSpendsAttempts
            | Mutant::HandshakeFailureIsRefusal => &[Signature::Failed],
            Mutant::ProbeWithOldestRecord => &[Signature::KeylessCopies],
            Mutant::DropRefusedSilently => &[Signature::Lost, Signature::Failed],
            Mutant::ResendOutOfOrder => &[Signature::Reordered],
            Mutant::NoKeepalive => &[Signature::RecoveryNone],
            Mutant::TrustTornTail => &[Signature::Altered, Signature::Unexpected],
            Mutant::StopAfterOutage | Mutant::BackoffByWallClock => &[Signature::Undelivered],
        }
    }

    /// The drill the selftest tries first for this mutant: the `ci` drill made for its fault
    /// (a row stops at its first catch, so a row that starts where the mutant shows costs one
    /// drill instead of walking the catalogue shortest first: the `ci` selftest went from
    /// 648 s to the length of its longest drill). The rest follow, shortest first, until one
    /// catches it by its signature — a drill missing from the selection is skipped.
    pub fn tried_first(self) -> &'static str {
        match self {
            Mutant::AckBeforeWrite | Mutant::MemoryOnly | Mutant::ForgetDeliveryMarks => {
                "engine-crash"
            }
            Mutant::AckBeforeFdatasync => "mqtt-power-cut",
            Mutant::ResendOnTimer | Mutant::SecondAttemptWhileOpen => "mqtt-slow",
            Mutant::OutageSpendsAttempts
            | Mutant::ExpireByAge
            | Mutant::ProbeWithOldestRecord
            | Mutant::ResendOutOfOrder
            | Mutant::StopAfterOutage => "mqtt-refused",
            Mutant::LocalConnectedFlag => "mqtt-hang",
            Mutant::DropRefusedSilently => "poison-record",
            Mutant::EvictOldestWhenFull => "mqtt-disk-full",
            Mutant::NoKeepalive => "mqtt-strand",
            Mutant::TrustTornTail => "power-cut-torn",
            Mutant::OutageStatusSpendsAttempts => "http-503",
            Mutant::HandshakeFailureIsRefusal => "mqtt-tls-bad-certificate",
            Mutant::SentWithoutWriting => "syslog-udp-loss",
            Mutant::CheckpointBeforeStore => "file-power-cut",
            Mutant::SkipOnRotate => "file-rotate-during-outage",
            Mutant::CommitOnPoll => "kafka-source-kill-mid-drain",
            Mutant::MarkOnPoll => "outbox-kill-mid-drain",
            Mutant::FsyncRetryBelieves => "disk-fsync-error",
            Mutant::NoDirFsync => "power-cut-dirents",
            Mutant::ExpireByWallClock => "clock-jump-forward",
            Mutant::BackoffByWallClock => "clock-jump-back",
            Mutant::BulkStatusOnly => "http-bulk-reject",
            Mutant::PubackReasonIgnored => "mqtt-puback-reject",
            Mutant::BulkItemsOffByOne => "http-bulk-off-by-one",
            Mutant::NackAsConfirm => "amqp-nack",
            Mutant::NoMandatory => "amqp-queue-deleted",
        }
    }

    /// The mutant called `name`, or an error that lists every known name.
    pub fn parse(name: &str) -> Result<Mutant, String> {
        MUTANTS
            .iter()
            .position(|(n, _)| *n == name)
            .map(|i| Mutant::ALL[i])
            .ok_or_else(|| {
                let known: Vec<&str> = MUTANTS.iter().map(|(n, _)| *n).collect();
                format!(
                    "{ENV}={name:?} names no mutant; known: {}",
                    known.join(", ")
                )
            })
    }
}

/// `bulk-items-off-by-one`: the item statuses of a `_bulk` answer, each moved one place on
/// (the last first) — every record read with the status of the item before it.
pub fn off_by_one(mut items: Vec<u16>) -> Vec<u16> {
    if is(Mutant::BulkItemsOffByOne) && !items.is_empty() {
        items.rotate_right(1);
    }
    items
}

/// `sent-without-writing` skips one message in this many.
pub const SKIP_EVERY: u64 = 10;

/// Whether `sent-without-writing` skips the message it is about to write (every
/// [`SKIP_EVERY`]th, counted across the engine).
pub fn skips_this_write() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static WRITES: AtomicU64 = AtomicU64::new(0);
    is(Mutant::SentWithoutWriting)
        && WRITES
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SKIP_EVERY)
}

/// How long `ack-before-write` keeps an acknowledged batch before writing it.
pub const WRITE_AFTER: Duration = Duration::from_secs(1);
/// How often `ack-before-fdatasync` syncs what it acknowledged.
pub const SYNC_EVERY: Duration = Duration::from_secs(2);
/// How long an attempt stays unanswered before `resend-on-timer` puts it on the wire again.
pub const RESEND_AFTER: Duration = Duration::from_secs(1);
/// Failed connects after which `outage-spends-attempts` sets a waiting record aside.
pub const OUTAGE_REFUSALS: u32 = 3;
/// The age at which `expire-by-age` drops a waiting record.
pub const MAX_AGE: Duration = Duration::from_secs(5);
/// The wall-clock age at which `expire-by-wall-clock` drops a waiting record.
pub const MAX_WALL_AGE: Duration = Duration::from_secs(3600);
/// How long an attempt stays open before `second-attempt-while-open` opens another (half the
/// default answer timeout).
pub const SECOND_ATTEMPT_AFTER: Duration = Duration::from_millis(1500);

/// The mutant named by [`ENV`], if set: what `run` checks before anything starts.
pub fn from_env() -> Result<Option<Mutant>, String> {
    match std::env::var_os(ENV) {
        None => Ok(None),
        Some(name) => Mutant::parse(&name.to_string_lossy()).map(Some),
    }
}

static ACTIVE: OnceLock<Option<Mutant>> = OnceLock::new();

#[cfg(test)]
thread_local! {
    static THIS_THREAD: std::cell::Cell<Option<Mutant>> = const { std::cell::Cell::new(None) };
}

/// Unit tests only: make `m` the active mutant on this thread (the state machine's tests are
/// synchronous), so tests in parallel do not see each other's.
#[cfg(test)]
pub fn set_for_this_thread(m: Option<Mutant>) {
    THIS_THREAD.with(|t| t.set(m));
}

/// The active mutant: [`ENV`], read once.
pub fn active() -> Option<Mutant> {
    #[cfg(test)]
    if let Some(m) = THIS_THREAD.with(|t| t.get()) {
        return Some(m);
    }
    *ACTIVE.get_or_init(|| from_env().ok().flatten())
}

/// Is `m` the active mutant?
pub fn is(m: Mutant) -> bool {
    active() == Some(m)
}

/// What a session's tick does under the mutants that break it, for every sink that has a
/// keepalive or an answer timeout: `no-keepalive` (nothing is probed or timed out: only a
/// transport error ends the session) and `local-connected-flag` (the flag says connected, so
/// an attempt unanswered for the answer timeout is a refusal, docs/src/design.md#rule-1-2).
/// `None`: no such mutant runs, the sink ticks as it should.
pub fn session_tick(answer_timeout: std::time::Duration) -> Option<super::sink::Tick> {
    match active() {
        Some(Mutant::NoKeepalive) => Some(super::sink::Tick::Fine),
        Some(Mutant::LocalConnectedFlag) => {
            Some(super::sink::Tick::RefuseUnanswered(answer_timeout))
        }
        _ => None,
    }
}

/// At start: refuses an unknown name, and says which mutant runs.
pub(super) fn announce() -> Result<(), EngineError> {
    let chosen = from_env().map_err(EngineError::Mutant)?;
    if let Some(m) = chosen {
        eprintln!(
            "drill engine: MUTANT {}: {} (a deliberately broken engine for drill selftest)",
            m.name(),
            m.about()
        );
    }
    Ok(())
}

/// Per open attempt, what the mutants that put a record on the wire again need to know.
#[derive(Debug, Clone, Copy)]
pub struct OpenMarks {
    /// When the record was last put on the wire for this attempt (`resend-on-timer`).
    pub on_wire: Instant,
    /// A second attempt was opened beside this one (`second-attempt-while-open`).
    pub twinned: bool,
}

impl OpenMarks {
    pub fn new(now: Instant) -> OpenMarks {
        OpenMarks {
            on_wire: now,
            twinned: false,
        }
    }
}

/// `ack-before-write`: batches answered already and written [`WRITE_AFTER`] later.
#[derive(Default)]
pub(super) struct LateWrites {
    batches: Vec<(Instant, bytes::Bytes, Vec<std::ops::Range<usize>>)>,
    lines: u64,
}

impl LateWrites {
    /// Answers every job now, with the sequences (hence write keys) the log will give its
    /// lines once they are written, and keeps the lines.
    pub(super) fn answer_now(&mut self, log: &RecordLog, jobs: Vec<IngestJob>) {
        let now = Instant::now();
        for job in jobs {
            let first = log.next_seq() + self.lines;
            let n = job.lines.len() as u64;
            self.lines += n;
            let _ = job.reply.send(Ok(first..first + n));
            self.batches.push((now, job.body, job.lines));
        }
    }

    /// Writes (and syncs) the batches answered at least [`WRITE_AFTER`] ago, or all of them.
    pub(super) fn write_due(
        &mut self,
        log: &mut RecordLog,
        held: &std::sync::atomic::AtomicU64,
        to_outputs: &[tokio::sync::mpsc::UnboundedSender<ToOutput>],
        all: bool,
    ) {
        let due = self
            .batches
            .iter()
            .take_while(|(at, _, _)| all || at.elapsed() >= WRITE_AFTER)
            .count();
        for (_, body, lines) in self.batches.drain(..due) {
            self.lines -= lines.len() as u64;
            // Nobody waits for this answer: it was given a second ago.
            let (reply, _) = tokio::sync::oneshot::channel();
            super::writer::commit(
                log,
                vec![IngestJob { body, lines, reply }],
                held,
                to_outputs,
            );
        }
    }
}

/// `memory-only`: forgets what the last run left in `dir` (record log, delivery marks, failed
/// messages, the engine's identity, so write keys stay unique); the attempt journal stays.
pub(super) fn forget_last_run(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut gone = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let forget = name == "engine.id"
            || name.starts_with("records-")
            || name.starts_with("delivered-")
            || name.starts_with("failed-");
        if forget && std::fs::remove_file(entry.path()).is_ok() {
            gone += 1;
        }
    }
    if gone > 0 {
        eprintln!(
            "drill engine: MUTANT memory-only: forgot the last run ({gone} files of {})",
            dir.display()
        );
    }
}

/// `evict-oldest-when-full`: every output drops its `n` oldest waiting records.
pub(super) fn evict_oldest(shared: &Shared, n: usize) {
    if let Ok(outputs) = shared.to_outputs.lock() {
        for tx in outputs.iter() {
            let _ = tx.send(ToOutput::Evict(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mutant_has_a_name_and_a_description_and_parses_back() {
        assert_eq!(MUTANTS.len(), Mutant::ALL.len());
        for m in Mutant::ALL {
            assert_eq!(Mutant::parse(m.name()), Ok(m));
            // The name is the variant's, in kebab case: MUTANTS and ALL in the same order.
            let kebab: String = format!("{m:?}")
                .chars()
                .enumerate()
                .flat_map(|(i, c)| match (i, c.is_uppercase()) {
                    (0, _) => vec![c.to_ascii_lowercase()],
                    (_, true) => vec!['-', c.to_ascii_lowercase()],
                    _ => vec![c],
                })
                .collect();
            assert_eq!(kebab, m.name(), "MUTANTS and Mutant::ALL disagree at {m:?}");
            assert!(!m.about().is_empty() && !m.about().contains('\n'));
        }
        let mut names: Vec<&str> = MUTANTS.iter().map(|(n, _)| *n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), MUTANTS.len(), "names are unique");
    }

    #[test]
    fn an_unknown_name_is_refused_with_every_known_name_listed() {
        let e = Mutant::parse("ack-before-wrte").unwrap_err();
        assert!(
            e.contains("DRILL_MUTANT=\"ack-before-wrte\" names no mutant"),
            "{e}"
        );
        for (name, _) in MUTANTS {
            assert!(e.contains(name), "{name} missing from: {e}");
        }
        assert!(Mutant::parse("").is_err());
    }

    #[test]
    fn ack_before_write_answers_before_the_log_has_the_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _, _) = RecordLog::open(dir.path(), 1 << 20).unwrap();
        let (reply, answer) = tokio::sync::oneshot::channel();
        let mut late = LateWrites::default();
        let body = "{\"a\":1}\n{\"a\":2}\n".to_string();
        late.answer_now(&log, vec![IngestJob::unchecked(body, reply)]);
        let seqs = answer.blocking_recv().unwrap().unwrap();
        let keys: Vec<String> = seqs.map(|seq| log.key_for(seq)).collect();
        assert_eq!(
            (keys.len(), log.next_seq()),
            (2, 0),
            "answered, not written"
        );
        let held = std::sync::atomic::AtomicU64::new(0);
        late.write_due(&mut log, &held, &[], false);
        assert_eq!(log.next_seq(), 0, "not due for a second");
        late.write_due(&mut log, &held, &[], true);
        assert_eq!(log.next_seq(), 2);
        drop(log);
        let (_, records, _) = RecordLog::open(dir.path(), 1 << 20).unwrap();
        let stored: Vec<String> = records.iter().map(|r| r.key.clone()).collect();
        assert_eq!(
            stored, keys,
            "the keys answered are the keys the log minted"
        );
    }

    #[test]
    fn memory_only_forgets_the_last_run_on_start() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _, _) = RecordLog::open(dir.path(), 1 << 20).unwrap();
        let before = log.append(vec!["{}".to_string()]).unwrap()[0].key.clone();
        drop(log);
        set_for_this_thread(Some(Mutant::MemoryOnly));
        let (log, records, _) = RecordLog::open(dir.path(), 1 << 20).unwrap();
        set_for_this_thread(None);
        assert!(records.is_empty());
        assert_eq!(log.next_seq(), 0);
        assert_ne!(
            log.key_for(0),
            before,
            "a new identity: write keys are never reused"
        );
    }

    #[test]
    fn forget_delivery_marks_reads_no_marks_on_start() {
        let dir = tempfile::tempdir().unwrap();
        let (mut marks, _) = super::super::log::DeliveryMarks::open(dir.path(), "o", 0).unwrap();
        marks.mark(&[(0, 0), (0, 1)]).unwrap();
        drop(marks);
        let errors = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (log, _) = RecordLog::recover(dir.path(), 1 << 20).unwrap();
        let (_, start) =
            super::super::journal::Journal::open(dir.path(), "o", 0, errors.clone(), log.reader())
                .unwrap();
        assert_eq!(start.delivered.len(), 2);
        set_for_this_thread(Some(Mutant::ForgetDeliveryMarks));
        let (_, start) =
            super::super::journal::Journal::open(dir.path(), "o", 0, errors, log.reader()).unwrap();
        set_for_this_thread(None);
        assert!(start.delivered.is_empty());
    }

    #[test]
    fn the_override_is_per_thread() {
        set_for_this_thread(Some(Mutant::ExpireByAge));
        assert!(is(Mutant::ExpireByAge));
        let other = std::thread::spawn(|| is(Mutant::ExpireByAge))
            .join()
            .unwrap();
        assert!(
            !other,
            "another thread sees no mutant (DRILL_MUTANT is not set in tests)"
        );
        set_for_this_thread(None);
        assert!(!is(Mutant::ExpireByAge));
    }
}
