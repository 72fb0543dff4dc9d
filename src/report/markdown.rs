//! `report.md`, for a person: the verdict and headline, the chart, the tiles and the ledger
//! line, then one section each — inconclusive reasons, expectations, the fault timeline with
//! recovery, attempts and the link, examples, notes, the run. Also the few lines a CI job
//! summary gets ([`step_summary`]).
//!
//! A renderer of [`Report`] only: it decides nothing. Its output for fixed facts is pinned by
//! the golden file `fixtures/report/report.md` (the test below).

use std::fmt::Write as _;
use std::path::Path;

use super::Report;

/// Renders `report.md`.
pub fn markdown(report: &Report) -> String {
    let mut md = String::new();
    heading(&mut md, report);
    tiles(&mut md, report, false);
    account(&mut md, report);
    inconclusive(&mut md, report);
    expectations(&mut md, report);
    last_seen(&mut md, report);
    timeline(&mut md, report);
    attempts_and_link(&mut md, report);
    examples(&mut md, report);
    notes(&mut md, report);
    run(&mut md, report);
    md
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

fn heading(md: &mut String, report: &Report) {
    let _ = writeln!(md, "# drill report: {}", report.scenario);
    let _ = writeln!(md);
    if let Some(about) = &report.about {
        let _ = writeln!(md, "{about}");
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "## {} — {}", report.verdict.word(), report.headline);
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "![timeline: delivered per second and backlog, faults shaded](timeline.svg)"
    );
    let _ = writeln!(md);
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
    // Columns and cells; a destination that cannot confirm splits what is missing in two.
    let mut columns = vec!["held", "delivered", "waiting", "failed"];
    let mut cells = vec![l.held, l.delivered, l.waiting, l.failed]
        .into_iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>();
    if let Some(unconfirmed) = l.sent_unconfirmed_missing {
        columns.extend(["sent, not confirmed, missing", "lost before sending"]);
        cells.push(unconfirmed.to_string());
    } else {
        columns.push("lost");
    }
    cells.push(format!("**{}**", l.lost));
    columns.extend([heading.as_str(), "reordered"]);
    cells.extend([duplicates.to_string(), l.reordered.to_string()]);
    let _ = writeln!(md, "| {} |", columns.join(" | "));
    let _ = writeln!(md, "|{}", "---:|".repeat(columns.len()));
    let _ = writeln!(md, "| {} |", cells.join(" | "));
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

/// The engine's own account, the duplicates split by write key, ingests with a lost answer.
fn account(md: &mut String, report: &Report) {
    let l = &report.ledger;
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
    if let Some(n) = l.overlapping_attempts.filter(|n| *n > 0) {
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "Overlapping attempts: {n} writes arrived while an earlier attempt with the same write key was unanswered and its connection still open (first: {}). One open attempt per write key: a resend waits for the first attempt's answer, or closes it first.",
            report.overlapping_examples.join(", ")
        );
    }
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
}

fn inconclusive(md: &mut String, report: &Report) {
    if report.inconclusive.is_empty() {
        return;
    }
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

fn expectations(md: &mut String, report: &Report) {
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
}

/// Where the lost records were last seen, by the links' tap.
fn last_seen(md: &mut String, report: &Report) {
    let Some(seen) = &report.lost_last_seen else {
        return;
    };
    let _ = writeln!(md, "## Where the lost records were last seen");
    let _ = writeln!(md);
    let _ = writeln!(
        md,
        "By the links' tap ({}): {} records accepted and missing at the destination.",
        seen.tap, seen.missing
    );
    let _ = writeln!(md);
    let _ = writeln!(md, "| last seen | records | the first |");
    let _ = writeln!(md, "|---|---:|---|");
    for (what, class) in [
        ("never left the engine", &seen.never_left),
        ("left, but no answer came back", &seen.no_answer),
        (
            "the broker acknowledged it and does not have it",
            &seen.broker_lost,
        ),
    ] {
        let _ = writeln!(
            md,
            "| {what} | {} | {} |",
            class.count,
            class.first.join(", ")
        );
    }
    if let Some(note) = &seen.note {
        let _ = writeln!(md);
        let _ = writeln!(md, "{note}.");
    }
    let _ = writeln!(md);
}

/// The faults as applied, and the recovery after each heal.
fn timeline(md: &mut String, report: &Report) {
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
                f.what(),
                f.kind
                    .direction()
                    .map(|d| format!(" ({})", d.name()))
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
}

fn attempts_and_link(md: &mut String, report: &Report) {
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
    if let Some(d) = &k.datagrams {
        let _ = writeln!(
            md,
            "A datagram (UDP) link: connections are flows (one per client address), bytes are payloads; {} datagrams up, {} down; {} dropped up, {} down.",
            d.upstream, d.downstream, d.dropped_upstream, d.dropped_downstream
        );
    }
    if !k.broker_links.is_empty() {
        let _ = writeln!(
            md,
            "Those counts include its broker links (Kafka-aware; {} answers rewritten): {}.",
            k.answers_rewritten,
            k.broker_links.join(", ")
        );
    }
    if k.api_versions_trimmed > 0 {
        let _ = writeln!(
            md,
            "The link rewrote {} ApiVersions answers: their trailing tagged fields (supported and finalized features) dropped, which clients on librdkafka 2.0 and older cannot read.",
            k.api_versions_trimmed
        );
    }
}

/// The first ids missing, duplicated and altered, and messages that carried no harness id.
fn examples(md: &mut String, report: &Report) {
    if let Some(c) = &report.checkpoint_ahead {
        let _ = writeln!(md);
        let _ = writeln!(md, "## Checkpoint ahead of the store");
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "{} lost records were behind the engine's checkpoint ({}): the source will not give them to it again, and it neither delivered nor holds them. A checkpoint may pass a record only once the record is in the engine's own durable store or delivered. First: {}.",
            c.count,
            c.checkpoint,
            c.examples.join(", ")
        );
    }
    for (what, ids) in [
        (
            "Destroyed by the source fault (never read by the engine)",
            &report.destroyed_examples,
        ),
        ("Missing", &report.missing_examples),
        ("Duplicated", &report.duplicate_examples),
        ("Arrived altered, not as sent", &report.altered_examples),
    ] {
        if !ids.is_empty() {
            let _ = writeln!(md);
            let _ = writeln!(md, "{what} (first {}): {}", ids.len(), ids.join(", "));
        }
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
}

fn notes(md: &mut String, report: &Report) {
    if report.notes.is_empty() {
        return;
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "## Notes");
    let _ = writeln!(md);
    for n in &report.notes {
        let _ = writeln!(md, "- {n}");
    }
}

fn run(md: &mut String, report: &Report) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed facts → the committed `fixtures/report/report.md`. To accept a deliberate change
    /// of the layout, run with `DRILL_BLESS=1` and review the diff.
    #[test]
    fn report_md_matches_the_golden_file() {
        let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/report/report.md");
        let mut report = crate::report::verdict::tests::a_report();
        report.notes.push("a note the runner made".to_string());
        report.missing_examples = vec!["r/k0/7".to_string()];
        let text = markdown(&report);
        if std::env::var_os("DRILL_BLESS").is_some() {
            std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
            std::fs::write(&golden, &text).unwrap();
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e} (DRILL_BLESS=1 writes it)", golden.display()));
        assert_eq!(
            text, want,
            "report.md changed; DRILL_BLESS=1 rewrites the golden file"
        );
    }
}
