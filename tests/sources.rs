//! Sources the engine pulls from (`system.ingest: { kind: file | kafka | postgres_outbox }`):
//! the catalogue's source drills pass the correct engine and fail its input mutants with the
//! count the fault makes, records drill's own fault destroyed are a ledger line of their own,
//! and `drill check` points at a bad source spec's field.

use crate::common::run::{
    Ran, catalogue_drill_fails_mutant, catalogue_drill_passes, drill, required, scenario, seq_of,
    show,
};

/// Both runs at once: the correct engine and a mutant on the same drill.
fn correct_and_mutant(name: &str, mutant: &str) -> (Ran, Ran) {
    std::thread::scope(|s| {
        let correct = s.spawn(|| catalogue_drill_passes(name));
        let broken = s.spawn(|| catalogue_drill_fails_mutant(name, mutant));
        (correct.join().unwrap(), broken.join().unwrap())
    })
}

/// The engine is stopped from 6 s to 12 s and the file renamed away at 9 s: the correct engine
/// finishes the old file from its checkpoint, then reads the new one; `skip-on-rotate` follows
/// the name and loses the old file's lines written between the stop and the rotation (3 s at
/// 100 lines/s).
#[cfg(feature = "mutants")]
#[test]
fn a_rotation_while_the_engine_is_down_is_followed_by_inode() {
    let (correct, broken) = correct_and_mutant("file-rotate-during-outage", "skip-on-rotate");
    assert_eq!(correct.number(&["ledger", "held"]), 2000);
    assert_eq!(correct.number(&["ledger", "lost"]), 0);
    assert_eq!(correct.number(&["ledger", "delivered"]), 2000);
    // Rotated 3 s after the stop at 100 lines/s: about 300 lines the engine had not read.
    let rotated = correct
        .markdown
        .lines()
        .find(|l| l.contains("source: rotated (rename): app.log → app.log.1, "))
        .unwrap_or_else(|| panic!("{}", correct.markdown));
    let unread: u64 = rotated
        .split(", ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{rotated}"));
    assert!((250..=350).contains(&unread), "{rotated}");
    let lost = broken.number(&["ledger", "lost"]);
    assert!(
        (250..=350).contains(&lost),
        "lost {lost}: {:#}",
        broken.report
    );
    assert!(
        broken.report["checkpoint_ahead"].is_object(),
        "its checkpoint passed what it skipped: {:#}",
        broken.report
    );
    // What it lost is what was written while it was down, before the rotation: ids past the
    // first 550 records and before the 950th.
    for id in broken.report["missing_examples"].as_array().unwrap() {
        assert!(
            (130..=240).contains(&seq_of(id)),
            "{id} (sequence per key of 4 keys)"
        );
    }
}

/// A glob (`app-*.log`), a new numbered file every 2 s, the engine stopped from 6 s to 12 s:
/// the correct engine finishes the file its checkpoint is in, then each later one by name;
/// `skip-on-rotate` jumps to the newest at its old offset and loses the ~6 s between, every
/// record of it behind its checkpoint.
#[cfg(feature = "mutants")]
#[test]
fn a_glob_is_followed_file_by_file_through_an_outage() {
    let (correct, broken) = correct_and_mutant("file-glob-rotate", "skip-on-rotate");
    assert_eq!(correct.number(&["ledger", "held"]), 2000);
    assert_eq!(correct.number(&["ledger", "lost"]), 0);
    assert_eq!(correct.number(&["ledger", "delivered"]), 2000);
    let rotations = correct
        .markdown
        .matches("source: rotated (create): app-0000")
        .count();
    assert!((8..=10).contains(&rotations), "{}", correct.markdown);
    assert!(
        correct
            .markdown
            .contains("app-000002.log begun after app-000001.log"),
        "{}",
        correct.markdown
    );
    let lost = broken.number(&["ledger", "lost"]);
    assert!(
        (450..=750).contains(&lost),
        "lost {lost}: {:#}",
        broken.report
    );
    assert_eq!(
        broken.number(&["checkpoint_ahead", "count"]),
        lost,
        "{:#}",
        broken.report
    );
}

/// The engine is stopped from 6 s to 10 s and the file cut to zero at 8 s: what it had not
/// read is destroyed by the source fault, never lost; it notices the cut on its restart and
/// reads the file again from the start. A line written in two write() calls a second apart
/// (at 2 s) is taken whole.
#[test]
fn a_cut_file_destroys_what_the_engine_had_not_read_and_none_of_it_is_lost() {
    let ran = catalogue_drill_passes("file-truncate");
    let destroyed = ran.number(&["ledger", "destroyed"]);
    // 2 s at 100 lines/s between the stop and the cut, less what the engine read while it
    // was stopping.
    assert!(
        (120..=230).contains(&destroyed),
        "{destroyed}: {:#}",
        ran.report
    );
    let l = &ran.report["ledger"];
    assert_eq!(
        l["held"].as_u64().unwrap(),
        l["delivered"].as_u64().unwrap() + destroyed,
        "{l:#}"
    );
    assert!(
        ran.markdown
            .contains(&format!("+ {destroyed} destroyed by the source fault")),
        "{}",
        ran.markdown
    );
    assert!(
        ran.markdown
            .contains("Destroyed by the source fault (never read by the engine)")
    );
    assert!(
        ran.markdown
            .contains("| source | stall 1s (a line half written) |")
    );
    assert_eq!(ran.number(&["ledger", "altered"]), 0);
    assert_eq!(ran.number(&["ledger", "unexpected"]), 0);
}

/// A power cut at the record log's fdatasync while the tail stores a burst: the correct
/// engine's checkpoint is still before the batch the cut took; `checkpoint-before-store`
/// moved it at read time and loses that batch, every record of it under "checkpoint ahead of
/// the store".
#[cfg(feature = "mutants")]
#[test]
fn a_checkpoint_moved_at_read_time_loses_the_batch_a_power_cut_takes() {
    if !required(
        std::path::Path::new("/dev/fuse").exists() && nix::unistd::Uid::effective().is_root(),
        "FUSE (/dev/fuse) and root",
    ) {
        return;
    }
    let (correct, broken) = correct_and_mutant("file-power-cut", "checkpoint-before-store");
    assert_eq!(correct.number(&["ledger", "lost"]), 0);
    assert!(correct.report["checkpoint_ahead"].is_null());
    let lost = broken.number(&["ledger", "lost"]);
    // One batch of the tail: what 20 ms brought at 200 lines/s, a few lines.
    assert!((1..=40).contains(&lost), "lost {lost}: {:#}", broken.report);
    assert_eq!(
        broken.number(&["checkpoint_ahead", "count"]),
        lost,
        "{:#}",
        broken.report
    );
    assert!(broken.markdown.contains("## Checkpoint ahead of the store"));
}

/// `file-power-cut` with drill's own engine driven as a user's engine, its checkpoint read
/// from its stats endpoint (`checkpoint: { from: stats }`) instead of its checkpoint file: the
/// correct engine's stats checkpoint passes nothing lost; `checkpoint-before-store`'s passes
/// every record the cut took, read once the drain is over, before drill stops the engine.
#[cfg(feature = "mutants")]
#[test]
fn a_checkpoint_read_from_the_engines_stats_finds_what_ran_ahead() {
    if !required(
        std::path::Path::new("/dev/fuse").exists() && nix::unistd::Uid::effective().is_root(),
        "FUSE (/dev/fuse) and root",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = |name: &str, mutant: &str| {
        let drill = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/file-power-cut.yaml"),
        )
        .unwrap();
        let system = format!(
            r#"system:
  command: [drill, engine, --config, "{{work_dir}}/engine.yaml"]
  files: {{ engine.yaml: "{}/builtin-engine-tail.yaml.tmpl" }}
{mutant}  ingest:
    kind: file
    path: app.log
    checkpoint: {{ from: stats, offset: /tail/offset, inode: /tail/inode }}
  ready: {{ http: /stats, port: api }}
  stats: {{ path: /stats, port: api }}
  write_key: {{ mqtt_user_property: write-key }}
  promise: at_least_once
"#,
            crate::common::run::fixtures()
        );
        let drill = drill
            .replace("name: file-power-cut", &format!("name: {name}"))
            .replace(
                "system:\n  ingest: { kind: file, path: app.log }\n",
                &system,
            );
        assert!(drill.contains("from: stats"), "{drill}");
        scenario(dir.path(), name, &drill)
    };
    let correct = text("stats-correct", "");
    let broken = text(
        "stats-broken",
        "  env: { DRILL_MUTANT: checkpoint-before-store }\n",
    );
    let (correct, broken) = std::thread::scope(|s| {
        let c = s.spawn(|| crate::common::run::run_drill(&correct, "stats-correct", &[]));
        let b = s.spawn(|| crate::common::run::run_drill(&broken, "stats-broken", &[]));
        (c.join().unwrap(), b.join().unwrap())
    });
    let from_stats = |ran: &Ran| {
        ran.report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("(from the engine's stats)"))
    };
    assert_eq!(
        correct.number(&["ledger", "lost"]),
        0,
        "{:#}",
        correct.report
    );
    assert!(correct.report["checkpoint_ahead"].is_null());
    assert!(from_stats(&correct), "{:#}", correct.report["notes"]);
    let lost = broken.number(&["ledger", "lost"]);
    assert!((1..=40).contains(&lost), "lost {lost}: {:#}", broken.report);
    assert_eq!(
        broken.number(&["checkpoint_ahead", "count"]),
        lost,
        "{:#}",
        broken.report
    );
    assert!(from_stats(&broken), "{:#}", broken.report["notes"]);
    assert!(
        broken.report["checkpoint_ahead"]["checkpoint"]
            .as_str()
            .unwrap()
            .ends_with("(from the engine's stats)"),
        "{:#}",
        broken.report["checkpoint_ahead"]
    );
}

/// The engine consumes a source topic; its link to the source is refused for 6 s and a power
/// cut lands on its second record fdatasync while it drains the backlog. The correct engine
/// moved its position only after the store and reads the cut burst again; `commit-on-poll`
/// committed it at poll time and loses it, every record of it behind the committed offset.
#[cfg(feature = "mutants")]
#[test]
fn a_commit_at_poll_time_loses_the_burst_a_power_cut_takes() {
    if !required(
        std::path::Path::new("/dev/fuse").exists() && nix::unistd::Uid::effective().is_root(),
        "FUSE (/dev/fuse) and root",
    ) {
        return;
    }
    let (correct, broken) = correct_and_mutant("kafka-source-kill-mid-drain", "commit-on-poll");
    assert_eq!(correct.number(&["ledger", "held"]), 3200);
    assert_eq!(correct.number(&["ledger", "lost"]), 0);
    assert_eq!(correct.number(&["ledger", "delivered"]), 3200);
    assert!(correct.report["checkpoint_ahead"].is_null());
    assert!(
        correct.markdown.contains("committed offset 3200"),
        "{}",
        correct.markdown
    );
    let lost = broken.number(&["ledger", "lost"]);
    // One burst of the drain: up to 500 records.
    assert!(
        (1..=500).contains(&lost),
        "lost {lost}: {:#}",
        broken.report
    );
    assert_eq!(
        broken.number(&["checkpoint_ahead", "count"]),
        lost,
        "{:#}",
        broken.report
    );
}

/// The engine polls an outbox table; its link to the database is refused for 6 s and a power
/// cut lands on its second record fdatasync while it drains the pile of unmarked rows. The
/// correct engine marks rows only once stored and polls the cut burst again; `mark-on-poll`
/// marked it at poll time and loses it, every record of it behind the marks.
#[cfg(feature = "mutants")]
#[test]
fn an_outbox_marked_at_poll_time_loses_the_burst_a_power_cut_takes() {
    if !required(
        std::path::Path::new("/dev/fuse").exists() && nix::unistd::Uid::effective().is_root(),
        "FUSE (/dev/fuse) and root",
    ) {
        return;
    }
    let (correct, broken) = correct_and_mutant("outbox-kill-mid-drain", "mark-on-poll");
    assert_eq!(correct.number(&["ledger", "held"]), 3200);
    assert_eq!(correct.number(&["ledger", "lost"]), 0);
    assert_eq!(correct.number(&["ledger", "delivered"]), 3200);
    assert!(correct.report["checkpoint_ahead"].is_null());
    assert!(
        correct
            .markdown
            .contains("3200 rows marked or deleted, 0 left"),
        "{}",
        correct.markdown
    );
    let lost = broken.number(&["ledger", "lost"]);
    // One burst of the drain: up to 500 rows.
    assert!(
        (1..=500).contains(&lost),
        "lost {lost}: {:#}",
        broken.report
    );
    assert_eq!(
        broken.number(&["checkpoint_ahead", "count"]),
        lost,
        "{:#}",
        broken.report
    );
}

/// `drill check` names the file, the line and the field of a bad source spec, and says what
/// to write.
#[test]
fn a_bad_source_spec_is_refused_with_its_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let head = "name: s\ndestination: { kind: mqtt }\nworkload: { rate: 10/s, duration: 10s }\n";
    let cases = [
        (
            "system:\n  ingest: { kind: file, rotate: { every: often } }\n",
            "field `system.ingest.rotate.every`: `often` is neither a time (10s) nor a size",
            5,
        ),
        (
            "system:\n  ingest: { kind: file, path: logs/app.log }\n",
            "field `system.ingest.path`: `logs/app.log` must be a plain file name",
            5,
        ),
        (
            "system:\n  ingest: { kind: file, path: \"a*b*.log\" }\n",
            "field `system.ingest.path`: `a*b*.log` must be a plain file name",
            5,
        ),
        (
            "system:\n  ingest: { kind: file, path: \"a-*.log\", rotate: { every: 1s, mode: rename } }\n",
            "field `system.ingest.rotate.mode`: `rename` with a `*` in `system.ingest.path`",
            5,
        ),
        (
            "system:\n  ingest: { kind: file, rotate: { every: 1s, mode: create } }\n",
            "field `system.ingest.rotate.mode`: `create` begins each file under a new name",
            5,
        ),
        (
            "system:\n  ingest: { kind: http }\n",
            "field `system.ingest`: `kind: http` goes with `system.command`",
            5,
        ),
        (
            "faults:\n  - { at: 2s, target: source, action: rotate }\n",
            "field `faults[0].target`: `source` faults act on the file the engine tails",
            5,
        ),
        (
            "system:\n  ingest: { kind: file }\nfaults:\n  - { at: 2s, target: source, action: stall }\n",
            "field `faults[0].for`: missing; how long the line stays half written",
            7,
        ),
        (
            "system:\n  ingest: { kind: file }\nfaults:\n  - { at: 2s, target: source, action: kill }\n",
            "field `faults[0].action`: `kill`: the source takes rotate, truncate, delete or stall",
            7,
        ),
        (
            "system:\n  ingest: { kind: file, checkpoint: { file: /etc/x, offset: /o } }\n",
            "field `system.ingest.checkpoint.file`: `/etc/x` must be a path inside the engine's data folder",
            5,
        ),
        (
            "system:\n  ingest: { kind: file, checkpoint: { from: stats, file: x.json, offset: /o } }\n",
            "field `system.ingest.checkpoint.file`: `x.json` with `from: stats`",
            5,
        ),
        (
            "system:\n  ingest: { kind: file, checkpoint: { offset: /o } }\n",
            "field `system.ingest.checkpoint.file`: missing; name the engine's checkpoint file",
            5,
        ),
        (
            "system:\n  command: [cat, \"{ingest.path}\"]\n  ingest: { kind: file, checkpoint: { from: stats, offset: /o } }\n",
            "field `system.ingest.checkpoint.from`: `stats` reads the engine's stats endpoint, and `system.stats` names none",
            6,
        ),
        (
            "system:\n  command: [cat, \"{ingest.path}\"]\n  ingest: { kind: http }\n",
            "field `system.command[1]`: `{ingest.path}` is the file drill writes for `ingest: { kind: file }`",
            5,
        ),
        (
            "system:\n  ingest: { kind: file, rotate: { every: 99999999999999999MB } }\n",
            "a size of at least 256 bytes",
            5,
        ),
        (
            "system:\n  ingest: { kind: kafka, topic: \"a b\" }\n",
            "field `system.ingest.topic`: `a b` must be 1 to 200 of a-z A-Z 0-9 . _ -",
            5,
        ),
        (
            "system:\n  command: [cat]\n  ingest: { kind: mqtt, topic: in/x, version: \"3.1\" }\n",
            "field `system.ingest.version`: `3.1`; drill speaks MQTT \"5\" (the default) or \"3.1.1\"",
            6,
        ),
        (
            "system:\n  ingest: { kind: http, version: \"3.1.1\" }\n",
            "field `system.ingest.version`: not used by `kind: http`",
            5,
        ),
        (
            "system:\n  ingest: { kind: kafka, rotate: { every: 10s } }\n",
            "field `system.ingest.rotate`: not used by `kind: kafka`",
            5,
        ),
        (
            "system:\n  command: [cat, \"{ingest.topic}\"]\n  ingest: { kind: file }\n",
            "field `system.command[1]`: `{ingest.topic}` is the source topic's",
            5,
        ),
        (
            "system:\n  ingest: { kind: postgres_outbox, table: \"Out-Box\" }\n",
            "field `system.ingest.table`: `Out-Box` must be a plain SQL name",
            5,
        ),
        (
            "system:\n  command: [cat, \"{ingest.dsn}\"]\n  ingest: { kind: kafka }\n",
            "field `system.command[1]`: `{ingest.dsn}` is the outbox's",
            5,
        ),
        (
            "system:\n  ingest: { kind: kafka, topic: \"..\" }\n",
            "field `system.ingest.topic`: `..` must be 1 to 200",
            5,
        ),
        (
            "system:\n  ingest: { kind: kafka }\nfaults:\n  - { at: 2s, link: source, fault: bad_certificate }\n",
            "the link `source` to drill's source carries plain text",
            7,
        ),
        (
            "faults:\n  - { at: 2s, link: source, fault: refuse }\n",
            "field `faults[0].link`: no link named `source`",
            5,
        ),
    ];
    for (i, (tail, want, line)) in cases.iter().enumerate() {
        let name = format!("bad{i}");
        let file = scenario(dir.path(), &name, &format!("{head}{tail}"));
        let o = drill(&["check", &file]);
        let said = show(&o);
        assert_eq!(o.status.code(), Some(2), "{said}");
        assert!(said.contains(want), "case {i}: want {want:?} in\n{said}");
        // file:line: the line of the entry at fault.
        assert!(
            said.contains(&format!("{name}.yaml:{line}:")),
            "case {i}: not at line {line} in\n{said}"
        );
    }
}
