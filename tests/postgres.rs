//! The postgres destination end to end, through the real binary: Debian's PostgreSQL started by
//! drill (as the `postgres` user when the tests run as root), the real proxy, the engine as a
//! child process writing `INSERT … ON CONFLICT (write_key) DO NOTHING`, the table read back.
//! Resends after lost answers store nothing (effectively once, judged strictly: no extra row),
//! and a row the table's CHECK rejects is a refusal set aside in Failed messages.

use crate::common::run::{
    catalogue_drill_passes, drill_with, have_postgres, refused_at, run_drill_with, scenario, show,
};

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
/// One open attempt per write key, judged at the link: for 10 s every answer comes 4 s late.
/// The correct engine waits for each (no overlap, one row each); the engines that send a record
/// again while its statement is unanswered on an open connection (`second-attempt-while-open`,
/// `resend-on-timer`) store nothing twice — the key column absorbs the copy, so before the
/// PostgreSQL tap they passed — and are caught by `overlapping_attempts`. Test builds only.
#[cfg(feature = "mutants")]
#[test]
fn a_second_attempt_while_the_first_is_unanswered_is_caught_at_the_link() {
    if !have_postgres() {
        return;
    }
    let file = format!(
        "{}/scenarios/postgres-slow-answer.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let doc = crate::common::run::selftest_the_repeat_makers(&[&file]);
    for row in doc["rows"].as_array().unwrap() {
        let cell = &row["cells"][0];
        let engine = &row["engine"];
        if engine == "correct" {
            assert_eq!(cell["outcome"], "pass", "{cell:#}");
            continue;
        }
        assert_eq!(cell["outcome"], "caught", "{engine}: {cell:#}");
        let by = crate::common::run::caught_by(cell);
        assert!(by.contains(&"overlapping_attempts"), "{engine}: {cell:#}");
    }
}

/// A stranded connection (silent for good, never closed by the link): the engine gives up on
/// its statements after the answer timeout and must close that connection before it sends them
/// again elsewhere. It did not — tokio-postgres keeps a connection open while a statement waits
/// for its answer, after the client is gone — and the link counted 64 overlapping attempts; the
/// session now owns its connection's task and ends it.
#[test]
fn a_stranded_connection_is_closed_before_its_statements_go_again() {
    if !have_postgres() {
        return;
    }
    let ran = catalogue_drill_passes("postgres-strand");
    assert_eq!(
        ran.number(&["ledger", "overlapping_attempts"]),
        0,
        "{:#}",
        ran.report["ledger"]
    );
    assert!(
        ran.number(&["attempts", "possibly_sent"]) > 0,
        "{:#}",
        ran.report["attempts"]
    );
}

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

/// PostgreSQL crashes under load (immediate shutdown: no checkpoint) and comes back 4 s later
/// after replaying its log: what it acknowledged is in the table, what was cut off is resent
/// and stored once, and nothing failed — a refused connection is not a refusal.
#[test]
fn a_database_crash_loses_nothing_it_acknowledged_and_fails_nothing() {
    if !have_postgres() {
        return;
    }
    let ran = catalogue_drill_passes("postgres-crash");
    let r = &ran.report;
    let faults: Vec<String> = r["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{} {}", f["target"], f["fault"]))
        .collect();
    assert_eq!(
        faults,
        ["\"broker postgres\" \"crash\""],
        "{:#}",
        r["faults"]
    );
    assert!(
        r["faults"][0]["until_ms"].as_u64().is_some(),
        "it came back"
    );
    assert_eq!(ran.number(&["ledger", "failed"]), 0);
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(ran.number(&["ledger", "duplicates"]), 0);
}

/// The same crash against an engine that spends an attempt on each failed connect: the
/// records waiting through the crash end in Failed messages, and the drill fails on that.
#[cfg(feature = "mutants")]
#[test]
fn an_engine_that_spends_attempts_on_a_crash_fails_with_records_failed() {
    if !have_postgres() {
        return;
    }
    let ran = run_drill_with(
        &format!(
            "{}/scenarios/postgres-crash.yaml",
            env!("CARGO_MANIFEST_DIR")
        ),
        "postgres-crash",
        &[],
        &[("DRILL_MUTANT", "outage-spends-attempts")],
    );
    ran.say("postgres-crash (mutant outage-spends-attempts)");
    assert_eq!(ran.output.status.code(), Some(1), "{}", show(&ran.output));
    assert!(
        ran.number(&["ledger", "failed"]) > 0,
        "{:#}",
        ran.report["ledger"]
    );
}

/// What a postgres destination does not take yet, or cannot: exit 2, one line, located.
#[test]
fn what_a_postgres_destination_cannot_honour_exits_2_located() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "external-address",
            "destination: { kind: postgres, runtime: external, address: \"db:5432\" }\n",
            "a `postgres` destination takes `dsn_env`",
            "address: \"db:5432",
        ),
        (
            "dsn-unset",
            "destination: { kind: postgres, runtime: external, dsn_env: DRILL_TEST_NO_SUCH_DSN }\n",
            "`DRILL_TEST_NO_SUCH_DSN` is not set",
            "DRILL_TEST_NO_SUCH_DSN",
        ),
        (
            "dsn-malformed",
            "destination: { kind: postgres, runtime: external, dsn_env: DRILL_TEST_BAD_DSN }\n",
            "not a PostgreSQL connection string",
            "DRILL_TEST_BAD_DSN",
        ),
        (
            "dsn-tls",
            "destination: { kind: postgres, runtime: external, dsn_env: DRILL_TEST_TLS_DSN }\n",
            "sslmode=require",
            "DRILL_TEST_TLS_DSN",
        ),
        (
            "dsn-and-credentials",
            "destination: { kind: postgres, runtime: external, dsn_env: DRILL_TEST_TLS_DSN, credentials: { username_env: U, password_env: P } }\n",
            "carries the user and password",
            "{ username_env",
        ),
        (
            "read-back-file",
            "destination: { kind: postgres, read_back: { file: /tmp/x } }\n",
            "read_back: { sql:",
            "{ file",
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
    let env = [
        ("DRILL_TEST_BAD_DSN", "not a connection string"),
        (
            "DRILL_TEST_TLS_DSN",
            "postgres://u:p@db.site.local:5432/plant?sslmode=require",
        ),
    ];
    for (name, body, says, points_at) in cases {
        let text = format!("name: {name}\n{body}workload: {{ rate: 10/s, duration: 5s }}\n");
        refused_at(dir.path(), name, &text, says, points_at, &env);
    }
}

/// A PostgreSQL "the user runs": one drill's own server, started by the test, with a database
/// `plant`; the connection string a user would export, and a connection to `plant`. `None`
/// (the test skips) without PostgreSQL, except under CI=true, where that fails.
async fn external_database() -> Option<(
    drill::dest::postgres::broker::Server,
    String,
    tokio_postgres::Client,
)> {
    if !have_postgres() {
        return None;
    }
    use drill::dest::postgres::{Login, broker};
    let server = broker::start()
        .await
        .expect("PostgreSQL is installed (ci/setup.sh)");
    let admin = Login {
        dbname: "postgres".to_string(),
        ..Login::drill()
    };
    let client = broker::connect(server.addr, &admin).await.unwrap();
    client.batch_execute("CREATE DATABASE plant").await.unwrap();
    let dsn = format!(
        "postgres://drill:not-checked@127.0.0.1:{}/plant",
        server.addr.port()
    );
    let plant = plant(&server).await;
    Some((server, dsn, plant))
}

async fn plant(server: &drill::dest::postgres::broker::Server) -> tokio_postgres::Client {
    use drill::dest::postgres::{Login, broker};
    let login = Login {
        dbname: "plant".to_string(),
        ..Login::drill()
    };
    broker::connect(server.addr, &login).await.unwrap()
}

fn external_drill(dir: &std::path::Path, name: &str, destination: &str) -> String {
    scenario(
        dir,
        name,
        &format!(
            "name: {name}\n\
             destination: {{ kind: postgres, runtime: external, dsn_env: PLANT_DSN{destination} }}\n\
             workload: {{ rate: 100/s, duration: 12s, keys: 4 }}\n\
             faults:\n\
             \x20 - {{ at: 3s, link: postgres, fault: swallow, for: 4s }}\n\
             expect: {{ lost: 0, duplicates: 0, ledger: closes }}\n"
        ),
    )
}

/// `runtime: external`: drill reaches the database with the connection string from the
/// environment, makes its table there (none of that name existed), drills through its link,
/// and drops the table it made at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_database_gets_drills_table_and_loses_only_that() {
    let Some((_server, dsn, client)) = external_database().await else {
        return;
    };
    client
        .batch_execute("CREATE TABLE theirs (n int); INSERT INTO theirs VALUES (1)")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = external_drill(dir.path(), "pg-external", "");
    let ran = tokio::task::block_in_place(|| {
        run_drill_with(&file, "pg-external", &[], &[("PLANT_DSN", dsn.as_str())])
    });
    ran.say("pg-external");
    ran.assert_passed();
    let notes = ran.report["notes"].to_string();
    assert!(
        notes.contains("external PostgreSQL at 127.0.0.1:"),
        "{notes}"
    );
    assert!(
        notes.contains("created by drill and is removed at the end"),
        "{notes}"
    );
    assert_eq!(ran.report["runtime"], "external");
    let gone: bool = client
        .query_one("SELECT to_regclass('drill_records') IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(gone, "drill dropped the table it made");
    let theirs: i64 = client
        .query_one("SELECT count(*) FROM theirs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(theirs, 1, "drill touched nothing it did not make");
}

/// A user's own table, read with `read_back.sql`: ids found in a JSON column, rows timed by
/// `stored_at`, a row of another run left out; drill creates and drops nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_table_is_read_with_the_query_the_scenario_gives() {
    let Some((_server, dsn, client)) = external_database().await else {
        return;
    };
    client
        .batch_execute(
            "CREATE TABLE readings (write_key text PRIMARY KEY, id text NOT NULL, key text,
               seq bigint, payload jsonb, stored_at timestamptz DEFAULT clock_timestamp());
             INSERT INTO readings (write_key, id, payload)
               VALUES ('old', 'x1/k0/1', '{\"id\": \"x1/k0/1\"}')",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = external_drill(
        dir.path(),
        "pg-users-table",
        ", topic: readings, read_back: { sql: \"select write_key, payload, stored_at from readings\" }",
    );
    let ran = tokio::task::block_in_place(|| {
        run_drill_with(&file, "pg-users-table", &[], &[("PLANT_DSN", dsn.as_str())])
    });
    ran.say("pg-users-table");
    ran.assert_passed();
    assert_eq!(
        ran.number(&["ledger", "unexpected"]),
        0,
        "the old row is not this drill's"
    );
    let rows: i64 = client
        .query_one("SELECT count(*) FROM readings", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rows,
        1 + 1200,
        "the table is the user's: drill dropped nothing"
    );
    assert!(
        ran.report["recovery"][0]["first_delivery_ms"]
            .as_u64()
            .is_some(),
        "rows timed by stored_at: {:#}",
        ran.report["recovery"]
    );
}

/// What only the database can tell is still bad input: a table of drill's name that is not
/// drill's, a read-back query that fails, one with no column an id could be in — exit 2, one
/// line, nothing created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_only_the_database_can_tell_exits_2() {
    let Some((_server, dsn, client)) = external_database().await else {
        return;
    };
    client
        .batch_execute("CREATE TABLE drill_records (n int)")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("pg-table-exists", "", "a table `drill_records` exists"),
        (
            "pg-query-fails",
            ", read_back: { sql: \"select * from nothing_here\" }",
            "the read-back query (destination.read_back.sql) fails: relation \"nothing_here\" does not exist",
        ),
        (
            "pg-query-no-text",
            ", read_back: { sql: \"select 1 as n, now() as at\" }",
            "returns no text or JSON column an id could be in (n (int4), at (timestamptz))",
        ),
    ];
    for (name, destination, says) in cases {
        let file = external_drill(dir.path(), name, destination);
        let o = tokio::task::block_in_place(|| {
            drill_with(
                &["run", &file, "--out", &dir.path().display().to_string()],
                &[("PLANT_DSN", dsn.as_str())],
            )
        });
        let said = String::from_utf8_lossy(&o.stderr);
        println!("{name}: {}", said.trim());
        assert_eq!(o.status.code(), Some(2), "{name}: {}", show(&o));
        assert!(said.contains(says), "{name}: {said}");
        assert_eq!(said.trim().lines().count(), 1, "{name}: one line: {said}");
    }
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 1, "drill created nothing");
}

/// `runtime: container`: the server in `drill-local/postgres` (built by `ci/images.sh` from
/// this machine's PostgreSQL; users' machines pull `postgres:15`), started with drill's own
/// initdb; the crash kills the container and `docker start` brings it back, maybe on another
/// host port, which the link and the reader follow.
#[test]
fn the_database_in_a_container_crashes_and_comes_back() {
    if !crate::common::run::have_local_image("drill-local/postgres") {
        return;
    }
    let ran = run_drill_with(
        &format!(
            "{}/scenarios/postgres-crash.yaml",
            env!("CARGO_MANIFEST_DIR")
        ),
        "postgres-crash",
        &["--runtime", "container"],
        &[("DRILL_IMAGE_POSTGRES", "drill-local/postgres")],
    );
    ran.say("postgres-crash in a container");
    ran.assert_passed();
    assert_eq!(ran.report["runtime"], "container");
    let broker = ran.report["versions"]["broker"].as_str().unwrap_or("");
    assert!(
        broker.starts_with("PostgreSQL ") && broker.contains("drill-local/postgres (image "),
        "{broker}"
    );
    assert_eq!(ran.number(&["ledger", "failed"]), 0);
}

/// A database that cannot be reached is not bad input but a drill that could not be set up:
/// exit 3, one line naming the address, before anything is started. The connection string
/// points at a port bound and not listening, so nothing can answer there.
#[test]
fn an_external_database_that_cannot_be_reached_exits_3() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    drop(held);
    let dir = tempfile::tempdir().unwrap();
    let file = external_drill(dir.path(), "pg-unreachable", "");
    let dsn = format!("host=127.0.0.1 port={port} user=drill dbname=drill connect_timeout=3");
    let o = drill_with(
        &["run", &file, "--out", &dir.path().display().to_string()],
        &[("PLANT_DSN", dsn.as_str())],
    );
    let said = String::from_utf8_lossy(&o.stderr);
    println!("{}", said.trim());
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    assert_eq!(said.trim().lines().count(), 1, "one line: {said}");
    assert!(said.contains(&format!("127.0.0.1:{port}")), "{said}");
}
