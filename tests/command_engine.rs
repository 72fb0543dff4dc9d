//! `system.command`: engines nobody here wrote, driven through their own ingest and judged like
//! the built-in one. The fixture forwarder (`fixtures/forwarder.py`, Python stdlib only) has one
//! ingest per kind and deliberately broken modes; real brokers, the real proxy, the real binary.

use std::path::Path;
use std::process::Output;

use crate::common::run::{Ran, fixtures, run_scenario, running, show};

fn n(r: &serde_json::Value, field: &str) -> u64 {
    r["ledger"][field].as_u64().unwrap_or(u64::MAX)
}

/// The fixture forwarder for `kind`, through a link swallowed both ways for 6 s with a SIGKILL
/// of the engine in the middle. `extra` goes on its argv (e.g. a `--broken` mode).
fn forwarder_drill(name: &str, kind: &str, extra: &str) -> String {
    let (ingest, api) = match kind {
        "http" => ("{ kind: http, path: /ingest, batch: 50 }", ""),
        "mqtt" => ("{ kind: mqtt, topic: in/drill }", ", port: api"),
        _ => ("{ kind: tcp_lines }", ", port: api"),
    };
    let api_arg = if api.is_empty() {
        String::new()
    } else {
        ", --api, \"127.0.0.1:{port.api}\"".to_string()
    };
    format!(
        r#"name: {name}
seed: 5
destination: {{ kind: mqtt, runtime: process, topic: drill/{name} }}
system:
  command: [python3, "{fixtures}/forwarder.py", --ingest-kind, {kind}, --ingest, "{{ingest}}",
            --mqtt, "{{link.mqtt}}", --topic, "{{topic}}", --data, "{{data_dir}}"{api_arg}{extra}]
  ingest: {ingest}
  ready: {{ http: /health{api}, within: 15s }}
  stats: {{ path: /stats{api} }}
  write_key: {{ mqtt_user_property: write-key }}
  promise: at_least_once
workload: {{ rate: 100/s, duration: 16s, keys: 4 }}
faults:
  - {{ at: 4s, link: mqtt, fault: swallow, direction: both, for: 6s }}
  - {{ at: 7s, target: engine, action: kill, restart_after: 1s }}
expect: {{ lost: 0, duplicates: 0, ledger: closes }}
"#,
        fixtures = fixtures()
    )
}

fn assert_closes(ran: &Ran) {
    let r = &ran.report;
    assert_eq!(ran.output.status.code(), Some(0), "{}", show(&ran.output));
    assert_eq!(r["verdict"], "pass", "{}", ran.markdown);
    assert_eq!(n(r, "lost"), 0);
    assert_eq!(r["closes"], true);
    assert!(n(r, "held") > 1000, "{}", ran.markdown);
    assert_eq!(n(r, "held"), n(r, "delivered"), "{}", ran.markdown);
    assert_eq!(n(r, "duplicates_other_key"), 0, "{}", ran.markdown);
}

#[test]
fn an_http_forwarder_through_a_half_open_link_and_a_kill_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_scenario(
        dir.path(),
        "fw-http",
        &forwarder_drill("fw-http", "http", ""),
    );
    assert_closes(&ran);
    assert!(
        ran.markdown
            .contains("drill sees no attempts of a user's engine"),
        "{}",
        ran.markdown
    );
}

#[test]
fn an_mqtt_ingest_forwarder_through_a_half_open_link_and_a_kill_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    assert_closes(&run_scenario(
        dir.path(),
        "fw-mqtt",
        &forwarder_drill("fw-mqtt", "mqtt", ""),
    ));
}

#[test]
fn a_tcp_lines_forwarder_through_a_half_open_link_and_a_kill_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_scenario(
        dir.path(),
        "fw-tcp",
        &forwarder_drill("fw-tcp", "tcp_lines", ""),
    );
    assert_closes(&ran);
    assert!(
        ran.markdown.contains("`tcp_lines` has no acknowledgement"),
        "{}",
        ran.markdown
    );
}

/// The ledger of a failed drill: lost is exactly what the engine acknowledged and neither
/// delivered nor still holds.
fn assert_loses(ran: &Ran) -> u64 {
    let r = &ran.report;
    assert_eq!(ran.output.status.code(), Some(1), "{}", show(&ran.output));
    assert_eq!(r["verdict"], "fail");
    let lost = n(r, "lost");
    assert!(lost > 0, "{}", ran.markdown);
    assert_eq!(
        lost,
        n(r, "held") - n(r, "delivered") - n(r, "waiting") - n(r, "failed"),
        "{}",
        ran.markdown
    );
    assert!(
        ran.markdown.contains(&format!("{lost} records lost")),
        "{}",
        ran.markdown
    );
    lost
}

#[test]
fn a_forwarder_that_acknowledges_before_writing_fails_with_the_records_it_lost_in_the_kill() {
    let dir = tempfile::tempdir().unwrap();
    let ran = run_scenario(
        dir.path(),
        "fw-ack-first",
        &forwarder_drill("fw-ack-first", "http", ", --broken, ack-before-write"),
    );
    let lost = assert_loses(&ran);
    // Everything accepted in the 3 s between the swallow and the kill was only in memory: at
    // 100 records/s, hundreds.
    assert!(lost >= 100, "{lost}\n{}", ran.markdown);
}

#[test]
fn a_forwarder_that_drops_its_backlog_after_a_few_connection_errors_fails() {
    let dir = tempfile::tempdir().unwrap();
    let text = forwarder_drill("fw-give-up", "mqtt", ", --broken, drop-after-errors=2")
        .replace("fault: swallow, direction: both", "fault: refuse")
        .replace(
            "  - { at: 7s, target: engine, action: kill, restart_after: 1s }\n",
            "",
        );
    let ran = run_scenario(dir.path(), "fw-give-up", &text);
    assert_loses(&ran);
}

#[test]
fn the_built_in_engine_given_as_a_command_gets_the_verdict_builtin_gets() {
    let dir = tempfile::tempdir().unwrap();
    let common = |name: &str, system: &str| {
        format!(
            r#"name: {name}
seed: 9
destination: {{ kind: mqtt, runtime: process, topic: drill/{name} }}
{system}
workload: {{ rate: 100/s, duration: 16s, keys: 4 }}
faults:
  - {{ at: 4s, link: mqtt, fault: swallow, direction: both, for: 6s }}
  - {{ at: 7s, target: engine, action: kill, restart_after: 1s }}
expect: {{ lost: 0, duplicates: 0, ledger: closes }}
"#
        )
    };
    let builtin = run_scenario(
        dir.path(),
        "as-builtin",
        &common(
            "as-builtin",
            "system: { builtin: { promise: at_least_once } }",
        ),
    );
    let command = run_scenario(
        dir.path(),
        "as-command",
        &common(
            "as-command",
            &format!(
                r#"system:
  command: [drill, engine, --config, "{{work_dir}}/engine.yaml"]
  files: {{ engine.yaml: "{}/builtin-engine.yaml.tmpl" }}
  ingest: {{ kind: http, path: /ingest }}
  ready: {{ http: /stats }}
  stats: {{ path: /stats }}
  write_key: {{ mqtt_user_property: write-key }}
  promise: at_least_once"#,
                fixtures()
            ),
        ),
    );
    assert_closes(&builtin);
    assert_closes(&command);
    assert_eq!(builtin.report["verdict"], command.report["verdict"]);
    assert_eq!(builtin.output.status.code(), command.output.status.code());
}

fn bad(dir: &Path, name: &str, system: &str) -> Output {
    bad_for(dir, name, system, "2s")
}

fn bad_for(dir: &Path, name: &str, system: &str, duration: &str) -> Output {
    let text = format!(
        "name: {name}\ndestination: {{ kind: mqtt, runtime: process }}\n{system}\nworkload: {{ rate: 10/s, duration: {duration} }}\n"
    );
    run_scenario(dir, name, &text).output
}

fn one_line(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "{}", show(o));
    err
}

#[test]
fn an_unknown_placeholder_exits_2_with_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let o = bad(
        dir.path(),
        "typo",
        "system:\n  command: [python3, x.py, --mqtt, \"{link.mqqt}\"]\n  ingest: { kind: tcp_lines }",
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = one_line(&o);
    assert!(err.contains("typo.yaml:4:"), "{err}");
    assert!(err.contains("system.command[3]"), "{err}");
    assert!(err.contains("`{link.mqtt}`"), "{err}");
}

#[test]
fn a_command_that_does_not_exist_exits_3_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let o = bad(
        dir.path(),
        "missing",
        "system:\n  command: [no-such-engine-4711, \"{ingest}\"]\n  ingest: { kind: tcp_lines }",
    );
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    assert!(one_line(&o).contains("cannot run `no-such-engine-4711`"));
}

#[test]
fn an_engine_that_exits_at_once_exits_3_quoting_its_last_lines() {
    let dir = tempfile::tempdir().unwrap();
    let o = bad(
        dir.path(),
        "quits",
        "system:\n  command: [sh, -c, \"echo broken config line 12 >&2; exit 7\"]\n  ingest: { kind: tcp_lines }",
    );
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    let err = one_line(&o);
    assert!(err.contains("exit status: 7"), "{err}");
    assert!(err.contains("broken config line 12"), "{err}");
}

#[test]
fn an_engine_that_never_becomes_ready_exits_3_and_its_whole_group_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    // A wrapper with a helper child: both must be gone afterwards (signals go to the group).
    let o = bad(
        dir.path(),
        "never-ready",
        "system:\n  command: [sh, -c, \"sleep 3917 & sleep 3918\"]\n  ingest: { kind: tcp_lines }\n  ready: { tcp: true, within: 2s }",
    );
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    let err = one_line(&o);
    assert!(err.contains("not ready within 2s"), "{err}");
    assert_eq!(running("sleep 3917") + running("sleep 3918"), 0);
}

#[test]
fn an_engine_that_dies_during_the_drill_exits_3_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // The wrapper ends after 3 s; its children (the forwarder, a sleep) would live on.
    let o = bad_for(
        dir.path(),
        "dies",
        &format!(
            "system:\n  command: [sh, -c, \"sleep 3919 & python3 {}/forwarder.py --ingest-kind tcp_lines --ingest {{ingest}} --mqtt {{link.mqtt}} --topic t3919 --data {{data_dir}} & sleep 3; exit 1\"]\n  ingest: {{ kind: tcp_lines }}",
            fixtures()
        ),
        "20s",
    );
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    assert!(one_line(&o).contains("exited by itself"), "{}", show(&o));
    assert_eq!(running("sleep 3919"), 0);
    assert_eq!(running("topic t3919"), 0);
}

/// The catalogue's `ci` drills on MQTT whose timeline cuts the link (refuse, reset, swallow,
/// hang, strand), each with its system replaced by `engine`'s lines; their drain shortened to
/// `drain`, since an engine that stopped delivering drains until the timeout.
fn ci_drills_with_a_link_cut(engine: &str, drain: &str) -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut drills = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        if entry.path().extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        let ci = text
            .lines()
            .any(|l| l.starts_with("tags:") && l.contains("ci"));
        let mqtt = text.contains("kind: mqtt") && !text.contains("tls:");
        let cut = ["refuse", "reset", "swallow", "hang", "strand"]
            .iter()
            .any(|f| text.contains(&format!("fault: {f}")));
        // A drill whose engine pulls from a source (tails a file, consumes a topic, polls an
        // outbox: `link: source` may be cut) needs an engine that does: this forwarder takes
        // HTTP.
        let pulls = ["file", "kafka", "postgres_outbox"]
            .iter()
            .any(|k| text.contains(&format!("ingest: {{ kind: {k}")));
        if !(ci && mqtt && cut) || pulls {
            continue;
        }
        // Its own system and drain timeout go; everything else stays as the catalogue has it.
        let mut kept = Vec::new();
        let mut in_system = false;
        for line in text.lines() {
            if line.starts_with("system:") || line.starts_with("drain_timeout:") {
                in_system = line.starts_with("system:");
                continue;
            }
            if in_system && line.starts_with("  ") {
                continue;
            }
            in_system = false;
            kept.push(line);
        }
        let name = entry
            .path()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .to_string();
        drills.push((
            name,
            format!("{}\n{engine}\ndrain_timeout: {drain}\n", kept.join("\n")),
        ));
    }
    drills.sort();
    drills
}

/// An engine that gives up on its destination after an outage — keeps accepting, reports every
/// record as waiting, never connects again — fails every MQTT `ci` drill that cuts the link, as
/// records never delivered (`undelivered`), not as a pass and not as lost. The drills with a
/// clock fault are refused for it at once (exit 2): it runs on Python.
#[test]
fn an_engine_that_gives_up_after_an_outage_fails_every_mqtt_ci_drill_that_cuts_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let engine = format!(
        r#"system:
  command: [python3, "{}/forwarder.py", --ingest-kind, http, --ingest, "{{ingest}}",
            --mqtt, "{{link.mqtt}}", --topic, "{{topic}}", --data, "{{data_dir}}",
            --broken, give-up-after-errors=1]
  ingest: {{ kind: http, path: /ingest, batch: 50 }}
  ready: {{ http: /health, within: 15s }}
  stats: {{ path: /stats }}
  write_key: {{ mqtt_user_property: write-key }}
  promise: at_least_once"#,
        fixtures()
    );
    let drills = ci_drills_with_a_link_cut(&engine, "10s");
    assert!(drills.len() >= 8, "{drills:?}");
    // Three at a time: each starts its own broker and proxy on free ports.
    let mut results = Vec::new();
    for chunk in drills.chunks(3) {
        let ran: Vec<(String, Ran)> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|(name, text)| {
                    let sub = dir.path().join(name);
                    std::fs::create_dir_all(&sub).unwrap();
                    s.spawn(move || (name.clone(), run_scenario(&sub, name, text)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        results.extend(ran);
    }
    for (name, ran) in &results {
        // A clock fault cannot reach a Python engine (libfaketime with the monotonic clock left
        // alone breaks its time.sleep): drill refuses the drill with the reason, exit 2.
        if drills
            .iter()
            .any(|(n, text)| n == name && text.contains("clock: jump"))
        {
            assert_eq!(
                ran.output.status.code(),
                Some(2),
                "{name}: {}",
                show(&ran.output)
            );
            assert!(
                show(&ran.output).contains("`python3` runs on Python"),
                "{name}: {}",
                show(&ran.output)
            );
            continue;
        }
        let r = &ran.report;
        let held = r["undelivered"]["count"].as_u64().unwrap_or(0);
        println!(
            "{name}: exit {:?}, {held} never delivered, lost {}: {}",
            ran.output.status.code(),
            n(r, "lost"),
            r["headline"]
        );
        assert_eq!(
            ran.output.status.code(),
            Some(1),
            "{name}: {}",
            show(&ran.output)
        );
        assert_eq!(r["verdict"], "fail", "{name}: {}", ran.markdown);
        let row = r["expectations"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["check"] == "undelivered")
            .unwrap_or_else(|| panic!("{name}: no undelivered row: {}", ran.markdown));
        assert_eq!(row["ok"], false, "{name}: {}", ran.markdown);
        assert!(held > 0 && row["count"] == held, "{name}: {}", ran.markdown);
        assert!(
            r["headline"]
                .as_str()
                .unwrap_or("")
                .contains("never delivered (the engine still holds them; delivery stalled)"),
            "{name}: {}",
            ran.markdown
        );
        assert!(
            !r["headline"]
                .as_str()
                .unwrap_or("")
                .contains("nothing lost"),
            "{name}"
        );
        assert!(r["undelivered"]["stalled"] == true, "{name}");
    }
}

/// A pipeline that never worked — here an engine pointed at a port where nothing listens, not
/// at its link — is named as such ("nothing was delivered before the first fault"), with the
/// link's counts and the engine's last log lines, instead of its records being reported lost
/// to the fault.
#[test]
fn an_engine_that_never_reached_its_destination_is_inconclusive_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = dead.local_addr().unwrap();
    drop(dead);
    let text = format!(
        r#"name: nowhere
destination: {{ kind: mqtt, runtime: process, topic: drill/nowhere }}
system:
  command: [python3, "{}/forwarder.py", --ingest-kind, http, --ingest, "{{ingest}}",
            --mqtt, "{nowhere}", --topic, "{{topic}}", --data, "{{data_dir}}"]
  ingest: {{ kind: http, path: /ingest, batch: 50 }}
  ready: {{ http: /health, within: 15s }}
  promise: at_least_once
workload: {{ rate: 50/s, duration: 8s, keys: 2 }}
faults:
  - {{ at: 5s, link: mqtt, fault: refuse, for: 2s }}
drain_timeout: 10s
"#,
        fixtures()
    );
    let ran = run_scenario(dir.path(), "nowhere", &text);
    assert_eq!(ran.output.status.code(), Some(1), "{}", show(&ran.output));
    let why = ran.report["inconclusive"].to_string();
    assert!(
        why.contains("nothing was delivered before the first fault at 5.0 s")
            && why.contains("link mqtt: 0 connections accepted"),
        "{why}"
    );
    // The engine's own last words: its connection errors, and where its log is.
    assert!(
        why.contains("the engine's last log lines: ")
            && why.contains("[connection error ")
            && why.contains("engine.log"),
        "{why}"
    );
    assert!(
        ran.report["headline"]
            .as_str()
            .unwrap_or("")
            .starts_with("Inconclusive: nothing was delivered"),
        "{}",
        ran.markdown
    );
}
