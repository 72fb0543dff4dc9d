//! What a scenario file says, before anyone has checked that it makes sense.
//!
//! These `Raw*` types mirror the YAML one to one: serde reads them (`deny_unknown_fields`, so a
//! misspelled field is an error with its line and column), `drill schema` is generated from
//! them, and [`Spanned`] keeps the location of the values a later check may refuse. They hold
//! no defaults and no rules: what a field means, which fields go together and what is missing
//! is decided in `validate.rs`. The raw types of `system.command` live with that section in
//! `command.rs`; `destination:` is the destination kinds' own (`dest::RawDestination`).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::ProcessAction;
use super::command;
use crate::dest::RawDestination;
use crate::promise::{Order, Promise};
use crate::proxy::{Direction, Fault};
use crate::units::{Bound, Dur, Rate};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    #[schemars(with = "String")]
    pub(super) name: Spanned<String>,
    #[serde(default)]
    pub(super) about: Option<String>,
    #[serde(default)]
    pub(super) seed: Option<u64>,
    #[schemars(schema_with = "crate::dest::schema")]
    pub(super) destination: RawDestination,
    #[serde(default)]
    pub(super) system: Option<RawSystem>,
    pub(super) workload: RawWorkload,
    #[serde(default)]
    #[schemars(with = "Vec<RawFault>")]
    pub(super) faults: Vec<Spanned<RawFault>>,
    #[serde(default)]
    pub(super) expect: Option<RawExpect>,
    #[serde(default)]
    pub(super) drain_timeout: Option<Dur>,
    #[serde(default)]
    pub(super) tags: Vec<String>,
    /// The folder `{scenario_dir}` and `system.files` templates are relative to, itself
    /// relative to this file's folder (default: this file's folder). `drill explore` sets it
    /// in the scenarios it writes elsewhere, so they find what the base scenario refers to.
    #[serde(default)]
    pub(super) scenario_dir: Option<String>,
    /// Links served elsewhere, by link name: `{ mqtt: { remote: "http://HOST:8474", token_env:
    /// NAME } }` (see `links.rs`).
    #[serde(default)]
    #[schemars(with = "std::collections::BTreeMap<String, RawLink>")]
    pub(super) links: BTreeMap<String, Spanned<RawLink>>,
}

/// A link served by a `drill proxy` on another host.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLink {
    /// The proxy's control API, `http://HOST:PORT`.
    #[schemars(with = "String")]
    pub(super) remote: Spanned<String>,
    /// The environment variable holding the proxy's token (its `--token`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub(super) token_env: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSystem {
    #[serde(default)]
    #[schemars(with = "Option<RawBuiltin>")]
    pub(super) builtin: Option<Spanned<RawBuiltin>>,
    /// A user's engine: its argv (see [`command`]).
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub(super) command: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    #[schemars(with = "std::collections::BTreeMap<String, String>")]
    pub(super) env: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    #[schemars(with = "std::collections::BTreeMap<String, String>")]
    pub(super) files: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    #[schemars(with = "Option<command::RawIngest>")]
    pub(super) ingest: Option<Spanned<command::RawIngest>>,
    #[serde(default)]
    #[schemars(with = "Option<command::RawReady>")]
    pub(super) ready: Option<Spanned<command::RawReady>>,
    #[serde(default)]
    #[schemars(with = "Option<command::RawStats>")]
    pub(super) stats: Option<Spanned<command::RawStats>>,
    #[serde(default)]
    #[schemars(with = "Option<command::RawWriteKey>")]
    pub(super) write_key: Option<Spanned<command::RawWriteKey>>,
    #[serde(default)]
    pub(super) stop_grace: Option<Dur>,
    /// A `drill agent`'s API, `http://HOST:PORT`: the user's engine runs on its host.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub(super) agent: Option<Spanned<String>>,
    /// The environment variable holding the agent's token (its `--token`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub(super) token_env: Option<Spanned<String>>,
    /// What a command engine declares (the built-in engine's is under `builtin`).
    #[serde(default)]
    #[schemars(with = "Option<Promise>")]
    pub(super) promise: Option<Spanned<Promise>>,
}

#[derive(Debug, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBuiltin {
    #[serde(default)]
    pub(super) order: Option<Order>,
    #[serde(default)]
    #[schemars(with = "Option<Promise>")]
    pub(super) promise: Option<Spanned<Promise>>,
    #[serde(default)]
    pub(super) keepalive: Option<Dur>,
    #[serde(default)]
    pub(super) answer_timeout: Option<Dur>,
    #[serde(default)]
    pub(super) window: Option<usize>,
    #[serde(default)]
    pub(super) refusals: Option<RawRefusals>,
    /// The record log starts a new segment file once the active one is this long (`64MB`
    /// unless given): small segments put directory changes on the timeline.
    #[serde(default)]
    #[schemars(with = "Option<crate::units::Size>")]
    pub(super) segment: Option<Spanned<crate::units::Size>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRefusals {
    pub(super) max: u32,
    /// `[first, cap]`, e.g. `[1s, 60s]`.
    pub(super) backoff: [Dur; 2],
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorkload {
    #[schemars(with = "Rate")]
    pub(super) rate: Spanned<Rate>,
    #[schemars(with = "Dur")]
    pub(super) duration: Spanned<Dur>,
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub(super) keys: Option<Spanned<u32>>,
    #[serde(default)]
    #[schemars(with = "Option<usize>")]
    pub(super) payload_bytes: Option<Spanned<usize>>,
    /// Record indices (0-based, in generation order) the destination will refuse: their
    /// payload is made larger than the broker's message size limit.
    #[serde(default)]
    #[schemars(with = "Vec<u64>")]
    pub(super) poison: Option<Spanned<Vec<u64>>>,
}

// One entry of `faults:`, link and process faults alike; which fields each kind takes is
// decided in `validate.rs`. (A `///` here would become the schema's description.)
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFault {
    pub(super) at: Dur,
    #[serde(default)]
    pub(super) link: Option<String>,
    #[serde(default)]
    pub(super) fault: Option<Fault>,
    #[serde(default)]
    pub(super) direction: Option<Direction>,
    #[serde(default, rename = "for")]
    pub(super) for_: Option<Dur>,
    #[serde(default)]
    pub(super) target: Option<String>,
    #[serde(default)]
    pub(super) action: Option<ProcessAction>,
    #[serde(default)]
    pub(super) restart_after: Option<Dur>,
    #[serde(default)]
    pub(super) wipe_data: Option<bool>,
    #[serde(default)]
    pub(super) latency: Option<Dur>,
    #[serde(default)]
    pub(super) jitter: Option<Dur>,
    #[serde(default)]
    pub(super) bytes_per_s: Option<u64>,
    /// `loss` (datagram links only): the fraction of datagrams dropped, above 0 and at most 1.
    #[serde(default)]
    pub(super) loss: Option<f64>,
    #[serde(default)]
    pub(super) repeat: Option<u32>,
    #[serde(default)]
    pub(super) every: Option<Dur>,
    #[serde(default)]
    pub(super) down_for: Option<Dur>,
    /// `target: broker`: which node — `leader` (where the stream's leader is at that instant)
    /// or a node number from 1.
    #[serde(default)]
    pub(super) node: Option<String>,
    /// A fault that starts once the workload has ended (during the drain): said on purpose.
    #[serde(default)]
    pub(super) after_workload: Option<bool>,
    /// `power_cut`: the last unsynced write of each file lands torn (its final 512-byte sector
    /// reads as zeros) instead of every unsynced write being lost.
    #[serde(default)]
    pub(super) torn: Option<bool>,
    /// `power_cut`: the cut also forgets directory changes (create, rename, unlink) not made
    /// durable — `posix`: those whose directory was not fsynced after them; `ext4`: those no
    /// fsync at all came after.
    #[serde(default)]
    pub(super) dirents: Option<crate::powerfs::Dirents>,
    /// `target: destination`: answer every write (and probe) with this HTTP status (4xx or 5xx)
    /// for `for`; nothing is stored.
    #[serde(default)]
    #[schemars(with = "Option<u16>")]
    pub(super) answer: Option<Spanned<u16>>,
    /// `target: destination`, with `answer: 429` or `503`: the `Retry-After` it sends.
    #[serde(default)]
    pub(super) retry_after: Option<Dur>,
    /// `target: destination`: store each write at once and answer it this late, for `for`.
    #[serde(default)]
    #[schemars(with = "Option<Dur>")]
    pub(super) answer_after: Option<Spanned<Dur>>,
    /// `target: destination`: "yes, but" — refuse a fraction of the records written with a
    /// status while the answer as a whole says yes (per-item errors in a `_bulk` answer), for
    /// `for`. Refused records are never stored.
    #[serde(default)]
    #[schemars(with = "Option<RawReject>")]
    pub(super) reject: Option<Spanned<RawReject>>,
    /// `target: destination`: the broker put in a state for `for` (amqp: `alarm` — publishers
    /// blocked; `nack` — every publish nacked; `queue_deleted` — the drill's queue gone).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub(super) broker: Option<Spanned<String>>,
    /// `bad_certificate`: which certificate the link presents: `other_ca` (default: one from a
    /// CA nobody trusts) or `expired` (the broker's own, from the drill's CA, expired).
    #[serde(default)]
    pub(super) certificate: Option<CertificateChoice>,
    /// `power_cut`: armed at `at`, power goes at the `nth` `op` (`write`, `fsync`,
    /// `fdatasync`) on a file whose name matches `path` (a glob).
    #[serde(default)]
    pub(super) crash_at: Option<RawCrashAt>,
    /// `target: engine`: a fault of the engine's disk (its data directory, on drill's
    /// power-cut filesystem) instead of its process: `io_error`.
    #[serde(default)]
    pub(super) disk: Option<DiskFaultKind>,
    /// `disk: io_error`: the operation that fails — `fsync` (fdatasync too), `write`, `read`,
    /// `open` (a create too) or `rename`.
    #[serde(default)]
    pub(super) op: Option<crate::powerfs::IoOp>,
    /// `disk: io_error`: the files it acts on, a glob over the name (or over the path below
    /// the data directory when it holds a `/`).
    #[serde(default)]
    pub(super) path: Option<String>,
    /// `disk: io_error`: `EIO` (default), `ENOSPC` or `EROFS`.
    #[serde(default)]
    pub(super) errno: Option<crate::powerfs::IoErrno>,
    /// `disk: io_error`: only the `nth` matching operation from `at` on fails (once); without
    /// it every matching one fails, for `for` (or to the end of the drill).
    #[serde(default)]
    pub(super) nth: Option<u64>,
    /// `disk: slow`: how late each matching operation answers (it takes effect at once).
    #[serde(default)]
    pub(super) delay: Option<Dur>,
    /// `target: engine`: a fault of the engine's wall clock instead of its process: `jump` or
    /// `drift`.
    #[serde(default)]
    pub(super) clock: Option<ClockFaultKind>,
    /// `clock: jump`: by how much, signed: `+2h`, `-10m`, `+90s` (whole seconds); `clock:
    /// drift`: how much the clock gains (or, negative, loses) over `for`.
    #[serde(default)]
    pub(super) by: Option<String>,
}

/// `clock:` of an engine fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum ClockFaultKind {
    /// The engine's wall clock steps by `by` and stays there (its monotonic clock runs on).
    Jump,
    /// The engine's wall clock runs fast (or slow) and gains `by` over `for`: drill steps it a
    /// little every second.
    Drift,
}

/// `disk:` of an engine fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum DiskFaultKind {
    /// Operations on matching files answer an error (Linux's semantics after a failed fsync).
    IoError,
    /// Matching `fsync`s or `write`s answer `delay` late.
    Slow,
}

/// `certificate:` of a `bad_certificate` fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum CertificateChoice {
    /// A certificate from a CA nobody trusts (a rotation to the wrong certificate).
    OtherCa,
    /// The broker's own certificate, from the drill's CA, expired (a renewal that never came).
    Expired,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCrashAt {
    pub(super) op: crate::powerfs::CrashOp,
    pub(super) path: String,
    #[serde(default)]
    pub(super) nth: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExpect {
    /// Records neither delivered, held, failed nor (where the destination cannot confirm)
    /// sent: 0 unless said (`any` turns the check off).
    #[serde(default)]
    pub(super) lost: Option<Bound>,
    /// Records the engine still holds when the drain ends (never delivered): 0 unless said;
    /// `any` for a destination that is unreachable on purpose.
    #[serde(default)]
    pub(super) undelivered: Option<Bound>,
    /// Where drill is the destination (HTTP), or the link pairs statements with their answers
    /// (PostgreSQL): writes that arrived while an earlier attempt with the same write key was
    /// still open: 0 unless said.
    #[serde(default)]
    pub(super) overlapping_attempts: Option<Bound>,
    /// A destination that cannot confirm a write (syslog over plain TCP or UDP): records lost
    /// before they left the engine. What was sent without confirmation and is missing is
    /// counted apart; on such a destination `lost` means the same.
    #[serde(default)]
    #[schemars(with = "Option<u64>")]
    pub(super) lost_before_sending: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) duplicates: Option<u64>,
    #[serde(default)]
    pub(super) reordered: Option<u64>,
    #[serde(default)]
    pub(super) ledger: Option<LedgerExpectation>,
    #[serde(default)]
    pub(super) recovery_within: Option<Dur>,
    #[serde(default)]
    pub(super) failed: Option<u64>,
    #[serde(default)]
    pub(super) unexpected: Option<u64>,
    #[serde(default)]
    pub(super) altered: Option<u64>,
    #[serde(default)]
    pub(super) not_accepted: Option<u64>,
    #[serde(default)]
    pub(super) drain_within: Option<Dur>,
    #[serde(default)]
    pub(super) max_copies: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum LedgerExpectation {
    Closes,
}

/// `reject:` of a destination fault.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReject {
    /// The share of records refused, above 0 and at most 1 (e.g. 0.1): every record whose
    /// turn it is, counted in the order they arrive, so exactly this share is refused.
    pub(super) fraction: f64,
    /// HTTP: what each refused record is answered: 429, 500 or 503 (rejected for now) or 400,
    /// 413 or 422 (this record is refused).
    pub(super) status: Option<u16>,
    /// MQTT 5: the PUBACK reason code each refused publish is answered: 0x97 (quota exceeded:
    /// rejected for now) or 0x80, 0x83, 0x87, 0x90, 0x99 (this record is refused).
    pub(super) reason: Option<u16>,
}
