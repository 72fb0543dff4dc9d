//! The examples users copy (`scenarios/examples/`): real engines nobody here wrote — a mosquitto
//! bridge (Debian `mosquitto`) and mq-bridge (PyPI `mq-bridge-basic`), both installed by
//! `ci/setup.sh` — drilled full length. Every drill must be conclusive and account for every
//! record (exit 0 or 1, never 2 or 3; no inconclusive reason; the ledger's sum holds; the
//! reader had no fault; records really flowed), and each must show its finding as measured:
//! mq-bridge passes; the mosquitto bridge makes copies only without a write key and loses at
//! most a record or two (5 runs: 1 lost once, 1 keyless copy twice, clean twice), and a loss
//! says where the record was last seen; mq-bridge on a full disk loses what it acknowledged.
//! rsyslog (Debian 8.2302, unpacked by `ci/setup.sh`) as a log shipper — RELP input, a
//! disk-assisted action queue, omrelp or omfwd out — loses what its queue held in memory when
//! it is SIGKILLed, on both outputs and into Kafka through omkafka (librdkafka 2.0.2, which
//! reaches drill's broker only through the Kafka-aware link's rewrite), and tailing a file
//! with imfile it also loses the rest of a file rotated while it was down (and, following a
//! glob, reads the files begun while it was down side by side, out of order); syslog-ng (Debian 3.38, unpacked the same way) with a
//! reliable disk buffer loses records around the half-open link over plain TCP. A kcat consumer
//! piped into a kcat producer, from a source topic into drill's destination, loses what its
//! consumer had committed and its producer still held at a kill.

use std::process::Command;

use crate::common::run::{expected_failed, have, have_rsyslogd, have_syslog_ng, seq_of};

fn drill_example(name: &str) -> serde_json::Value {
    let out = tempfile::tempdir().unwrap();
    let file = format!(
        "{}/scenarios/examples/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let output = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", &file, "--out"])
        .arg(out.path())
        .output()
        .expect("drill runs");
    let shown = format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(matches!(output.status.code(), Some(0 | 1)), "{shown}");
    let text = std::fs::read_to_string(out.path().join(name).join("report.json")).expect(&shown);
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let n = |f: &str| r["ledger"][f].as_u64().unwrap();
    assert_eq!(
        n("held"),
        n("delivered") + n("waiting") + n("failed") + n("lost"),
        "{shown}"
    );
    // The example did something — except where its finding is that delivery stopped (rsyslog's
    // disk queue after fsync errors and a power cut delivers only what came before the outage).
    let least = if name == "rsyslog-disk-queue-clock" {
        300
    } else {
        1000
    };
    assert!(n("delivered") > least, "{shown}");
    // Arrivals without a harness id: none, but where a full disk can tear what the engine
    // spools and it forwards the torn piece (mq-bridge on a full disk: 1 in one run of several).
    let unexpected_allowed = if name.ends_with("disk-full") { 3 } else { 0 };
    assert!(n("unexpected") <= unexpected_allowed, "{shown}");
    let verdict_pass = r["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["ok"] == true);
    assert_eq!(r["verdict"] == "pass", verdict_pass, "{shown}");
    assert_eq!(output.status.code() == Some(0), verdict_pass, "{shown}");
    assert!(
        !text.contains("verifier fault"),
        "the reader itself failed: {shown}"
    );
    assert_eq!(
        r["inconclusive"],
        serde_json::json!([]),
        "an inconclusive drill proves nothing: {shown}"
    );
    // A loss says where each lost record was last seen, and the classes add up to it (where
    // the links carry a protocol tap: syslog's do not, and the report says so).
    let lost = n("lost");
    if lost > 0 && !r["lost_last_seen"].is_null() {
        let seen = &r["lost_last_seen"];
        let class = |c: &str| seen[c]["count"].as_u64().unwrap();
        // The classes count every record missing at the destination, which is the lost ones
        // and any the engine still holds (it says so: waiting or failed).
        let missing = seen["missing"].as_u64().unwrap();
        assert!(missing >= lost, "{seen}");
        assert_eq!(
            class("never_left") + class("no_answer") + class("broker_lost"),
            missing,
            "{seen}"
        );
    }
    r
}

/// The mosquitto bridge carries no write key, so every copy it makes is one "without the
/// original's write key"; a SIGKILL between a PUBACK and mosquitto's next snapshot loses what
/// it acknowledged since. Measured over 5 seeds: lost 1 once, 1 keyless copy twice, clean
/// twice: the loss is bounded here at 3. How many copies it makes depends on the machine's
/// load, not on drill: 0–1 on a quiet machine, 558 once in CI with eight tests at once (the
/// bridge resent a backlog it had already delivered). So only their kind is asserted: none
/// carries the original's key.
#[test]
fn the_mosquitto_bridge_example_loses_at_most_a_few_and_copies_without_a_key() {
    let r = drill_example("mosquitto-bridge");
    let l = &r["ledger"];
    println!("mosquitto bridge: {l}");
    assert!(l["delivered"].as_u64().unwrap() > 3000);
    assert!(l["lost"].as_u64().unwrap() <= 3, "{l}");
    assert_eq!(l["duplicates_same_key"], 0, "it has no write key: {l}");
    assert_eq!(
        l["duplicates_other_key"], l["duplicates"],
        "every copy is one without a key: {l}"
    );
}

/// mq-bridge keeps its spool across the kill and names its message id as the write key: it
/// passes (5 seeds of 5 on a quiet machine). Under CI's load it once delivered one record out
/// of order ("Reordered 1"): what it promises is asserted (nothing lost, no copy beyond
/// at_least_once), and its order within a few records.
#[test]
fn the_mq_bridge_example_passes() {
    let r = drill_example("mq-bridge");
    let l = &r["ledger"];
    println!("mq-bridge: {} {l}", r["headline"]);
    assert!(l["delivered"].as_u64().unwrap() > 3000);
    assert_eq!(l["lost"], 0, "{}", r["headline"]);
    assert_eq!(l["duplicates_beyond_promise"], 0, "{}", r["headline"]);
    assert!(l["reordered"].as_u64().unwrap() <= 3, "{}", r["headline"]);
}

/// mq-bridge's spool on a disk that fills up (drill's power-cut filesystem, `fill_disk`): the
/// finding is that mq-bridge 1.2.0 answers 202 for records it could not write, so they are
/// lost. drill must see that loss: records lost, none of them refused at ingest.
#[test]
fn the_mq_bridge_disk_full_example_shows_acknowledged_records_lost() {
    let root = nix::unistd::geteuid().is_root();
    let fuse = std::path::Path::new("/dev/fuse").exists();
    if !(root && fuse) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI=true and no FUSE here (root: {root}, /dev/fuse: {fuse})"
        );
        println!("skipped: fill_disk needs root and /dev/fuse");
        return;
    }
    let r = drill_example("mq-bridge-disk-full");
    let l = &r["ledger"];
    println!("mq-bridge on a full disk: {l}");
    // Measured: 400 of 1500 (what it acknowledged while the disk was full); bounded both
    // ways, so a drill that lost everything, or one record, does not pass for this finding.
    let lost = l["lost"].as_u64().unwrap();
    assert!((200..=800).contains(&lost), "{l}");
    assert_eq!(l["ingest_refused"], 0, "mq-bridge refused nothing: {l}");
    // The records it acknowledged and could not spool never left it.
    let seen = &r["lost_last_seen"];
    assert_eq!(seen["never_left"]["count"], seen["missing"], "{seen}");
}

/// rsyslog with a RELP input, a disk-assisted action queue (LinkedList, `queue.filename`,
/// `saveOnShutdown`) and omrelp out, SIGKILLed 8 s into a half-open window: the queue's
/// in-memory part held everything acknowledged since the window began, and the kill takes
/// it — a disk-assisted queue goes to disk only when memory fills or at a clean shutdown.
/// Measured: 400 lost (8 s × 50/s), 2 copies without a write key (rsyslog has none).
#[test]
fn the_rsyslog_omrelp_example_loses_what_its_memory_queue_held_at_the_kill() {
    if !have_rsyslogd() {
        return;
    }
    let r = drill_example("rsyslog-omrelp");
    let l = &r["ledger"];
    println!("rsyslog omrelp: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    // Measured: 400 (8 s × 50/s held in memory at the kill); bounded both ways.
    let lost = l["lost"].as_u64().unwrap();
    assert!((200..=600).contains(&lost), "{l}");
    assert_eq!(l["duplicates_same_key"], 0, "it has no write key: {l}");
    assert!(
        l["sent_unconfirmed_missing"].is_null(),
        "RELP confirms: {l}"
    );
}

/// The same shipper with ompgsql into PostgreSQL (an INSERT per message, keyed by rsyslog's
/// `%uuid%`, ON CONFLICT DO NOTHING): the destination changes nothing about the queue — the kill
/// takes what its memory held. Measured: 400 lost, no copy.
#[test]
fn the_rsyslog_ompgsql_example_loses_what_its_memory_queue_held_at_the_kill() {
    let ompgsql = have(
        "rsyslog-pgsql",
        &[
            "/usr/lib/x86_64-linux-gnu/rsyslog/ompgsql.so",
            "~/.cache/drill/rsyslog/usr/lib/x86_64-linux-gnu/rsyslog/ompgsql.so",
        ],
    );
    if !(ompgsql && have_rsyslogd() && crate::common::run::have_postgres()) {
        return;
    }
    let r = drill_example("rsyslog-ompgsql");
    let l = &r["ledger"];
    println!("rsyslog ompgsql: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    assert!(l["lost"].as_u64().unwrap() >= 200, "{l}");
    assert_eq!(l["duplicates_beyond_promise"], 0, "{l}");
}

/// The same shipper with omkafka (Debian's rsyslog-kafka, on librdkafka 2.0.2) into drill's
/// Kafka destination. That librdkafka cannot read tansu's ApiVersions answer: without the
/// Kafka-aware link's rewrite the engine never connected and the drill read "every record
/// lost". With it, rsyslog delivers; a SIGKILL in the middle of the refusal takes what its
/// memory queue and librdkafka's held, and the tap says none of it left the engine. Measured:
/// 200 lost (4 s × 50/s), all "never left the engine", 2 copies without a write key.
#[test]
fn the_rsyslog_omkafka_example_connects_through_the_rewrite_and_loses_what_it_held_at_the_kill() {
    let omkafka = have(
        "rsyslog-kafka",
        &[
            "/usr/lib/x86_64-linux-gnu/rsyslog/omkafka.so",
            "~/.cache/drill/rsyslog/usr/lib/x86_64-linux-gnu/rsyslog/omkafka.so",
        ],
    );
    if !(omkafka && have_rsyslogd()) {
        return;
    }
    let r = drill_example("rsyslog-omkafka");
    let l = &r["ledger"];
    println!("rsyslog omkafka: {} {l}", r["headline"]);
    let trimmed = r["link"]["api_versions_trimmed"].as_u64().unwrap_or(0);
    assert!(
        trimmed > 0,
        "the link rewrote no ApiVersions answer: {}",
        r["link"]
    );
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    let lost = l["lost"].as_u64().unwrap();
    assert!((100..=400).contains(&lost), "{l}");
    assert_eq!(
        r["lost_last_seen"]["never_left"]["count"], lost,
        "held in the engine at the kill: {}",
        r["lost_last_seen"]
    );
    assert_eq!(l["duplicates_same_key"], 0, "it has no write key: {l}");
}

/// Two kcat (Debian's 1.7, librdkafka 2.0.2) joined by a pipe: a consumer in a group on the
/// source topic, a producer into drill's destination. Its consumer commits what it has
/// printed, every second; what the producer still held in memory when the SIGKILL came was
/// committed already, and lost. Measured: 115 lost in 2 runs of 2, every one under
/// "checkpoint ahead of the store", the group at the topic's end (offset 2000).
#[test]
fn the_kcat_pipe_example_loses_what_its_consumer_committed_and_its_producer_held() {
    if !have("kcat", &["/usr/bin/kcat"]) {
        return;
    }
    let r = drill_example("kcat-pipe");
    let l = &r["ledger"];
    println!("kcat pipe: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    let lost = l["lost"].as_u64().unwrap();
    // Refused at 8 s, killed at 12 s, 50 records/s: at most those 4 s and what was in flight.
    assert!((50..=300).contains(&lost), "{l}");
    assert_eq!(
        r["checkpoint_ahead"]["count"], lost,
        "every lost record was behind its committed offset: {}",
        r["checkpoint_ahead"]
    );
    assert!(
        r["checkpoint_ahead"]["checkpoint"] == "committed offset 2000",
        "{}",
        r["checkpoint_ahead"]
    );
}

/// The same shipper with omfwd over plain TCP: the same loss at the kill, and on a destination
/// that cannot confirm, drill cannot see which of a user's engine's records left it, so every
/// missing record counts as lost and the report says so.
#[test]
fn the_rsyslog_omfwd_example_loses_records_and_cannot_split_them() {
    if !have_rsyslogd() {
        return;
    }
    let r = drill_example("rsyslog-omfwd");
    let l = &r["ledger"];
    println!("rsyslog omfwd: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    assert_eq!(r["promise"], "at_most_once");
    assert!(l["lost"].as_u64().unwrap() >= 200, "{l}");
    assert!(l["sent_unconfirmed_missing"].is_null(), "{l}");
    let notes = r["notes"].to_string();
    assert!(notes.contains("cannot be told"), "{notes}");
}

/// syslog-ng's network() destination over plain TCP with `disk-buffer(reliable(yes))`: what it
/// writes into the half-open link is taken by the OS and gone, and nothing tells syslog-ng.
/// drill sees no attempts of a user's engine and the destination never confirms, so it cannot
/// split that from what the kill took: every missing record counts, and no fault window
/// excuses it under at_most_once. Measured: 648 and 649 lost.
#[test]
fn the_syslog_ng_example_loses_records_around_the_half_open_link() {
    if !(have_syslog_ng() && have_rsyslogd()) {
        return;
    }
    let r = drill_example("syslog-ng-disk-buffer");
    let l = &r["ledger"];
    println!("syslog-ng disk buffer: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    assert!(l["lost"].as_u64().unwrap() >= 200, "{l}");
    assert_eq!(l["duplicates"], 0, "{l}");
}

/// Whether syslog-ng's http() module is here (Debian's syslog-ng-mod-http, installed or
/// unpacked by ci/setup.sh); under CI=true `have` fails when it is not.
fn have_syslog_ng_http() -> bool {
    have(
        "syslog-ng-mod-http",
        &[
            "/usr/lib/syslog-ng/3.38/libhttp.so",
            "~/.cache/drill/syslog-ng/usr/lib/syslog-ng/3.38/libhttp.so",
        ],
    )
}

/// The same syslog-ng with its http() destination and a reliable disk buffer, POSTing each
/// message with its unique id as the Idempotency-Key to drill's endpoint: through the half-open
/// link, the SIGKILL in the middle of it and a 503 window it lost nothing and stored no extra
/// copy (measured: 2349 held, 2349 delivered). HTTP answers each request, so what the link
/// swallowed was never taken for delivered — unlike the same shipper over plain TCP above.
#[test]
fn the_syslog_ng_http_example_keeps_everything_through_the_outages() {
    if !have_syslog_ng_http() {
        return;
    }
    let r = drill_example("syslog-ng-http");
    let l = &r["ledger"];
    println!("syslog-ng http: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "pass", "{}", r["headline"]);
    assert_eq!(l["lost"], 0, "{l}");
    assert_eq!(l["duplicates_beyond_promise"], 0, "{l}");
}

/// The same syslog-ng shipping in batches of up to 20 to an Elasticsearch-style `_bulk`
/// endpoint that answers 200 and rejects items inside the answer (one in ten 429 for 6 s, then
/// one in twenty 400 for 4 s): syslog-ng judges a batch by the request's status, so every
/// rejected item is lost — the 429s never sent again, the 400s never counted. Measured: 78
/// lost of 1800 (59 rejected 429 + 19 refused 400), the verdict expecting 19 failed, 0 copies.
#[test]
fn the_syslog_ng_bulk_example_loses_every_item_the_200_answer_rejected() {
    if !have_syslog_ng_http() {
        return;
    }
    let r = drill_example("syslog-ng-http-bulk");
    let l = &r["ledger"];
    println!("syslog-ng http bulk: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    let lost = l["lost"].as_u64().unwrap();
    assert!(
        (70..=130).contains(&lost),
        "~60 rejected 429 + ~20 refused 400: {l}"
    );
    let refused = expected_failed(&r);
    assert!((15..=35).contains(&refused), "{refused}");
    assert!(lost > refused, "the 429s are lost too: {l}");
    assert_eq!(l["failed"], 0, "{l}");
    assert_eq!(l["duplicates"], 0, "{l}");
}

/// rsyslog tailing the file drill writes (imfile, inotify, its state written after every line)
/// and forwarding over RELP. A SIGKILL in the middle of a refused link takes what its memory
/// queue held, though the state file had passed it; the file rotated while it is down leaves
/// the old file's rest unread for good, since imfile watches only the name. Measured: 351 lost
/// (about 250 read and queued in memory from 5 s to the kill at 10 s, about 100 written to the
/// old file between the kill and the rotation at 12 s), none destroyed (drill removed nothing);
/// 350 in CI, with none of them behind its state files once.
#[test]
fn the_rsyslog_imfile_example_loses_its_memory_queue_and_the_rotated_files_rest() {
    if !have_rsyslogd() {
        return;
    }
    let r = drill_example("rsyslog-imfile");
    let l = &r["ledger"];
    println!("rsyslog imfile: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    let lost = l["lost"].as_u64().unwrap();
    assert!((250..=450).contains(&lost), "{l}");
    assert!(l["destroyed"].is_null() || l["destroyed"] == 0, "{l}");
    // imfile's state files (one per inode) had passed what the kill took from the memory queue,
    // not the rotated file's unread rest: 250 here on a quiet machine. Under CI's load it was 0
    // once (350 lost all the same): the cause is not verified — likely its state not yet
    // written for what it had queued, so those were lost to the rotation instead. The state
    // files are read either way.
    let ahead = r["checkpoint_ahead"]["count"].as_u64().unwrap_or(0);
    assert!(
        ahead <= 320 && ahead < lost,
        "{:#} {:#}",
        r["checkpoint_ahead"],
        r["notes"]
    );
    assert!(
        r["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.starts_with("the engine's checkpoint after the drain: inode"))),
        "its state files were not read: {:#}",
        r["notes"]
    );
    assert!(
        r["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.starts_with("source: rotated (rename): app.log → app.log.1"))),
        "{:#}",
        r["notes"]
    );
    // What it lost was written between the refusal (5 s) and the rotation (12 s): at 50/s over
    // 4 keys, sequences per key from about 60 to 150.
    for id in r["missing_examples"].as_array().unwrap() {
        assert!((40..=160).contains(&seq_of(id)), "{id}");
    }
}

/// rsyslog following a glob (imfile with a wildcard): a new numbered file every 3 s, rsyslogd
/// stopped from 10 s to 16 s while two begin. It reads the files that began while it was down
/// side by side, not one after the other: measured 221–222 records out of order in 3 runs
/// (drill's own engine: 0, `file-glob-rotate`), and 1–2 lost (k1/58 each time, written ~0.4 s
/// before the refusal, behind its state files and never seen on the link; why is not verified)
/// with 2 copies.
#[test]
fn the_rsyslog_imfile_glob_example_reads_the_files_begun_while_it_was_down_side_by_side() {
    if !have_rsyslogd() {
        return;
    }
    let r = drill_example("rsyslog-imfile-glob");
    let l = &r["ledger"];
    println!("rsyslog imfile glob: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    let reordered = l["reordered"].as_u64().unwrap();
    assert!((100..=500).contains(&reordered), "{l}");
    assert!(l["lost"].as_u64().unwrap() <= 10, "{l}");
    assert!(l["duplicates"].as_u64().unwrap() <= 10, "{l}");
    assert!(l["destroyed"].is_null() || l["destroyed"] == 0, "{l}");
    let notes = r["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n.as_str().is_some_and(|n| n
            .starts_with("source: rotated (create): app-000002.log begun after app-000001.log"))),
        "{notes:#?}"
    );
    assert!(
        notes.iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.starts_with("the engine's checkpoint after the drain: inode"))),
        "its state files were not read: {notes:#?}"
    );
}

/// syslog-ng tailing the file drill writes (file(), its position in its persist file) with a
/// reliable disk buffer: the SIGKILL in the middle of a refused link takes nothing it had read
/// (the buffer is on disk), but the file rotated while it is down leaves the old file's rest
/// unread for good, since the source follows the name. Measured: 101 and 102 lost, every one
/// written between the kill (10 s) and the rotation (12 s), 0 copies; 156 under CI's load
/// (`follow-freq(1)`: it reads the file once a second, so it may be up to a second behind at
/// the kill).
#[test]
fn the_syslog_ng_file_example_loses_the_rotated_files_rest() {
    if !(have_syslog_ng() && have_rsyslogd()) {
        return;
    }
    let r = drill_example("syslog-ng-file");
    let l = &r["ledger"];
    println!("syslog-ng file: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    let lost = l["lost"].as_u64().unwrap();
    assert!((80..=180).contains(&lost), "{l}");
    // 9 s (a second behind) to 12 s at 50/s over 4 keys: sequences per key from about 112 to
    // 150; under CI's load it was once several seconds behind (from sequence 44, 158 lost), so
    // only the end is bounded: nothing written after the rotation is lost.
    for id in r["missing_examples"].as_array().unwrap() {
        assert!(seq_of(id) <= 160, "{id}");
    }
}

/// rsyslog forwarding from a pure disk queue that syncs every message, through an outage with
/// a +2 h clock jump, 6 s of fsync errors, then a power cut. Measured, each fault alone and all
/// together (2026-12-07): the clock jump disturbs nothing (its retries go on every second, its
/// own log's stamps jump two hours); the fsync errors go unnoticed (no line in its log) and, with
/// no cut, lose nothing; the power cut alone loses nothing (it restarts with its 600 queued
/// messages). Together: the cut throws away what the failed fsyncs never wrote (202 writes), the
/// queue does not start again ("error starting up action queue"), and rsyslog goes on answering
/// RELP for every new message and forwards none: 1501 lost, the queue's 600 and the 900 taken
/// after the restart.
#[test]
fn the_rsyslog_disk_queue_after_fsync_errors_and_a_power_cut_takes_messages_it_never_forwards() {
    use crate::common::run::required;
    if !(have_rsyslogd()
        && required(
            std::path::Path::new("/dev/fuse").exists() && nix::unistd::Uid::effective().is_root(),
            "FUSE (/dev/fuse) and root",
        )
        && required(drill::clock::libfaketime().is_some(), "libfaketime"))
    {
        return;
    }
    let r = drill_example("rsyslog-disk-queue-clock");
    let l = &r["ledger"];
    println!("rsyslog disk queue: {} {l}", r["headline"]);
    assert_eq!(r["verdict"], "fail", "{}", r["headline"]);
    let lost = l["lost"].as_u64().unwrap();
    assert!((800..=2000).contains(&lost), "{l}");
    let notes: Vec<&str> = r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    for said in [
        "the engine's disk answered ",
        "at 12 s the engine's wall clock jumped +2h",
    ] {
        assert!(
            notes.iter().any(|n| n.starts_with(said)),
            "{said}: {notes:#?}"
        );
    }
}

/// drill's MQTT ingest in MQTT 3.1.1 (`version: "3.1.1"`, for listeners that speak nothing
/// newer: RabbitMQ's MQTT plugin, older bridges), against mosquitto as the engine: every record
/// is acknowledged and delivered, and mosquitto's own log says the client spoke MQTT 3.1.1
/// (`p2` in mosquitto's numbering) — MQTT 5 (`p5`) without `version`.
#[test]
fn the_mqtt_ingest_speaks_3_1_1_where_asked() {
    if !have("mosquitto", &["/usr/sbin/mosquitto"]) {
        return;
    }
    let examples = format!("{}/scenarios/examples", env!("CARGO_MANIFEST_DIR"));
    let drill = |version: &str| {
        let out = tempfile::tempdir().unwrap();
        let name = format!("mqtt-ingest-v{}", version.replace('.', ""));
        let version_field = match version {
            "5" => String::new(),
            v => format!(", version: \"{v}\""),
        };
        let text = format!(
            "name: {name}\nabout: drill's MQTT ingest into a mosquitto bridge, protocol {version}, no faults, every record arrives.\nscenario_dir: {examples}\ntags: [examples]\ndestination: {{ kind: mqtt, runtime: process, topic: drill/{name} }}\nsystem:\n  command: [mosquitto, -c, \"{{work_dir}}/mosquitto.conf\"]\n  files: {{ mosquitto.conf: mosquitto-bridge.conf.tmpl }}\n  ingest: {{ kind: mqtt, topic: in/x{version_field} }}\n  ready: {{ tcp: true, within: 10s }}\n  promise: at_least_once\nworkload: {{ rate: 50/s, duration: 8s, keys: 4 }}\nexpect: {{ lost: 0, reordered: 0 }}\n"
        );
        let file = out.path().join(format!("{name}.yaml"));
        std::fs::write(&file, text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_drill"))
            .args(["run"])
            .arg(&file)
            .arg("--out")
            .arg(out.path())
            .output()
            .expect("drill runs");
        let shown = format!(
            "exit {:?}\n{}\n{}",
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(output.status.code(), Some(0), "{shown}");
        let dir = out.path().join(&name);
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap())
                .unwrap();
        let log = std::fs::read_to_string(dir.join("engine.log")).unwrap_or_default();
        let connected = log
            .lines()
            .find(|l| l.contains("as drill-ingest-"))
            .unwrap_or_else(|| panic!("no ingest connection in mosquitto's log:\n{log}"))
            .to_string();
        (r["ledger"]["delivered"].as_u64().unwrap(), connected)
    };
    let (v311, v5) = std::thread::scope(|s| {
        let a = s.spawn(|| drill("3.1.1"));
        let b = s.spawn(|| drill("5"));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(v311.0, 400, "{}", v311.1);
    // mosquitto numbers its protocols itself: p2 is MQTT 3.1.1 (p1 3.1), p5 is MQTT 5.
    assert!(v311.1.contains("(p2,"), "{}", v311.1);
    assert_eq!(v5.0, 400, "{}", v5.1);
    assert!(v5.1.contains("(p5,"), "{}", v5.1);
}
