//! The verdict and the reports: `report.md` (for a person) and `report.json` (DESIGN.md §6).
//!
//! [`judge`] closes the ledger — `held = delivered + waiting + failed + lost` — from facts the
//! runner collected: *held* is what the source was told was accepted, *delivered* what the
//! reader found at the destination, *waiting* and *failed* what the engine says it still holds,
//! and *lost* what is left. The ledger closes when nothing is lost and the engine's own account
//! agrees. Duplicates are judged against the declared promise (DESIGN.md §5): under
//! `at_least_once`, an extra copy is allowed only if it carries the original's write key and
//! that write had a `possibly_sent` attempt or lived through an engine crash.

pub mod junit;
pub mod oracle;
pub mod svg;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::engine::AttemptCountsView;
use crate::proxy::LinkStatus;
use crate::scenario::Plan;
use crate::sut::Account;
use crate::verify::{Received, Reconciliation};
use crate::workload::Sent;

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

/// A fault as it was applied (times relative to the drill's start).
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    #[serde(skip)]
    pub index: usize,
    pub at_ms: u64,
    pub target: String,
    pub fault: String,
    pub direction: Option<String>,
    pub until_ms: Option<u64>,
    /// Whether the fault met the engine, when the runner saw it directly (a `strand` bites
    /// the connections open at its instant); `None`: judged from the records.
    #[serde(skip)]
    pub bit: Option<bool>,
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
}

/// Everything the runner observed; [`judge`] turns it into a verdict.
#[derive(Debug, Clone)]
pub struct Facts {
    pub plan: Plan,
    pub seed: u64,
    pub runtime: String,
    pub reconciliation: Reconciliation,
    /// What the declared promise excuses (DESIGN.md §5, see [`oracle::allowance`]).
    pub allowance: oracle::Allowance,
    /// Why the drill proved nothing, if it did not: a fault that met no traffic, records that
    /// went around the proxy. Any reason makes the verdict fail.
    pub inconclusive: Vec<String>,
    /// How long the drain took after the workload and the timeline (until the engine said
    /// nothing waits, or arrivals stopped, and the reader caught up).
    pub drain_ms: u64,
    /// The system's own account at the end (`None`: it gave none, or did not answer).
    pub engine: Option<Account>,
    /// Whether the system gives an account at all (a user's engine without `stats` does not:
    /// then waiting and failed are unknown, and what is not delivered counts as lost).
    pub gives_account: bool,
    /// `builtin`, or the user's engine's command line.
    pub system: String,
    /// Messages at the destination that carried no harness id (shortened).
    pub unexpected_examples: Vec<String>,
    /// One point per second of the drill.
    pub series: Vec<SeriesPoint>,
    pub faults: Vec<FaultRecord>,
    pub recovery: Vec<RecoveryRecord>,
    pub link: LinkStatus,
    pub versions: BTreeMap<String, String>,
    pub notes: Vec<String>,
    pub verifier_fault: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Ledger {
    pub held: u64,
    pub delivered: u64,
    pub waiting: u64,
    pub failed: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub duplicates_same_key: u64,
    pub duplicates_other_key: u64,
    pub duplicates_beyond_promise: u64,
    pub reordered: u64,
    pub unexpected: u64,
    pub ingest_unknown: u64,
    pub recovered: u64,
    /// Records the engine refused at ingest (a full disk): the source keeps them.
    pub ingest_refused: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExpectationResult {
    pub name: String,
    pub expected: String,
    pub actual: String,
    pub ok: bool,
}

/// `report.json` (DESIGN.md §6), plus a few fields a person needs.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub about: Option<String>,
    pub seed: u64,
    pub verdict: Verdict,
    /// Why the drill proved nothing (empty when it did): each reason fails the verdict.
    pub inconclusive: Vec<String>,
    pub headline: String,
    pub ledger: Ledger,
    pub closes: bool,
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
    /// The engine's first answer when it refused ingest (e.g. disk full).
    pub ingest_refused_example: Option<String>,
    pub duplicate_examples: Vec<String>,
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

/// What the engine said of itself at the end.
#[derive(Debug, Clone, Serialize)]
pub struct EngineAccount {
    pub held: Option<u64>,
    pub delivered: Option<u64>,
    pub waiting: u64,
    pub failed: u64,
}

/// Extra copies the declared promise allows: same write key as the original (the one the
/// ingest answered, else the first copy's), and the record is in `excused` — its write had a
/// `possibly_sent` attempt, or it was accepted before an engine crash (ids).
pub fn allowed_duplicates(sent: &Sent, received: &Received, excused: &HashSet<&str>) -> u64 {
    let keys: HashMap<&str, Option<&str>> = sent
        .accepted()
        .map(|(r, k, _)| (r.id.as_str(), k))
        .collect();
    let mut first: HashMap<&str, Option<&str>> = HashMap::new();
    let mut allowed = 0;
    for a in &received.arrivals {
        let Some(id) = a.id.as_deref() else { continue };
        let Some(&key) = keys.get(id) else { continue };
        match first.get(id) {
            None => {
                first.insert(id, key.or(a.write_key.as_deref()));
            }
            Some(original) => {
                let same = original.is_some() && a.write_key.as_deref() == *original;
                if same && excused.contains(id) {
                    allowed += 1;
                }
            }
        }
    }
    allowed
}

/// For each fault that ended: from the first fault-free instant after its heal to the first
/// delivery, and to every record accepted before then having arrived.
pub fn recovery(faults: &[FaultRecord], sent: &Sent, received: &Received) -> Vec<RecoveryRecord> {
    let mut first_arrival: HashMap<&str, Duration> = HashMap::new();
    for a in &received.arrivals {
        if let Some(id) = a.id.as_deref() {
            first_arrival.entry(id).or_insert(a.at);
        }
    }
    // Recovery starts when the drill is fault-free: a heal while another fault is still in
    // force (an engine restarted during a cut) is measured from the end of that fault.
    let fault_free_from = |mut t: u64| -> Option<u64> {
        loop {
            let mut moved = false;
            for f in faults {
                if f.at_ms <= t && f.until_ms.is_none_or(|u| u > t) {
                    t = f.until_ms?;
                    moved = true;
                }
            }
            if !moved {
                return Some(t);
            }
        }
    };
    faults
        .iter()
        .filter_map(|f| f.until_ms.and_then(fault_free_from).map(|heal| (f, heal)))
        .map(|(f, heal)| {
            let heal_d = Duration::from_millis(heal);
            let first = received
                .arrivals
                .iter()
                .map(|a| a.at)
                .filter(|at| *at >= heal_d)
                .min();
            let mut drained = Some(heal_d);
            for (r, _, at) in sent.accepted() {
                if at > heal_d {
                    continue;
                }
                match first_arrival.get(r.id.as_str()) {
                    Some(t) => drained = drained.map(|d| d.max(*t)),
                    None => {
                        drained = None;
                        break;
                    }
                }
            }
            RecoveryRecord {
                fault: format!(
                    "{} {}{}",
                    f.target,
                    f.fault,
                    f.direction
                        .as_ref()
                        .map(|d| format!(" {d}"))
                        .unwrap_or_default()
                ),
                heal_ms: heal,
                first_delivery_ms: first.map(|d| d.as_millis() as u64),
                drained_ms: drained.map(|d| d.as_millis() as u64),
            }
        })
        .collect()
}

/// Closes the ledger and checks every expectation.
pub fn judge(facts: &Facts) -> Report {
    let r = &facts.reconciliation;
    let (waiting, failed) = facts
        .engine
        .as_ref()
        .map(|s| (s.waiting, s.failed))
        .unwrap_or((0, 0));
    let held = r.accepted;
    let delivered = r.delivered;
    // What is neither at the destination nor still held by the engine is lost.
    let lost = r.missing.saturating_sub(waiting + failed);
    let (lost_beyond_promise, duplicates_beyond_promise) = oracle::beyond(r, facts.allowance, lost);
    let ledger = Ledger {
        held,
        delivered,
        waiting,
        failed,
        lost,
        duplicates: r.duplicates,
        duplicates_same_key: r.duplicates_same_key,
        duplicates_other_key: r.duplicates_other_key,
        duplicates_beyond_promise,
        reordered: r.reordered,
        unexpected: r.unexpected,
        ingest_unknown: r.ingest_unknown,
        recovered: r.recovered,
        ingest_refused: r.ingest_refused,
    };
    let engine_account = facts.engine.as_ref().map(|s| EngineAccount {
        held: s.held,
        delivered: s.delivered,
        waiting: s.waiting,
        failed: s.failed,
    });
    // The ledger closes when the equation holds with nothing lost, and the engine's own
    // account agrees with what the source and the destination saw (as far as it gives one:
    // a user's engine may report only waiting and failed, or nothing).
    let engine_agrees = match &facts.engine {
        Some(s) => {
            let held_agrees = s.held.is_none_or(|h| h == held + r.recovered);
            let sums = match (s.held, s.delivered) {
                (Some(h), Some(d)) => d + s.waiting + s.failed == h,
                _ => true,
            };
            held_agrees && sums
        }
        None => !facts.gives_account,
    };
    let closes = lost == 0 && delivered + waiting + failed == held && engine_agrees;

    let e = &facts.plan.expect;
    let mut expectations = Vec::new();
    let mut check = |name: &str, expected: String, actual: String, ok: bool| {
        expectations.push(ExpectationResult {
            name: name.to_string(),
            expected,
            actual,
            ok,
        })
    };
    if let Some(n) = e.lost {
        let name = if facts.allowance.missing > 0 {
            format!("lost beyond {}", facts.plan.engine.promise.name())
        } else {
            "lost".to_string()
        };
        check(
            &name,
            n.to_string(),
            lost_beyond_promise.to_string(),
            lost_beyond_promise <= n,
        );
    }
    // Data at the destination that the engine never accepted (a probe that wrote, a record
    // the source was told was refused) fails the drill unless the scenario allows some.
    if let Some(n) = e.unexpected {
        check(
            "unexpected",
            n.to_string(),
            r.unexpected.to_string(),
            r.unexpected <= n,
        );
    }
    // Set aside: exactly as many as the destination refused (drill's brokers refuse only the
    // planted poison records), so drops reported as "failed" do not pass.
    if let Some(n) = e.failed {
        check("failed", format!("= {n}"), failed.to_string(), failed == n);
    }
    if let Some(n) = e.not_accepted {
        check(
            "ingests not accepted",
            n.to_string(),
            r.not_accepted.to_string(),
            r.not_accepted <= n,
        );
    }
    if let Some(n) = e.max_copies {
        check(
            "copies of one record",
            format!("≤ {n}"),
            r.max_copies.to_string(),
            r.max_copies <= n,
        );
    }
    if let Some(bound) = e.drain_within {
        check(
            "drain",
            format!("≤ {} ms", bound.as_millis()),
            format!("{} ms", facts.drain_ms),
            u128::from(facts.drain_ms) <= bound.as_millis(),
        );
    }
    if let Some(n) = e.duplicates {
        check(
            &format!("duplicates beyond {}", facts.plan.engine.promise.name()),
            n.to_string(),
            duplicates_beyond_promise.to_string(),
            duplicates_beyond_promise <= n,
        );
    }
    if let Some(n) = e.reordered {
        check(
            "reordered",
            n.to_string(),
            r.reordered.to_string(),
            r.reordered <= n,
        );
    }
    if e.ledger_closes {
        check(
            "ledger",
            "closes".to_string(),
            if closes { "closes" } else { "does not close" }.to_string(),
            closes,
        );
    }
    if let Some(bound) = e.recovery_within {
        for rec in &facts.recovery {
            let took = rec.first_delivery_ms.map(|f| f.saturating_sub(rec.heal_ms));
            check(
                &format!("recovery after {}", rec.fault),
                format!("≤ {} ms", bound.as_millis()),
                took.map(|t| format!("{t} ms"))
                    .unwrap_or_else(|| "no delivery".to_string()),
                took.is_some_and(|t| u128::from(t) <= bound.as_millis()),
            );
        }
    }
    let mut all_ok = expectations.iter().all(|x| x.ok) && facts.inconclusive.is_empty();
    let mut notes = facts.notes.clone();
    if let Some(n) = facts.engine.as_ref().map(|a| a.errors).filter(|n| *n > 0) {
        notes.push(format!("the engine reported {n} failed writes of its attempt journal, delivery marks or failed store (see its log): the verdict's allowance for extra copies may be wrong"));
    }
    if facts.verifier_fault {
        all_ok = false;
        notes.push("the verdict is fail because the reader itself failed; fix the verifier, the engine was not judged".to_string());
    }
    let mut headline = headline(lost, &expectations, facts.verifier_fault);
    if let Some(first) = facts.inconclusive.first() {
        headline = format!("Inconclusive: {first}. {headline}");
    }
    Report {
        scenario: facts.plan.name.clone(),
        about: facts.plan.about.clone(),
        seed: facts.seed,
        verdict: if all_ok { Verdict::Pass } else { Verdict::Fail },
        inconclusive: facts.inconclusive.clone(),
        headline,
        ledger,
        closes,
        engine_account,
        expectations,
        faults: facts.faults.clone(),
        recovery: facts.recovery.clone(),
        attempts: facts
            .engine
            .as_ref()
            .and_then(|s| s.attempts)
            .unwrap_or_default(),
        promise: facts.plan.engine.promise.name(),
        runtime: facts.runtime.clone(),
        link: facts.link.clone(),
        versions: facts.versions.clone(),
        missing_examples: r.missing_examples.clone(),
        ingest_refused_example: r.ingest_refused_example.clone(),
        duplicate_examples: r.duplicate_examples.clone(),
        unexpected_examples: facts.unexpected_examples.clone(),
        series: facts.series.clone(),
        gives_account: facts.gives_account,
        system: facts.system.clone(),
        notes,
        duration_ms: facts.duration_ms,
    }
}

/// The failed expectations first, then what was lost: "recovery after link mqtt swallow both
/// 2 ms (expected ≤ 1 ms); nothing lost."
pub fn headline(lost: u64, expectations: &[ExpectationResult], verifier_fault: bool) -> String {
    let losses = match lost {
        0 => "nothing lost".to_string(),
        1 => "1 record lost".to_string(),
        n => format!("{n} records lost"),
    };
    let mut parts: Vec<String> = Vec::new();
    if verifier_fault {
        parts.push("the reader itself failed (a verifier fault, not engine loss)".to_string());
    }
    parts.extend(
        expectations
            .iter()
            .filter(|x| !x.ok && !x.name.starts_with("lost"))
            .map(|x| {
                if x.expected == "closes" {
                    format!("{} {}", x.name, x.actual)
                } else {
                    format!("{} {} (expected {})", x.name, x.actual, x.expected)
                }
            }),
    );
    parts.push(losses);
    let mut text = parts.join("; ");
    if let Some(first) = text.get(..1) {
        text = first.to_uppercase() + &text[1..];
    }
    text + "."
}

/// The tiles (one table row of the ledger's counts) and the ledger line. Duplicates are the
/// total, or (for the job summary) only those beyond the declared promise.
fn tiles(md: &mut String, report: &Report, beyond_promise: bool) {
    let l = &report.ledger;
    let (heading, duplicates) = if beyond_promise {
        (
            format!("duplicates beyond `{}`", report.promise),
            l.duplicates_beyond_promise,
        )
    } else {
        ("duplicates".to_string(), l.duplicates)
    };
    let _ = writeln!(
        md,
        "| held | delivered | waiting | failed | lost | {heading} | reordered |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(
        md,
        "| {} | {} | {} | {} | **{}** | {duplicates} | {} |",
        l.held, l.delivered, l.waiting, l.failed, l.lost, l.reordered
    );
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "Ledger: `{}` — {}.",
        report.ledger_line(),
        if report.closes {
            "closes"
        } else {
            "**does not close**"
        }
    );
}

/// What `GITHUB_STEP_SUMMARY` gets for one drill: the headline, the tiles, the ledger line and
/// the chart (as a link into the report folder).
pub fn step_summary(report: &Report, dir: &Path) -> String {
    let mut md = String::new();
    let verdict = if report.verdict.is_pass() {
        "✅ PASS"
    } else {
        "❌ FAIL"
    };
    let _ = writeln!(
        md,
        "### drill {}: {verdict} — {}",
        report.scenario, report.headline
    );
    let _ = writeln!(md);
    tiles(&mut md, report, true);
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "Report and timeline chart: `{}` (`report.md`, `timeline.svg`).",
        dir.display()
    );
    let _ = writeln!(md);
    md
}

fn secs(ms: u64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

impl Report {
    /// `H held = D delivered + W waiting + F failed + L lost`.
    pub fn ledger_line(&self) -> String {
        let l = &self.ledger;
        format!(
            "{} held = {} delivered + {} waiting + {} failed + {} lost",
            l.held, l.delivered, l.waiting, l.failed, l.lost
        )
    }
}

/// Renders `report.md`.
pub fn markdown(report: &Report) -> String {
    let l = &report.ledger;
    let mut md = String::new();
    let _ = writeln!(md, "# drill report: {}", report.scenario);
    let _ = writeln!(md);
    if let Some(about) = &report.about {
        let _ = writeln!(md, "{about}");
        let _ = writeln!(md);
    }
    let verdict = report.verdict.word();
    let _ = writeln!(md, "## {verdict} — {}", report.headline);
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "![timeline: delivered per second and backlog, faults shaded](timeline.svg)"
    );
    let _ = writeln!(md);
    tiles(&mut md, report, false);
    let known = |n: Option<u64>| n.map_or("?".to_string(), |n| n.to_string());
    match &report.engine_account {
        Some(e) => {
            let _ = writeln!(
                md,
                "The engine's own account: {} held = {} delivered + {} waiting + {} failed.",
                known(e.held),
                known(e.delivered),
                e.waiting,
                e.failed
            );
        }
        None if !report.gives_account => {
            let _ = writeln!(
                md,
                "The engine gave no account (no `stats` in the scenario): waiting and failed are unknown, so every record held and not delivered after the drain counts as lost."
            );
        }
        None => {
            let _ = writeln!(md, "The engine did not answer for its account at the end.");
        }
    }
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "Duplicates: {} extra copies ({} with the original's write key, {} without); {} beyond what `{}` allows. Unexpected: {}. Ingests with a lost answer: {} ({} found at the destination).",
        l.duplicates,
        l.duplicates_same_key,
        l.duplicates_other_key,
        l.duplicates_beyond_promise,
        report.promise,
        l.unexpected,
        l.ingest_unknown,
        l.recovered
    );
    if l.ingest_refused > 0 {
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "Ingest refused by the engine: {} records (not part of `held`; the source keeps them){}.",
            l.ingest_refused,
            report
                .ingest_refused_example
                .as_deref()
                .map(|w| format!(". Its answer: \"{}\"", w.trim()))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(md);
    if !report.inconclusive.is_empty() {
        let _ = writeln!(md, "## Inconclusive");
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "This drill proved nothing about what follows, so its verdict is FAIL whatever the counts say:"
        );
        let _ = writeln!(md);
        for why in &report.inconclusive {
            let _ = writeln!(md, "- {why}");
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "## Expectations");
    let _ = writeln!(md);
    let _ = writeln!(md, "| expectation | expected | actual | |");
    let _ = writeln!(md, "|---|---|---|---|");
    for x in &report.expectations {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            x.name,
            x.expected,
            x.actual,
            if x.ok { "ok" } else { "**FAILED**" }
        );
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "## Fault timeline");
    let _ = writeln!(md);
    if report.faults.is_empty() {
        let _ = writeln!(md, "No faults.");
    } else {
        let _ = writeln!(md, "| at | until | target | fault |");
        let _ = writeln!(md, "|---:|---:|---|---|");
        for f in &report.faults {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {}{} |",
                secs(f.at_ms),
                f.until_ms.map(secs).unwrap_or_else(|| "—".to_string()),
                f.target,
                f.fault,
                f.direction
                    .as_ref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            );
        }
    }
    if !report.recovery.is_empty() {
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "| recovery after | healed at | first delivery | backlog drained |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|");
        for r in &report.recovery {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                r.fault,
                secs(r.heal_ms),
                r.first_delivery_ms
                    .map(|f| format!("+{} ms", f.saturating_sub(r.heal_ms)))
                    .unwrap_or_else(|| "none".to_string()),
                r.drained_ms
                    .map(|f| format!("+{} ms", f.saturating_sub(r.heal_ms)))
                    .unwrap_or_else(|| "not drained".to_string())
            );
        }
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "## Attempts and link");
    let _ = writeln!(md);
    let a = &report.attempts;
    let _ = writeln!(
        md,
        "Attempts: {} delivered, {} refused, {} possibly sent, {} sent unconfirmed (promise: `{}`).",
        a.delivered, a.refused, a.possibly_sent, a.sent_unconfirmed, report.promise
    );
    let k = &report.link;
    let _ = writeln!(
        md,
        "Link `{}` ({} → {}): {} connections accepted, {} reset; {} bytes up, {} down; {} bytes swallowed up, {} down.",
        k.name,
        k.listen,
        k.upstream,
        k.connections_accepted,
        k.connections_reset,
        k.bytes_upstream,
        k.bytes_downstream,
        k.bytes_swallowed_upstream,
        k.bytes_swallowed_downstream
    );
    if !k.broker_links.is_empty() {
        let _ = writeln!(
            md,
            "Those counts include its broker links (Kafka-aware; {} answers rewritten): {}.",
            k.answers_rewritten,
            k.broker_links.join(", ")
        );
    }
    if !report.missing_examples.is_empty() {
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "Missing (first {}): {}",
            report.missing_examples.len(),
            report.missing_examples.join(", ")
        );
    }
    if !report.duplicate_examples.is_empty() {
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "Duplicated (first {}): {}",
            report.duplicate_examples.len(),
            report.duplicate_examples.join(", ")
        );
    }
    if !report.unexpected_examples.is_empty() {
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "Messages without a harness id (first {}):",
            report.unexpected_examples.len()
        );
        for m in &report.unexpected_examples {
            let _ = writeln!(md, "- `{}`", m.replace('`', "'"));
        }
    }
    if !report.notes.is_empty() {
        let _ = writeln!(md);
        let _ = writeln!(md, "## Notes");
        let _ = writeln!(md);
        for n in &report.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "## Run");
    let _ = writeln!(md);
    let _ = writeln!(md, "System under test: {}", report.system);
    let _ = writeln!(md);
    let versions: Vec<String> = report
        .versions
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(
        md,
        "Seed {}; runtime `{}`; {}; took {}.",
        report.seed,
        report.runtime,
        versions.join(", "),
        secs(report.duration_ms)
    );
    md
}

/// Writes `report.md` and `report.json` into `dir`; returns their paths.
pub fn write(report: &Report, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let md = dir.join("report.md");
    std::fs::write(&md, markdown(report))?;
    let json = dir.join("report.json");
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(&json, text + "\n")?;
    let junit_path = dir.join("junit.xml");
    let xml = junit::render(&[junit_suite(report, &md)]).map_err(std::io::Error::other)?;
    std::fs::write(&junit_path, xml)?;
    let svg_path = dir.join("timeline.svg");
    std::fs::write(&svg_path, timeline_svg(report))?;
    Ok(vec![md, json, junit_path, svg_path])
}

/// The JUnit view of one drill: a suite, a case per expectation.
pub fn junit_suite(report: &Report, report_md: &Path) -> junit::Suite {
    junit::Suite {
        name: report.scenario.clone(),
        headline: format!("{} — {}", report.verdict.word(), report.headline),
        verdict_pass: report.verdict.is_pass(),
        time_s: report.duration_ms as f64 / 1000.0,
        report_md: Some(report_md.display().to_string()),
        cases: report
            .expectations
            .iter()
            .map(|x| junit::Case {
                name: x.name.clone(),
                expected: x.expected.clone(),
                actual: x.actual.clone(),
                ok: x.ok,
            })
            .collect(),
        notes: report.notes.clone(),
    }
}

/// The timeline chart: delivered per second and backlog, fault windows shaded, engine and
/// broker restarts, and each recovery's first delivery and drain marked.
pub fn timeline_svg(report: &Report) -> String {
    let samples: Vec<svg::Sample> = report
        .series
        .iter()
        .map(|p| svg::Sample {
            at_ms: p.at_ms,
            delivered_per_s: p.delivered as f64,
            waiting: p.waiting,
        })
        .collect();
    let mut windows = Vec::new();
    let mut marks = Vec::new();
    for f in &report.faults {
        if f.target.starts_with("link") {
            windows.push(svg::Window {
                from_ms: f.at_ms,
                until_ms: f.until_ms,
                label: format!(
                    "{} {}{}",
                    f.target,
                    f.fault,
                    f.direction
                        .as_ref()
                        .map(|d| format!(" {d}"))
                        .unwrap_or_default()
                ),
            });
        } else {
            marks.push(svg::Mark {
                at_ms: f.at_ms,
                kind: svg::MarkKind::Kill,
                label: format!("{} {}", f.target, f.fault),
            });
            if let Some(until) = f.until_ms {
                marks.push(svg::Mark {
                    at_ms: until,
                    kind: svg::MarkKind::Restart,
                    label: format!("{} back", f.target),
                });
            }
        }
    }
    let mut seen = HashSet::new();
    for r in &report.recovery {
        // Overlapping faults share one heal: mark it once.
        if !seen.insert(r.heal_ms) {
            continue;
        }
        if let Some(at) = r.first_delivery_ms {
            marks.push(svg::Mark {
                at_ms: at,
                kind: svg::MarkKind::FirstDelivery,
                label: format!("first delivery +{} ms", at.saturating_sub(r.heal_ms)),
            });
        }
        if let Some(at) = r.drained_ms {
            marks.push(svg::Mark {
                at_ms: at,
                kind: svg::MarkKind::Drained,
                label: format!("drained +{} ms", at.saturating_sub(r.heal_ms)),
            });
        }
    }
    let title = format!(
        "{} — {} — {}",
        report.scenario,
        report.verdict.word(),
        report.headline
    );
    svg::render(&svg::Chart {
        title: &title,
        duration_ms: report.duration_ms,
        samples: &samples,
        windows: &windows,
        marks: &marks,
    })
}
