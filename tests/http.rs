//! The HTTP destination end to end, through the real binary: drill's own endpoint (the oracle),
//! the real proxy in front of it, the engine as a child process. A 503 window is an outage, not
//! a refusal: the correct engine passes it with nothing failed, and an engine that counts the
//! 503s as refusals (the mutant `outage-status-spends-attempts`) fails it with its records in
//! Failed messages. Late answers make `possibly_sent` resends that an endpoint with `dedupe`
//! recognises (effectively once: no extra copy stored) and one without stores again (at least
//! once: copies within the promise).

use crate::common::run::{catalogue_drill_passes, expected_failed, refused_at};
#[cfg(feature = "mutants")]
use crate::common::run::{run_drill_with, show};

#[cfg(feature = "mutants")]
fn catalogue(name: &str) -> String {
    format!("{}/scenarios/{name}.yaml", env!("CARGO_MANIFEST_DIR"))
}

/// 15 s of 503 with Retry-After: every record held and delivered once, none failed, and the
/// outage met the traffic (attempts ended possibly_sent, none refused).
#[test]
fn a_503_window_is_an_outage_the_correct_engine_sits_out() {
    let ran = catalogue_drill_passes("http-503");
    let r = &ran.report;
    assert_eq!(ran.number(&["ledger", "failed"]), 0);
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(ran.number(&["ledger", "duplicates"]), 0);
    assert_eq!(
        ran.number(&["attempts", "refused"]),
        0,
        "{:#}",
        r["attempts"]
    );
    assert!(
        ran.number(&["attempts", "possibly_sent"]) > 0,
        "{:#}",
        r["attempts"]
    );
    assert_eq!(r["headline"], "Nothing lost.");
}

/// The same drill against an engine that counts each 503 as a refusal: records end in Failed
/// messages and the drill fails on exactly that.
#[cfg(feature = "mutants")]
#[test]
fn an_engine_that_counts_503_as_a_refusal_fails_with_records_failed() {
    let ran = run_drill_with(
        &catalogue("http-503"),
        "http-503",
        &[],
        &[("DRILL_MUTANT", "outage-status-spends-attempts")],
    );
    ran.say("http-503 (mutant outage-status-spends-attempts)");
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(1), "{}\n{r:#}", show(o));
    let failed = ran.number(&["ledger", "failed"]);
    assert!(failed > 0, "{:#}", r["ledger"]);
    assert!(
        ran.number(&["attempts", "refused"]) >= 3 * failed,
        "{:#}",
        r["attempts"]
    );
    let broken: Vec<&str> = r["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ok"] == false)
        .filter_map(|e| e["check"].as_str())
        .collect();
    assert_eq!(broken, ["failed"], "{:#}", r["expectations"]);
}

/// "Yes, but" on an Elasticsearch `_bulk` endpoint: every request answered 200, one item in
/// ten rejected 429 for 6 s, then one in twenty refused 400 for 4 s — withheld, never stored.
/// The correct engine reads the items: it resends the 429s (nothing lost, no copy) and counts
/// the 400s failed, exactly as many as the endpoint refused.
#[test]
fn a_bulk_answer_s_item_errors_are_resent_or_counted_by_the_correct_engine() {
    let ran = catalogue_drill_passes("http-bulk-reject");
    let r = &ran.report;
    let failed = ran.number(&["ledger", "failed"]);
    assert_eq!(expected_failed(r), failed, "{:#}", r["expectations"]);
    // 5% of the records that crossed the endpoint in the 4 s window of 400s: ~20 when the
    // workload flows evenly; under load it crosses in bursts and fewer land in the window
    // (CI on cfd90f5: 14, all counted failed as they should be).
    assert!((5..=35).contains(&failed), "{:#}", r["ledger"]);
    assert_eq!(
        ran.number(&["attempts", "refused"]),
        failed,
        "{:#}",
        r["attempts"]
    );
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(ran.number(&["ledger", "duplicates"]), 0);
    assert_eq!(ran.number(&["ledger", "failed_but_stored"]), 0);
    // The 429s ended their sessions: the records went again.
    assert!(
        ran.number(&["attempts", "possibly_sent"]) >= 50,
        "{:#}",
        r["attempts"]
    );
}

/// The same drill against an engine that reads only the request's 200 (`bulk-status-only`):
/// every rejected item counted delivered — the 429s (~60) and the 400s (~20) all lost, none
/// failed.
#[cfg(feature = "mutants")]
#[test]
fn an_engine_that_reads_only_the_bulk_status_loses_the_rejected_items() {
    let ran = run_drill_with(
        &catalogue("http-bulk-reject"),
        "http-bulk-reject",
        &[],
        &[("DRILL_MUTANT", "bulk-status-only")],
    );
    ran.say("http-bulk-reject (mutant bulk-status-only)");
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(1), "{}\n{r:#}", show(o));
    let lost = ran.number(&["ledger", "lost"]);
    assert_eq!(ran.number(&["ledger", "failed"]), 0, "{:#}", r["ledger"]);
    // About 60 rejected 429 + 20 refused 400 at the planned 100/s; the share is exact of what
    // crossed the endpoint, and under load the workload catches up in bursts, so more may
    // cross a window (CI saw 91). Every refused record is among the lost, and more besides.
    assert!(
        (70..=130).contains(&lost) && lost > expected_failed(r),
        "60 rejected 429 + 20 refused 400: {:#}",
        r["ledger"]
    );
    assert_eq!(ran.number(&["ledger", "duplicates"]), 0);
}

/// "Yes, but" while the engine batches (answers 300 ms late after a refused link, up to 8
/// records per request): one record in twenty refused 400 for 10 s. The correct engine counts
/// exactly the refused records failed, and the verdict checks them by id: none of its failed
/// records is at the destination.
#[test]
fn the_failed_records_of_a_batched_bulk_drill_are_the_refused_ones_by_id() {
    let ran = catalogue_drill_passes("http-bulk-off-by-one");
    let r = &ran.report;
    let failed = ran.number(&["ledger", "failed"]);
    assert!(failed >= 5, "{:#}", r["ledger"]);
    assert_eq!(ran.number(&["ledger", "failed_but_stored"]), 0);
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
}

/// The same drill against an engine that reads the items one place off
/// (`bulk-items-off-by-one`): each refused record counted delivered, a stored neighbour
/// failed. As many failed as refused — by the counts alone it passes; by id the failed
/// records are all stored and the refused ones lost, as many of each.
#[cfg(feature = "mutants")]
#[test]
fn an_engine_that_reads_the_bulk_items_one_place_off_fails_by_id() {
    let ran = run_drill_with(
        &catalogue("http-bulk-off-by-one"),
        "http-bulk-off-by-one",
        &[],
        &[("DRILL_MUTANT", "bulk-items-off-by-one")],
    );
    ran.say("http-bulk-off-by-one (mutant bulk-items-off-by-one)");
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(1), "{}\n{r:#}", show(o));
    let (failed, lost) = (
        ran.number(&["ledger", "failed"]),
        ran.number(&["ledger", "lost"]),
    );
    let stored = ran.number(&["ledger", "failed_but_stored"]);
    assert!(lost >= 5, "{:#}", r["ledger"]);
    assert_eq!((stored, failed), (lost, lost), "{:#}", r["ledger"]);
}

/// An endpoint that answers every write 4xx (401 for 10 s, then 422 for 8 s) is away, not
/// refusing records: the probe sent after each 4xx gets the same answer, so nothing is
/// refused and nothing ends in Failed messages. The engine before this rule (a 4xx counted as
/// a refusal whenever a write had been taken in the last minute) failed 29 records here.
#[test]
fn an_endpoint_that_answers_everything_4xx_is_away_not_refusing() {
    let ran = catalogue_drill_passes("http-unauthorized");
    assert_eq!(ran.number(&["ledger", "failed"]), 0);
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(
        ran.number(&["attempts", "refused"]),
        0,
        "{:#}",
        ran.report["attempts"]
    );
    // Asked again once a second while it takes nothing, not in a tight loop: each ask ends
    // one attempt possibly_sent (18 s of windows).
    let asked = ran.number(&["attempts", "possibly_sent"]);
    println!("possibly_sent {asked}");
    assert!((1..=60).contains(&asked), "{:#}", ran.report["attempts"]);
}

/// Late answers past the answer timeout: resends with the same Idempotency-Key. With dedupe the
/// endpoint stores each record once (no duplicate at all); without, the copies are stored and
/// each is within at_least_once.
#[test]
fn late_answers_make_resends_that_dedupe_recognises_and_at_least_once_allows() {
    let ran = catalogue_drill_passes("http-slow-answer");
    let r = &ran.report;
    assert!(
        ran.number(&["attempts", "possibly_sent"]) > 0,
        "{:#}",
        r["attempts"]
    );
    // The correct engine closed each attempt it gave up before it resent: no overlap.
    assert_eq!(ran.number(&["ledger", "overlapping_attempts"]), 0);
    assert_eq!(
        ran.number(&["ledger", "duplicates"]),
        0,
        "{:#}",
        r["ledger"]
    );
    let ran = catalogue_drill_passes("http-slow-answer-no-dedupe");
    let r = &ran.report;
    let copies = ran.number(&["ledger", "duplicates"]);
    assert!(copies > 0, "{:#}", r["ledger"]);
    assert_eq!(ran.number(&["ledger", "duplicates_beyond_promise"]), 0);
    assert_eq!(ran.number(&["ledger", "duplicates_same_key"]), copies);
}

/// A 422 for one record while the rest are taken: a real refusal, set aside in Failed
/// messages after its counted refusals.
#[test]
fn a_record_the_endpoint_rejects_is_set_aside() {
    let ran = catalogue_drill_passes("http-poison");
    let r = &ran.report;
    assert_eq!(ran.number(&["ledger", "failed"]), 1);
    assert_eq!(
        ran.number(&["attempts", "refused"]),
        5,
        "{:#}",
        r["attempts"]
    );
}

/// What an HTTP destination cannot honour, and destination faults where they mean nothing:
/// exit 2, one line, located.
#[test]
fn what_an_http_destination_cannot_honour_exits_2_located() {
    let dir = tempfile::tempdir().unwrap();
    let fault =
        |f: &str| format!("destination: {{ kind: http, dedupe: true }}\nfaults:\n  - {f}\n");
    let cases = [
        (
            "effectively-once-without-dedupe",
            "destination: { kind: http }\nsystem: { builtin: { promise: effectively_once } }\n".to_string(),
            "declare at_least_once or less",
            "effectively_once",
        ),
        (
            "unknown-status",
            fault("{ at: 1s, target: destination, answer: 599, for: 2s }"),
            "not a known HTTP error status",
            "599",
        ),
        (
            "success-status",
            fault("{ at: 1s, target: destination, answer: 200, for: 2s }"),
            "not a known HTTP error status",
            "200",
        ),
        (
            "answer-after-longer-than-the-drill",
            fault("{ at: 1s, target: destination, answer_after: 10m, for: 2s }"),
            "not within the drill's workload",
            "10m",
        ),
        (
            "retry-after-on-500",
            fault("{ at: 1s, target: destination, answer: 500, retry_after: 1s, for: 2s }"),
            "429",
            "{ at: 1s",
        ),
        (
            "no-window",
            fault("{ at: 1s, target: destination, answer: 503 }"),
            "field `faults[0].for`",
            "{ at: 1s",
        ),
        (
            "destination-fault-on-nats",
            "destination: { kind: nats }\nfaults:\n  - { at: 1s, target: destination, answer: 503, for: 2s }\n".to_string(),
            "need a destination drill answers for",
            "{ at: 1s",
        ),
        (
            "answer-on-a-link-fault",
            fault("{ at: 1s, link: http, fault: refuse, answer: 503, for: 2s }"),
            "field `faults[0].answer`: only destination faults",
            "{ at: 1s",
        ),
        (
            "reject-fraction-above-one",
            fault("{ at: 1s, target: destination, reject: { fraction: 1.5, status: 429 }, for: 2s }"),
            "field `faults[0].reject.fraction`: 1.5 is not a share of the records",
            "{ fraction",
        ),
        (
            "reject-with-401",
            fault("{ at: 1s, target: destination, reject: { fraction: 0.1, status: 401 }, for: 2s }"),
            "field `faults[0].reject.status`: `401` is not an answer a record is rejected with; use 429, 500, 503 (rejected for now: resent) or 400, 413, 422",
            "{ fraction",
        ),
        (
            "reject-with-answer",
            fault("{ at: 1s, target: destination, answer: 503, reject: { fraction: 0.1, status: 429 }, for: 2s }"),
            "field `faults[0].answer`: give `reject` alone",
            "{ at: 1s",
        ),
        (
            "reject-unknown-field",
            fault("{ at: 1s, target: destination, reject: { share: 0.1, status: 429 }, for: 2s }"),
            "share",
            "share",
        ),
        (
            "bulk-with-dedupe",
            "destination: { kind: http, topic: /logs/_bulk, dedupe: true }\n".to_string(),
            "field `destination.dedupe`: a `_bulk` endpoint (`topic: /logs/_bulk`) recognises a repeat by its document `_id`",
            "true",
        ),
        (
            "bulk-key-in-a-header",
            "destination: { kind: http, topic: /logs/_bulk }\nsystem: { command: [x, \"{ingest}\"], ingest: { kind: http }, write_key: { http_header: Idempotency-Key } }\n".to_string(),
            "write http_header: _id",
            "{ http_header",
        ),
        (
            "container",
            "destination: { kind: http, runtime: container }\n".to_string(),
            "drill hosts the HTTP endpoint itself",
            "http",
        ),
        (
            "bad-header",
            "destination: { kind: http, key_header: \"Idem Key\" }\n".to_string(),
            "not an HTTP header name",
            "\"Idem Key\"",
        ),
        (
            "engine-key-in-another-header",
            "destination: { kind: http, dedupe: true, key_header: X-Write-Key }\nsystem: { command: [x, \"{ingest}\"], ingest: { kind: http }, write_key: { http_header: Idempotency-Key } }\n".to_string(),
            "recognises a repeat by the header `x-write-key`",
            "{ http_header",
        ),
    ];
    for (name, body, says, points_at) in cases {
        let text = format!("name: {name}\n{body}workload: {{ rate: 10/s, duration: 5s }}\n");
        refused_at(dir.path(), name, &text, says, points_at, &[]);
    }
}

/// One open attempt per write key, judged where drill is the destination: the two mutants that
/// put a write on the wire again while its first attempt is open (`second-attempt-while-open`,
/// `resend-on-timer`) pass an endpoint that deduplicates atomically on duplicates alone, and
/// are caught by `overlapping_attempts` on `http-slow-answer`; against a check-then-insert
/// endpoint (`racy`) their copies are stored twice as well. The correct engine passes both.
#[cfg(feature = "mutants")]
#[test]
fn a_second_attempt_while_the_first_is_open_is_caught_as_an_overlapping_attempt() {
    let (a, b) = (
        catalogue("http-slow-answer"),
        catalogue("http-slow-answer-racy"),
    );
    let doc = crate::common::run::selftest_the_repeat_makers(&[&a, &b]);
    let mut racy_copies = 0;
    for row in doc["rows"].as_array().unwrap() {
        for cell in row["cells"].as_array().unwrap() {
            let (engine, drill) = (&row["engine"], &cell["scenario"]);
            if engine == "correct" {
                assert_eq!(cell["outcome"], "pass", "{cell:#}");
                continue;
            }
            assert_eq!(cell["outcome"], "caught", "{engine} × {drill}: {cell:#}");
            let by = crate::common::run::caught_by(cell);
            assert!(
                by.contains(&"overlapping_attempts"),
                "{engine} × {drill}: {by:?}"
            );
            if drill == "http-slow-answer-racy" && by.contains(&"duplicates") {
                racy_copies += 1;
            }
        }
    }
    // Check then insert stores what arrives while the first is open: copies beyond the promise
    // (measured: 3 for resend-on-timer, 1 for second-attempt-while-open).
    assert!(
        racy_copies > 0,
        "no copies stored twice on the racy endpoint"
    );
}
