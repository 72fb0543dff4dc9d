//! [`Facts`]: everything one drill observed, as the runner hands it to the verdict.
//!
//! The runner collects and never judges: what the source was told ([`Sent`]), what the reader
//! found ([`Received`]), what the timeline did ([`FaultRecord`]), what the engine said of
//! itself. `report::judge` computes the ledger, the allowance of the declared promise, the
//! reasons a drill is inconclusive and the recovery from these alone, so every rule of the
//! verdict is unit-tested on hand-made facts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use super::events::FaultRecord;
use crate::proxy::LinkStatus;
use crate::scenario::Plan;
use crate::sut::Account;
use crate::verify::Received;
use crate::workload::Sent;

/// One sample of the drill, once a second from its start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    /// Milliseconds since the drill's start.
    pub at_ms: u64,
    /// Records accepted so far.
    pub accepted: u64,
    /// The engine's backlog as it reported it (`None`: no account, or no answer in time).
    pub waiting: Option<u64>,
    /// Records the source the engine pulls from holds that the engine has not read (a file)
    /// or not passed (a topic's committed offset, an outbox's marks); `None` without a source.
    pub unread: Option<u64>,
}

/// What one drill observed; the verdict is computed from this alone.
#[derive(Debug)]
pub struct Facts {
    /// The scenario as validated.
    pub plan: Plan,
    /// The seed in force (the scenario's, or `--seed`).
    pub seed: u64,
    /// Where the broker ran: `process`, `embedded`, `container` or `external`.
    pub runtime: String,
    /// Every record the workload generated and what its ingest answered.
    pub sent: Sent,
    /// Every copy the reader found at the destination.
    pub received: Received,
    /// The built-in engine's write keys that had an attempt end `possibly_sent`, from its
    /// attempt journal; `None` for a user's engine, whose attempts drill cannot see.
    pub possibly_sent_keys: Option<HashSet<String>>,
    /// The built-in engine's write keys whose attempt ended `sent_unconfirmed` (a destination
    /// that cannot confirm), from the same journal; `None` for a user's engine.
    pub sent_unconfirmed_keys: Option<HashSet<String>>,
    /// The built-in engine's attempts by outcome over every run of it in the drill, from the
    /// same journal (its `/stats` counts start again at each restart); `None` for a user's
    /// engine, whose attempts are what its account says, if anything.
    pub journal_attempts: Option<crate::engine::AttemptCountsView>,
    /// When the engine was killed or stopped (a power cut is one too).
    pub crashes: Vec<Duration>,
    /// Which of those were power cuts.
    pub power_cuts: Vec<Duration>,
    /// The faults as applied, each closed when it ended.
    pub faults: Vec<FaultRecord>,
    /// Once a second: accepted so far and the engine's backlog.
    pub samples: Vec<Sample>,
    /// What the links' protocol tap saw (`None`: the destination kind has no tap).
    pub tapped: Option<Tapped>,
    /// Whether a record delivered while the link was refused proves a bypass here: the
    /// read-back's arrival times are the destination's own and one link is the only way to
    /// the broker.
    pub bypass_is_judged: bool,
    /// How long the drain took after the workload and the timeline.
    pub drain_ms: u64,
    /// When the drain ended, from the drill's start: what the engine still holds then was
    /// never delivered, and the deliveries just before it tell a stalled engine from a slow one.
    pub drain_end_ms: u64,
    /// The system's own account at the end (`None`: it gave none, or did not answer).
    pub engine: Option<Account>,
    /// The ids of the records the engine lists as failed at the end (drill's engine: `GET
    /// /failed`), so the verdict counts which records failed, not only how many; `None`: the
    /// engine lists none drill can read.
    pub failed_ids: Option<Vec<String>>,
    /// Whether the system gives an account at all (a user's engine without `stats` does not:
    /// then waiting and failed are unknown, and what is not delivered counts as lost).
    pub gives_account: bool,
    /// `builtin`, or the user's engine's command line.
    pub system: String,
    /// Broker links a fault was put on that nothing crossed in the whole drill (a Kafka
    /// cluster's `kafka-N` that led no partition the engine wrote to): that cut met nothing.
    pub idle_links: Vec<String>,
    /// The last lines of the engine's log, with its path, when it ran on this host.
    pub engine_log: Option<String>,
    /// The proxy link's counters (with its broker links, for a Kafka-aware link).
    pub link: LinkStatus,
    pub versions: BTreeMap<String, String>,
    /// What the report should say besides the numbers.
    pub notes: Vec<String>,
    /// Milliseconds from the start to the read-back: where a fault still in force ends.
    pub end_ms: u64,
    /// The file the engine tailed: what drill did to it, and the engine's checkpoint.
    pub source: Option<crate::source::SourceFacts>,
    /// The whole drill, in milliseconds.
    pub duration_ms: u64,
}

/// What the links' protocol tap saw of the records, over the whole drill.
#[derive(Debug, Clone, Default)]
pub struct Tapped {
    /// The protocol it read (`MQTT PUBLISH/PUBACK`).
    pub protocol: &'static str,
    /// Ids the engine sent into the link (the link read them), passed on or not.
    pub left: HashSet<String>,
    /// Ids written to the broker, with when each first was (ms since the drill's start).
    pub sent: HashMap<String, u64>,
    /// Ids the broker answered positively.
    pub acked: HashSet<String>,
    /// Data frames in which no id could be read: while there are any, a record not in `sent`
    /// may still have crossed.
    pub unreadable: u64,
    /// Data frames read.
    pub frames: u64,
    /// Whether the tap pairs the engine's statements with their answers (PostgreSQL's): then
    /// `overlapping` is judged.
    pub pairs_answers: bool,
    /// Ids the engine sent again while an attempt carrying them was open on a connection it
    /// still held, in the order seen.
    pub overlapping: Vec<String>,
    /// The one link every connection to the broker crosses, when there is only one (a
    /// Kafka-aware link with its broker links counts as one): only a fault on it can be
    /// judged by what the shared tap saw cross (several links, as to a NATS cluster, share the
    /// tap while each may carry traffic the others do not).
    pub link: Option<String>,
}

impl Tapped {
    /// Whether the tap read every data frame it saw (none seen at all counts: an engine that
    /// never wrote through the link): then a record it never saw go up did not cross it.
    pub fn reads_everything(&self) -> bool {
        self.unreadable == 0
    }
}
