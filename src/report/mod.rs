//! The verdict and the reports: `report.md` (for a person), `report.json`
//! (docs/src/design.md#6-interfaces), `junit.xml` and the timeline chart.
//!
//! One judge, several renderers (nextest's reporter): [`judge`] (`verdict.rs`) turns the
//! runner's [`Facts`](crate::runner::Facts) into a [`Report`]; `markdown.rs`, `json.rs`,
//! `junit.rs` and `svg.rs` render that one value and never read each other's words. The
//! oracle's rules (what a promise excuses, whether a fault bit, a bypass) are `oracle.rs`,
//! the recovery after each heal `recovery.rs`.
//!
//! [`judge`] closes the ledger — `held = delivered + waiting + failed + lost` — from facts the
//! runner collected: *held* is what the source was told was accepted, *delivered* what the
//! reader found at the destination, *waiting* and *failed* what the engine says it still holds,
//! and *lost* what is left. The ledger closes when nothing is lost and the engine's own account
//! agrees. Duplicates are judged against the declared promise (docs/src/design.md#5-verdict):
//! under `at_least_once`, an extra copy is allowed only if it carries the original's write key and
//! that write had a `possibly_sent` attempt or lived through an engine crash.

mod json;
pub mod junit;
mod last_seen;
mod markdown;
pub mod oracle;
mod recovery;
pub mod svg;
mod verdict;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::engine::AttemptCountsView;
use crate::proxy::LinkStatus;
use crate::runner::events::FaultRecord;

pub use crate::check::Check;
pub use last_seen::{Class, LastSeen};
pub use markdown::{markdown, step_summary};
pub use verdict::{headline, judge};

/// The verdict: `"pass"` or `"fail"` in `report.json` (an inconclusive drill fails, with its
/// reasons in `inconclusive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
}

impl Verdict {
    pub fn is_pass(self) -> bool {
        self == Verdict::Pass
    }

    /// `PASS` or `FAIL`, for headings.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
        }
    }
}

/// How fast delivery came back after a fault ended.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryRecord {
    pub fault: String,
    /// When the drill became fault-free after this fault's heal (its own heal, or the end of
    /// a fault that overlapped it).
    pub heal_ms: u64,
    pub first_delivery_ms: Option<u64>,
    pub drained_ms: Option<u64>,
}

/// One second of the drill, for the timeline chart and `report.json`'s `series`.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct SeriesPoint {
    /// The second's start, from the drill's start.
    pub at_ms: u64,
    /// Records the engine had accepted by then (all of them, cumulative).
    pub accepted: u64,
    /// Records whose first copy reached the destination in this second.
    pub delivered: u64,
    /// The engine's backlog as it reported it (`None`: no account, or no answer).
    pub waiting: Option<u64>,
    /// Records the source held that the engine had not read or passed (`None`: no source the
    /// engine pulls from, or no answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unread: Option<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Ledger {
    pub held: u64,
    pub delivered: u64,
    pub waiting: u64,
    pub failed: u64,
    /// On a destination that cannot confirm a write (plain TCP, UDP): what never left the
    /// engine. Elsewhere: what is neither delivered, waiting nor failed.
    pub lost: u64,
    /// Read back at the destination while the engine still reported them waiting: delivered,
    /// the engine has no answer yet. Counted in `delivered`, not in `waiting`, so it never keeps
    /// the ledger from closing.
    pub delivered_unanswered: u64,
    /// Where drill is the destination (HTTP), or the link pairs statements with their answers
    /// (PostgreSQL): writes that arrived while an earlier attempt with their write key was
    /// unanswered and its connection open. `None` where it cannot tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlapping_attempts: Option<u64>,
    /// On a destination that cannot confirm a write: records the engine sent (the OS took
    /// them) that are not at the destination — gone in flight, counted apart from `lost`.
    /// `None` where the destination confirms each write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_unconfirmed_missing: Option<u64>,
    /// Where the engine lists which records failed (drill's engine): those of them found at
    /// the destination — counted in `delivered`, so a failed record excuses no missing one.
    /// `None` where the engine lists none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_but_stored: Option<u64>,
    pub duplicates: u64,
    pub duplicates_same_key: u64,
    pub duplicates_other_key: u64,
    pub duplicates_beyond_promise: u64,
    pub reordered: u64,
    pub unexpected: u64,
    /// Copies that arrived with other bytes than the source sent (torn or truncated).
    pub altered: u64,
    pub ingest_unknown: u64,
    pub recovered: u64,
    /// Records the engine refused at ingest (a full disk): the source keeps them.
    pub ingest_refused: u64,
    /// Records in a source file drill removed or cut before the engine read them: held, never
    /// the engine's to deliver, never lost.
    #[serde(skip_serializing_if = "is_zero")]
    pub destroyed: u64,
}

/// Lost records behind the engine's checkpoint (docs/src/sources.md#checkpoint-ahead-of-the-store).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CheckpointAhead {
    pub count: u64,
    /// The checkpoint as read after the drain: `inode 1234 offset 56789`.
    pub checkpoint: String,
    pub examples: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Serialize)]
pub struct ExpectationResult {
    pub check: Check,
    /// The row's title: the check, with what it is about.
    pub name: String,
    pub expected: String,
    pub actual: String,
    /// The number the check compared (`lost: 12` → 12; a recovery's milliseconds; `None`
    /// where it has none, a ledger that does not close).
    pub count: Option<u64>,
    pub ok: bool,
}

/// `report.json` (docs/src/design.md#6-interfaces), plus a few fields a person needs.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub about: Option<String>,
    pub seed: u64,
    pub verdict: Verdict,
    /// Why the drill proved nothing (empty when it did): each reason fails the verdict.
    pub inconclusive: Vec<String>,
    /// Set when the reader itself may have missed copies: the verdict fails, and the engine was
    /// not judged.
    pub verifier_fault: Option<String>,
    pub headline: String,
    pub ledger: Ledger,
    pub closes: bool,
    /// Records the engine still held when the drain ended, and whether delivery had stalled
    /// (`None`: it held nothing).
    pub undelivered: Option<Undelivered>,
    pub engine_account: Option<EngineAccount>,
    pub expectations: Vec<ExpectationResult>,
    pub faults: Vec<FaultRecord>,
    pub recovery: Vec<RecoveryRecord>,
    pub attempts: AttemptCountsView,
    pub promise: &'static str,
    pub runtime: String,
    pub link: LinkStatus,
    pub versions: BTreeMap<String, String>,
    pub missing_examples: Vec<String>,
    /// Records a source fault destroyed before the engine read them (first ten).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destroyed_examples: Vec<String>,
    /// Lost records the engine's checkpoint had passed: the source will not give them again,
    /// and the engine neither delivered nor holds them (`None`: nothing lost, or no
    /// checkpoint read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_ahead: Option<CheckpointAhead>,
    /// Where the lost records were last seen, by the links' protocol tap (`None`: nothing lost,
    /// or the links carry no tap).
    pub lost_last_seen: Option<LastSeen>,
    /// The engine's first answer when it refused ingest (e.g. disk full).
    pub ingest_refused_example: Option<String>,
    pub duplicate_examples: Vec<String>,
    /// Ids of the first copies that arrived altered.
    pub altered_examples: Vec<String>,
    /// Ids of the first records written again while an attempt of theirs was open.
    pub overlapping_examples: Vec<String>,
    /// Messages at the destination that carried no harness id (shortened).
    pub unexpected_examples: Vec<String>,
    /// Whether the system under test gives an account of what it holds.
    pub gives_account: bool,
    /// `builtin`, or the user's engine's command line.
    pub system: String,
    pub notes: Vec<String>,
    pub duration_ms: u64,
    /// One point per second: accepted, delivered that second, backlog (the chart's data).
    pub series: Vec<SeriesPoint>,
}

/// What the engine still held when the drain ended: never delivered. A stalled engine is told
/// from a slow one by the deliveries in the drain's last [`Undelivered::WINDOW_MS`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Undelivered {
    pub count: u64,
    /// No delivery in the drain's last ten seconds.
    pub stalled: bool,
    /// Records that arrived per second over the drain's last ten seconds.
    pub per_s: f64,
}

impl Undelivered {
    pub const WINDOW_MS: u64 = 10_000;

    /// `the engine still holds them; delivery stalled` or `…; still draining at 120/s`.
    pub fn state(&self) -> String {
        if self.stalled {
            "the engine still holds them; delivery stalled".to_string()
        } else {
            let per_s = if self.per_s < 10.0 {
                format!("{:.1}", self.per_s)
            } else {
                format!("{:.0}", self.per_s)
            };
            format!("the engine still holds them; still draining at {per_s}/s")
        }
    }
}

/// What the engine said of itself at the end.
#[derive(Debug, Clone, Serialize)]
pub struct EngineAccount {
    pub held: Option<u64>,
    pub delivered: Option<u64>,
    pub waiting: u64,
    pub failed: u64,
}

impl Report {
    /// `H held = D delivered + W waiting + F failed + L lost`; on a destination that cannot
    /// confirm, `… + U sent unconfirmed and missing + L lost before sending`.
    pub fn ledger_line(&self) -> String {
        let l = &self.ledger;
        // After the drain, what still waits was never delivered: the line says so.
        let waiting = match l.waiting {
            0 => "0 waiting".to_string(),
            w => format!("{w} waiting (never delivered)"),
        };
        let mut line = match l.sent_unconfirmed_missing {
            Some(u) => format!(
                "{} held = {} delivered + {waiting} + {} failed + {u} sent unconfirmed and missing + {} lost before sending",
                l.held, l.delivered, l.failed, l.lost
            ),
            None => format!(
                "{} held = {} delivered + {waiting} + {} failed + {} lost",
                l.held, l.delivered, l.failed, l.lost
            ),
        };
        if l.destroyed > 0 {
            line.push_str(&format!(" + {} destroyed by the source fault", l.destroyed));
        }
        if l.delivered_unanswered > 0 {
            line.push_str(&format!(
                "; {} of the delivered with no answer yet (the engine still reports them waiting)",
                l.delivered_unanswered
            ));
        }
        line
    }
}

/// Writes `report.md`, `report.json`, `junit.xml` and `timeline.svg` into `dir`; returns their
/// paths.
pub fn write(report: &Report, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let md = dir.join("report.md");
    std::fs::write(&md, markdown(report))?;
    let json = dir.join("report.json");
    std::fs::write(&json, json::render(report)?)?;
    let junit_path = dir.join("junit.xml");
    let xml = junit::render(&[junit::suite(report, &md)]).map_err(std::io::Error::other)?;
    std::fs::write(&junit_path, xml)?;
    let svg_path = dir.join("timeline.svg");
    std::fs::write(&svg_path, svg::timeline(report))?;
    Ok(vec![md, json, junit_path, svg_path])
}
