//! What one run of a timeline came to, read from what `drill run` left: its exit code and its
//! `report.json` (the same runner and verdict as any drill; explore has no second path).
//!
//! A random timeline can make a correct engine slow: its backoff after a long outage, a drain
//! after a late fault. So only the checks that do not depend on the timeline are judged —
//! records lost, never delivered, failed that no one refused, duplicated beyond the promise,
//! reordered, unexpected, altered, attempts overlapping, the ledger — and the timing bounds
//! (`recovery`, `drain`, `max_copies` after one cut, `not_accepted` while the disk is full)
//! are only reported. A run that is neither pass nor fail on those is *unresolved*: exit 2
//! or 3, a reader that may have missed copies, or — for a run that failed none of them — an
//! inconclusive drill (a fault met no traffic, the engine went around the proxy) or fewer
//! faults in the report than the timeline had. A judged check that failed stands though one
//! fault of the timeline proved nothing: records lost are lost.

use super::shrink::{Failed, Outcome};

/// The checks judged (their `report.json` names): the ones a timeline cannot excuse.
pub const JUDGED: [&str; 9] = [
    "lost",
    "undelivered",
    "failed",
    "duplicates",
    "reordered",
    "unexpected",
    "altered",
    "overlapping_attempts",
    "ledger",
];

/// The outcome of a run that exited `exit` and wrote `report` (`None`: no report), of a
/// timeline with `faults` faults.
pub fn outcome(exit: Option<i32>, report: Option<&serde_json::Value>, faults: usize) -> Outcome {
    let report = match (exit, report) {
        (Some(0 | 1), Some(r)) => r,
        (Some(code @ (0 | 1)), None) => {
            return Outcome::Unresolved(format!("exit {code} without a report.json"));
        }
        (Some(code), _) => return Outcome::Unresolved(format!("exit {code}")),
        (None, _) => return Outcome::Unresolved("killed by a signal".to_string()),
    };
    if let Some(f) = report["verifier_fault"].as_str() {
        return Outcome::Unresolved(format!("verifier fault: {f}"));
    }
    let failed: Failed = report["expectations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["ok"] == false)
        .filter_map(|x| x["check"].as_str())
        .filter(|c| JUDGED.contains(c))
        .map(str::to_string)
        .collect();
    // Records lost are lost though another fault of the timeline met no traffic or did not
    // apply: only a pass needs every fault to have bitten.
    if !failed.is_empty() {
        return Outcome::Fails(failed);
    }
    if let Some(why) = report["inconclusive"]
        .as_array()
        .and_then(|a| a.first())
        .and_then(|r| r.as_str())
    {
        return Outcome::Unresolved(format!("inconclusive: {why}"));
    }
    let logged = report["faults"].as_array().map_or(0, Vec::len);
    if logged < faults {
        return Outcome::Unresolved(format!(
            "{logged} of {faults} faults in the report: a fault did not apply"
        ));
    }
    Outcome::Passes
}

/// The timing rows a run failed (reported, not judged): `recovery`, `drain` …
pub fn timing_failed(report: &serde_json::Value) -> Vec<String> {
    report["expectations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["ok"] == false)
        .filter_map(|x| x["check"].as_str())
        .filter(|c| !JUDGED.contains(c))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn report(rows: &[(&str, bool)], faults: usize) -> serde_json::Value {
        json!({
            "verdict": if rows.iter().all(|r| r.1) { "pass" } else { "fail" },
            "inconclusive": [],
            "faults": vec![json!({"target": "link mqtt"}); faults],
            "expectations": rows.iter().map(|(c, ok)| json!({"check": c, "ok": ok})).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn only_what_a_timeline_cannot_excuse_is_judged() {
        let r = report(
            &[("lost", false), ("recovery", false), ("duplicates", false)],
            2,
        );
        let want: Failed = ["duplicates", "lost"].map(String::from).into();
        assert_eq!(outcome(Some(1), Some(&r), 2), Outcome::Fails(want));
        assert_eq!(timing_failed(&r), ["recovery"]);
        // A slow engine only: passes.
        let r = report(&[("lost", true), ("recovery", false), ("drain", false)], 1);
        assert_eq!(outcome(Some(1), Some(&r), 1), Outcome::Passes);
        let r = report(&[("lost", true)], 1);
        assert_eq!(outcome(Some(0), Some(&r), 1), Outcome::Passes);
    }

    #[test]
    fn what_is_neither_pass_nor_fail_is_unresolved() {
        let lost = report(&[("lost", false)], 1);
        let clean = report(&[("lost", true)], 1);
        for (exit, r, faults) in [
            (Some(3), Some(&lost), 1),
            (Some(2), None, 1),
            (None, None, 1),
            (Some(1), None, 1),
            (Some(0), Some(&clean), 2),
        ] {
            assert!(
                matches!(outcome(exit, r, faults), Outcome::Unresolved(_)),
                "{exit:?} {faults}"
            );
        }
        let mut inconclusive = clean.clone();
        inconclusive["inconclusive"] = json!(["the fault at 6.0 s met no traffic"]);
        assert_eq!(
            outcome(Some(1), Some(&inconclusive), 1),
            Outcome::Unresolved("inconclusive: the fault at 6.0 s met no traffic".into())
        );
        let mut reader = lost.clone();
        reader["verifier_fault"] = json!("the reader lagged");
        assert!(matches!(
            outcome(Some(1), Some(&reader), 1),
            Outcome::Unresolved(_)
        ));
        // Records lost stay lost though another fault met no traffic or did not apply.
        let mut lost_anyway = lost.clone();
        lost_anyway["inconclusive"] = json!(["the fault at 6.0 s met no traffic"]);
        let want: Failed = ["lost".to_string()].into();
        assert_eq!(
            outcome(Some(1), Some(&lost_anyway), 1),
            Outcome::Fails(want.clone())
        );
        assert_eq!(outcome(Some(1), Some(&lost), 2), Outcome::Fails(want));
    }
}
