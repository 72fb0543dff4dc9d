//! The selftest's renderers: the terminal matrix, the summary lines and `selftest.md`. Each
//! cell shows the signature expectation that caught the mutant with its count (`lost 202`),
//! `missed`, or `other: …` when the drill failed the mutant for another reason.

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

use super::cell::CellOutcome;
use super::{Row, Selftest};

/// A cell's text: the correct engine's `pass` / `FAIL …`, a mutant's finding or `missed`.
fn cell_text(row: usize, c: &super::Cell) -> String {
    match (row, c.outcome) {
        (0, CellOutcome::Pass) => "pass".to_string(),
        (0, CellOutcome::Caught | CellOutcome::Other) => {
            format!("FAIL {}", first_word(c.failures.first()))
        }
        (_, CellOutcome::Pass) => "missed".to_string(),
        _ => c.short(),
    }
}

fn first_word(s: Option<&String>) -> String {
    s.map(|s| s.split([' ', ':']).next().unwrap_or(s).to_string())
        .unwrap_or_default()
}

/// The matrix for a terminal: one row per engine, one column per drill (numbered; the legend
/// follows), each cell what the drill found.
pub fn matrix(result: &Selftest) -> Table {
    let mut t = Table::new();
    let mut header = vec!["engine".to_string()];
    header.extend((1..=result.scenarios.len()).map(|i| format!("D{i}")));
    header.push("result".to_string());
    t.load_style(UTF8_FULL_CONDENSED).set_header(header);
    for (i, row) in result.rows.iter().enumerate() {
        let mut cells = vec![row.engine.clone()];
        cells.extend(row.cells.iter().map(|c| cell_text(i, c)));
        cells.push(row_result(i, row));
        t.add_row(cells);
    }
    t
}

/// A row's last column: how the correct engine did, or which drill caught the mutant.
pub fn row_result(i: usize, row: &Row) -> String {
    if i == 0 {
        let failed = row
            .cells
            .iter()
            .filter(|c| !matches!(c.outcome, CellOutcome::Pass | CellOutcome::Elsewhere))
            .count();
        return if failed == 0 {
            "passes every drill".to_string()
        } else {
            format!("FAILS {failed} drills")
        };
    }
    match row.cells.iter().find(|c| c.outcome == CellOutcome::Caught) {
        Some(c) => format!("caught by {} ({})", c.scenario, c.short()),
        None => format!("MISSED (signature: {})", names(&row.signature, " or ")),
    }
}

/// The legend of the numbered columns and the summary.
pub fn summary_lines(result: &Selftest) -> Vec<String> {
    let mut lines: Vec<String> = result
        .scenarios
        .iter()
        .enumerate()
        .map(|(i, s)| format!("  D{} = {s}", i + 1))
        .collect();
    let caught = result.rows.len().saturating_sub(1) - result.missed.len();
    let passed = result.rows.first().map_or(0, |r| {
        r.cells
            .iter()
            .filter(|c| c.outcome == CellOutcome::Pass)
            .count()
    });
    lines.push(format!(
        "  the correct engine: {passed} of {} drills passed",
        result.scenarios.len()
    ));
    lines.push(format!(
        "drill selftest: {} — {caught} of {} mutants caught by their signature; the correct engine {}; {:.0} s",
        if result.ok { "PASS" } else { "FAIL" },
        result.rows.len().saturating_sub(1),
        if result.false_alarms.is_empty() {
            "passed every drill that ran".to_string()
        } else {
            format!("failed {}", result.false_alarms.len())
        },
        result.took_s
    ));
    match result.shard {
        Some((k, n)) => {
            lines.push(format!(
                "  shard {k}/{n}: not caught in this shard's cells: {}; whether any is missed is `drill merge`'s to say",
                if result.missed.is_empty() { "none".to_string() } else { result.missed.join(", ") }
            ));
        }
        None => lines.extend(result.missed.iter().map(|m| format!("  missed: {m}"))),
    }
    lines.extend(
        result
            .false_alarms
            .iter()
            .map(|m| format!("  false alarm: {m}")),
    );
    lines.extend(result.errors.iter().map(|m| format!("  error: {m}")));
    lines
}

/// `selftest.md`: the matrix with full names, and what caught each mutant.
pub fn markdown(result: &Selftest) -> String {
    let mut md = match result.shard {
        Some((k, n)) => format!(
            "# drill selftest, shard {k}/{n}\n\nThis shard's cells only (`(shard)`: another shard's). A mutant not caught here may be caught in another shard: `drill merge` judges the whole matrix.\n\n"
        ),
        None => String::from("# drill selftest\n\n"),
    };
    md.push_str(&format!(
        "**{}** — {} mutants, {} drills, {:.0} s. Each cell: the signature expectation that caught the mutant, with its count (`missed`: the drill passed it; `other: …`: it failed the mutant for another reason, which is not a catch; `·`: not run, already caught).\n\n",
        if result.ok { "PASS" } else { "FAIL" },
        result.rows.len().saturating_sub(1),
        result.scenarios.len(),
        result.took_s
    ));
    md.push_str("| engine | signature |");
    for s in &result.scenarios {
        md.push_str(&format!(" {s} |"));
    }
    md.push_str(" result |\n|---|---|");
    md.push_str(&"---|".repeat(result.scenarios.len() + 1));
    md.push('\n');
    for (i, row) in result.rows.iter().enumerate() {
        md.push_str(&format!(
            "| `{}` | {} |",
            row.engine,
            names(&row.signature, ", ")
        ));
        for c in &row.cells {
            let text = match cell_text(i, c) {
                t if i == 0 && t.starts_with("FAIL") => format!("**{t}**"),
                t => t,
            };
            md.push_str(&format!(" {text} |"));
        }
        md.push_str(&format!(" {} |\n", row_result(i, row)));
    }
    md.push_str("\n## What each drill found\n\n");
    for row in result.rows.iter().skip(1) {
        md.push_str(&format!("- `{}` ({}):", row.engine, row.description));
        let said: Vec<String> = row
            .cells
            .iter()
            .filter(|c| matches!(c.outcome, CellOutcome::Caught | CellOutcome::Other))
            .map(|c| {
                let verdict = if c.outcome == CellOutcome::Caught {
                    format!("caught ({})", c.short())
                } else {
                    "not caught (failed for another reason)".to_string()
                };
                format!(" {}: {verdict}: {}", c.scenario, c.failures.join("; "))
            })
            .collect();
        if row.cells.iter().any(|c| c.outcome == CellOutcome::Caught) {
            md.push_str(&said.join(";"));
            md.push('\n');
        } else {
            md.push_str(" **missed by every drill**");
            md.push_str(&said.join(";"));
            md.push('\n');
        }
    }
    for (title, list) in [
        (
            "False alarms (the correct engine failed)",
            &result.false_alarms,
        ),
        ("Drills that could not run", &result.errors),
    ] {
        if !list.is_empty() {
            md.push_str(&format!("\n## {title}\n\n"));
            for l in list {
                md.push_str(&format!("- {l}\n"));
            }
        }
    }
    md
}

/// A signature's names, joined.
fn names(signature: &[crate::check::Signature], sep: &str) -> String {
    signature
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(sep)
}
