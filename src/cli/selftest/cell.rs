//! One cell of the selftest: what one drill's report says of one engine.
//!
//! A mutant is *caught* only by its signature (`engine::mutant::Mutant::signature`): a drill
//! that ran to a conclusive verdict (no inconclusive reason, no verifier fault) and failed one
//! of the expectations the mutant names. A drill that fails it otherwise — another
//! expectation, an inconclusive drill — has not caught it: the cell says what failed instead.
//! The correct engine passes a cell only when the drill passed and every fault the scenario
//! plans appears in the report (a fault that was skipped proves nothing).
//!
//! Pure: it reads a `report.json` already parsed, so every rule is unit-tested.

use serde::{Deserialize, Serialize};

use crate::check::{Check, Signature};

/// What one drill said of one engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    pub scenario: String,
    pub outcome: CellOutcome,
    /// A mutant's signature findings: what caught it (`lost 202`).
    pub caught_by: Vec<Finding>,
    /// Everything else that failed: expectations, inconclusive reasons, a verifier fault,
    /// planned faults missing from the report, or why the drill could not run.
    pub failures: Vec<String>,
    pub exit: Option<i32>,
    pub took_s: f64,
}

impl Cell {
    pub fn not_run(scenario: &str) -> Cell {
        Cell {
            scenario: scenario.to_string(),
            outcome: CellOutcome::NotRun,
            caught_by: Vec::new(),
            failures: Vec::new(),
            exit: None,
            took_s: 0.0,
        }
    }

    /// `lost 202`, or `missed`, `other: …` — the cell as the matrix shows it.
    pub fn short(&self) -> String {
        match self.outcome {
            CellOutcome::Caught => self
                .caught_by
                .iter()
                .map(Finding::short)
                .collect::<Vec<_>>()
                .join(", "),
            CellOutcome::Other => format!("other: {}", first_word(self.failures.first())),
            CellOutcome::Pass => "pass".to_string(),
            CellOutcome::Error => "error".to_string(),
            CellOutcome::NotRun => "·".to_string(),
            CellOutcome::Elsewhere => "(shard)".to_string(),
        }
    }
}

fn first_word(s: Option<&String>) -> String {
    s.map(|s| s.split([' ', ':']).next().unwrap_or(s).to_string())
        .unwrap_or_default()
}

/// A signature expectation that failed, with its count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// What caught it: `lost`, `keyless_copies`, `recovery: none` …
    pub signature: Signature,
    pub count: Option<u64>,
}

impl Finding {
    fn short(&self) -> String {
        let name = self.signature.name().replace('_', " ");
        match self.count {
            Some(n) => format!("{name} {n}"),
            None => name,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellOutcome {
    /// Every expectation held (for a mutant: missed).
    Pass,
    /// A mutant failed by its signature, conclusively: caught.
    Caught,
    /// Failed, but not by the signature (or not conclusively): for a mutant, not caught; for
    /// the correct engine, a false alarm.
    Other,
    /// The drill could not be run (exit 2 or 3): neither caught nor passed.
    Error,
    /// Not run: the mutant was already caught by an earlier drill.
    NotRun,
    /// Another shard's cell (`drill selftest --shard K/N`): `drill merge` puts its outcome here.
    Elsewhere,
}

/// Judges one drill: its exit code, its report (`None` if it wrote none), the engine's
/// signature (empty for the correct engine), and the fault targets the scenario plans.
pub fn judge(
    exit: Option<i32>,
    report: Option<&serde_json::Value>,
    signature: &[Signature],
    planned: &[String],
) -> (CellOutcome, Vec<Finding>, Vec<String>) {
    let Some(report) = report.filter(|_| matches!(exit, Some(0) | Some(1))) else {
        return (CellOutcome::Error, Vec::new(), Vec::new());
    };
    let mut failures = failures(report);
    failures.extend(missing_faults(report, planned));
    if exit == Some(0) && failures.is_empty() {
        return (CellOutcome::Pass, Vec::new(), Vec::new());
    }
    let conclusive = report["inconclusive"].as_array().is_none_or(Vec::is_empty)
        && report["verifier_fault"].is_null();
    let found = if conclusive {
        findings(report, signature)
    } else {
        Vec::new()
    };
    if found.is_empty() {
        (CellOutcome::Other, Vec::new(), failures)
    } else {
        (CellOutcome::Caught, found, failures)
    }
}

/// The failed expectations that show one of the signatures, in its sense: a `recovery` row
/// with no delivery at all for `recovery: none` (a late one is not it), a `duplicates` row with
/// copies lacking the original write key for `keyless_copies`.
fn findings(report: &serde_json::Value, signature: &[Signature]) -> Vec<Finding> {
    let keyless = report["ledger"]["duplicates_other_key"]
        .as_u64()
        .unwrap_or(0);
    let mut found = Vec::new();
    for x in failed(report) {
        let Ok(check) = serde_json::from_value::<Check>(x["check"].clone()) else {
            continue;
        };
        let count = x["count"].as_u64();
        for s in signature.iter().filter(|s| s.check() == check) {
            if let Some(count) = s.matches(count, keyless) {
                found.push(Finding {
                    signature: *s,
                    count,
                });
            }
        }
    }
    found
}

fn failed(report: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    report["expectations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["ok"] == false)
}

/// Every failed expectation (`lost (expected 0, got 12)`), inconclusive reason and verifier
/// fault of a report.
fn failures(report: &serde_json::Value) -> Vec<String> {
    let text = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
    let mut out: Vec<String> = failed(report)
        .map(|x| {
            format!(
                "{} (expected {}, got {})",
                text(&x["name"]),
                text(&x["expected"]),
                text(&x["actual"])
            )
        })
        .collect();
    out.extend(
        report["inconclusive"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str())
            .map(|r| format!("inconclusive: {r}")),
    );
    if let Some(f) = report["verifier_fault"].as_str() {
        out.push(format!("verifier fault: {f}"));
    }
    out
}

/// Planned fault targets (`link mqtt`, `engine`, `broker`) that the report's fault log lacks,
/// counted: a drill that planned two kills and logged one is missing one.
fn missing_faults(report: &serde_json::Value, planned: &[String]) -> Vec<String> {
    let mut logged: Vec<String> = report["faults"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["target"].as_str().map(str::to_string))
        .collect();
    let mut missing = Vec::new();
    for want in planned {
        // A broker node's name is known only once it is hit: `broker` matches any.
        let at = logged
            .iter()
            .position(|t| t == want || (want == "broker" && t.starts_with("broker ")));
        match at {
            Some(i) => {
                logged.remove(i);
            }
            None => missing.push(format!("planned fault not in the report: {want}")),
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(expectations: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
        let mut r = serde_json::json!({
            "expectations": expectations,
            "inconclusive": [],
            "verifier_fault": null,
            "ledger": { "duplicates_other_key": 0 },
            "faults": [{ "target": "link mqtt" }, { "target": "engine" }],
        });
        if let (Some(r), Some(extra)) = (r.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                r.insert(k.clone(), v.clone());
            }
        }
        r
    }

    fn failed(check: &str, count: u64) -> serde_json::Value {
        serde_json::json!([{ "check": check, "name": check, "expected": "0", "actual": count.to_string(), "count": count, "ok": false }])
    }

    const PLANNED: &[&str] = &["link mqtt", "engine"];

    fn planned() -> Vec<String> {
        PLANNED.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_mutant_is_caught_only_by_its_signature_in_a_conclusive_drill() {
        let lost = report(failed("lost", 202), serde_json::json!({}));
        let (o, found, _) = judge(Some(1), Some(&lost), &[Signature::Lost], &planned());
        assert_eq!(o, CellOutcome::Caught);
        assert_eq!(found[0].short(), "lost 202");
        // Another expectation failed: not caught, and the cell says what did.
        let (o, found, why) = judge(Some(1), Some(&lost), &[Signature::Duplicates], &planned());
        assert_eq!((o, found.len()), (CellOutcome::Other, 0));
        assert_eq!(why, ["lost (expected 0, got 202)"]);
        // Inconclusive: nothing it says counts as a catch.
        let inconclusive = report(
            failed("lost", 3),
            serde_json::json!({ "inconclusive": ["the fault at 1.0 s met no traffic"] }),
        );
        let (o, _, why) = judge(Some(1), Some(&inconclusive), &[Signature::Lost], &planned());
        assert_eq!(o, CellOutcome::Other);
        assert!(why[1].starts_with("inconclusive: "), "{why:?}");
        let verifier = report(
            failed("lost", 3),
            serde_json::json!({ "verifier_fault": "reader lost its connection" }),
        );
        assert_eq!(
            judge(Some(1), Some(&verifier), &[Signature::Lost], &planned()).0,
            CellOutcome::Other
        );
        // Exit 3, or no report: an error, never a catch.
        assert_eq!(
            judge(Some(3), Some(&lost), &[Signature::Lost], &planned()).0,
            CellOutcome::Error
        );
        assert_eq!(
            judge(Some(1), None, &[Signature::Lost], &planned()).0,
            CellOutcome::Error
        );
    }

    #[test]
    fn keyless_copies_are_duplicates_some_without_the_original_write_key() {
        let with_key = report(failed("duplicates", 4), serde_json::json!({}));
        let (o, _, _) = judge(
            Some(1),
            Some(&with_key),
            &[Signature::KeylessCopies],
            &planned(),
        );
        assert_eq!(
            o,
            CellOutcome::Other,
            "copies with their write key are not its signature"
        );
        let keyless = report(
            failed("duplicates", 4),
            serde_json::json!({ "ledger": { "duplicates_other_key": 3 } }),
        );
        let (o, found, _) = judge(
            Some(1),
            Some(&keyless),
            &[Signature::KeylessCopies],
            &planned(),
        );
        assert_eq!(o, CellOutcome::Caught);
        assert_eq!(found[0].short(), "keyless copies 3");
    }

    #[test]
    fn recovery_none_is_no_delivery_after_the_heal_never_a_late_one() {
        let row = |count: serde_json::Value| serde_json::json!([{ "check": "recovery", "name": "recovery after link mqtt strand", "expected": "≤ 5000 ms", "actual": "x", "count": count, "ok": false }]);
        let none = report(row(serde_json::Value::Null), serde_json::json!({}));
        let (o, found, _) = judge(Some(1), Some(&none), &[Signature::RecoveryNone], &planned());
        assert_eq!(o, CellOutcome::Caught);
        assert_eq!(found[0].short(), "recovery: none");
        // Delivery came back 6 s after the heal: late, which load can cause; not a catch.
        let late = report(row(serde_json::json!(6000)), serde_json::json!({}));
        let (o, found, _) = judge(Some(1), Some(&late), &[Signature::RecoveryNone], &planned());
        assert_eq!((o, found.len()), (CellOutcome::Other, 0));
    }

    #[test]
    fn the_correct_engine_passes_only_with_every_planned_fault_in_the_report() {
        let clean = report(serde_json::json!([]), serde_json::json!({}));
        assert_eq!(
            judge(Some(0), Some(&clean), &[], &planned()).0,
            CellOutcome::Pass
        );
        let mut twice = planned();
        twice.push("engine".to_string());
        let (o, _, why) = judge(Some(0), Some(&clean), &[], &twice);
        assert_eq!(o, CellOutcome::Other);
        assert_eq!(why, ["planned fault not in the report: engine"]);
        let broker = report(
            serde_json::json!([]),
            serde_json::json!({ "faults": [{ "target": "broker n2" }] }),
        );
        let planned = vec!["broker".to_string()];
        assert_eq!(
            judge(Some(0), Some(&broker), &[], &planned).0,
            CellOutcome::Pass
        );
    }
}
