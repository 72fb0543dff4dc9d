//! The postgres destination end to end, through the real binary: Debian's PostgreSQL started by
//! drill (as the `postgres` user when the tests run as root), the real proxy, the engine as a
//! child process writing `INSERT … ON CONFLICT (write_key) DO NOTHING`, the table read back.
//! Resends after lost answers store nothing (effectively once, judged strictly: no extra row),
//! and a row the table's CHECK rejects is a refusal set aside in Failed messages.

mod common;

use common::run::{catalogue_drill_passes, drill, have_postgres, scenario, show};

/// Half-open for 15 s: the inserts land and commit, their answers are lost. Each unanswered
/// attempt ends possibly_sent and is resent with its write key after the heal; the key column
/// takes none of them twice.
#[test]
fn resends_after_lost_answers_store_nothing_twice() {
    if !have_postgres() {
        return;
    }
    let ran = catalogue_drill_passes("postgres-half-open");
    let r = &ran.report;
    assert!(
        ran.number(&["attempts", "possibly_sent"]) > 0,
        "{:#}",
        r["attempts"]
    );
    assert_eq!(
        ran.number(&["ledger", "duplicates"]),
        0,
        "{:#}",
        r["ledger"]
    );
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(
        ran.number(&["ledger", "altered"]),
        0,
        "jsonb's layout is read as the same record"
    );
    assert_eq!(r["promise"], "effectively_once");
    let broker = r["versions"]["broker"].as_str().unwrap_or("");
    assert!(broker.starts_with("PostgreSQL "), "{broker}");
}

/// The poison record violates the table's CHECK (SQLSTATE 23514) while every other insert
/// commits: refused five times, then set aside.
#[test]
fn a_row_the_table_rejects_is_a_refusal_set_aside() {
    if !have_postgres() {
        return;
    }
    let ran = catalogue_drill_passes("postgres-poison");
    assert_eq!(ran.number(&["ledger", "failed"]), 1);
    assert_eq!(
        ran.number(&["attempts", "refused"]),
        5,
        "{:#}",
        ran.report["attempts"]
    );
}

/// What a postgres destination does not take yet, or cannot: exit 2, one line, located.
#[test]
fn what_a_postgres_destination_cannot_honour_exits_2_located() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "external",
            "destination: { kind: postgres, runtime: external, address: \"db:5432\" }\n",
            "runs as a local process for now",
            "postgres",
        ),
        (
            "table-name",
            "destination: { kind: postgres, topic: \"Readings; drop\" }\n",
            "not a plain table name",
            "postgres",
        ),
        (
            "write-key-column",
            "destination: { kind: postgres }\nsystem: { command: [x, \"{ingest}\"], ingest: { kind: http }, write_key: { postgres_column: tag } }\n",
            "postgres_column: write_key",
            "{ postgres_column",
        ),
    ];
    for (name, body, says, points_at) in cases {
        let text = format!("name: {name}\n{body}workload: {{ rate: 10/s, duration: 5s }}\n");
        let file = scenario(dir.path(), name, &text);
        let (line, column) = text
            .lines()
            .enumerate()
            .find_map(|(i, l)| l.find(points_at).map(|c| (i + 1, c + 1)))
            .unwrap();
        let o = drill(&["check", &file]);
        let said = String::from_utf8_lossy(&o.stdout) + String::from_utf8_lossy(&o.stderr);
        println!("{name}: {}", said.trim());
        assert_eq!(o.status.code(), Some(2), "{name}: {}", show(&o));
        assert!(said.contains(says), "{name}: {said}");
        assert!(
            said.contains(&format!("{name}.yaml:{line}:{column}")),
            "{name}: expected {line}:{column} in {said}"
        );
    }
}
