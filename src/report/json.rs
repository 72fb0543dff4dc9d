//! `report.json` (docs/src/design.md#6-interfaces): the [`Report`] as serde writes it, pretty, one
//! trailing newline. Tools read this file; its top-level fields are a contract, so they are pinned
//! by a test here.

use super::Report;

/// The text of `report.json`.
pub fn render(report: &Report) -> std::io::Result<String> {
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    Ok(text + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The top level of docs/src/design.md#6-interfaces, and the fields a person needs besides.
    #[test]
    fn the_top_level_fields_other_tools_rely_on() {
        let report = crate::report::verdict::tests::a_report();
        let v: serde_json::Value = serde_json::from_str(&render(&report).unwrap()).unwrap();
        for field in [
            "scenario",
            "seed",
            "verdict",
            "ledger",
            "closes",
            "undelivered",
            "expectations",
            "faults",
            "recovery",
            "attempts",
            "versions",
        ] {
            assert!(v.get(field).is_some(), "report.json lacks `{field}`");
        }
        for field in [
            "held",
            "delivered",
            "waiting",
            "failed",
            "lost",
            "delivered_unanswered",
            "duplicates",
            "reordered",
            "unexpected",
            "altered",
            "ingest_unknown",
            "recovered",
        ] {
            assert!(v["ledger"].get(field).is_some(), "ledger lacks `{field}`");
        }
        let fault = &v["faults"][0];
        for field in ["at_ms", "target", "fault", "direction", "until_ms"] {
            assert!(fault.get(field).is_some(), "faults[] lacks `{field}`");
        }
        for field in ["delivered", "refused", "possibly_sent", "sent_unconfirmed"] {
            assert!(
                v["attempts"].get(field).is_some(),
                "attempts lacks `{field}`"
            );
        }
    }
}
