//! The syslog destination end to end, through the real binary: a real rsyslog (Debian's, as
//! `ci/setup.sh` unpacks it), the real proxy, the engine as a child process, the file rsyslog
//! writes read back. RELP confirms each message and keeps `at_least_once`; plain TCP confirms
//! nothing, and its report must say "none lost before sending" with what was sent but never
//! confirmed counted apart — never "nothing lost". Each guarantee is shown failing too: an
//! engine that drops what waited (the mutant `expire-by-age`) fails on both transports, its
//! drops counted as lost (before sending), not hidden among the unconfirmed.

use crate::common::run::{
    catalogue_drill_passes, have_local_image, have_rsyslogd, refused_at, run_drill, run_drill_with,
    scenario, show,
};

/// RELP, half-open for 15 s: the frames reach rsyslog, the answers are lost. Each unanswered
/// attempt ends `possibly_sent` and is resent once after the heal with its write key: nothing
/// lost, every copy within at_least_once.
#[test]
fn the_relp_half_open_drill_passes_with_its_copies_within_the_promise() {
    if !have_rsyslogd() {
        return;
    }
    let ran = catalogue_drill_passes("syslog-relp-half-open");
    let r = &ran.report;
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(ran.number(&["ledger", "duplicates_beyond_promise"]), 0);
    assert_eq!(r["closes"], true);
    assert!(
        r["ledger"].get("sent_unconfirmed_missing").is_none(),
        "{r:#}"
    );
    assert_eq!(r["headline"], "Nothing lost.");
    // The swallow met the traffic: answers discarded, attempts left unanswered.
    assert!(
        ran.number(&["link", "bytes_swallowed_downstream"]) > 0,
        "{r:#}"
    );
    assert!(ran.number(&["attempts", "possibly_sent"]) > 0, "{r:#}");
    assert_eq!(ran.number(&["attempts", "sent_unconfirmed"]), 0);
    assert!(
        r["versions"]["broker"]
            .as_str()
            .unwrap()
            .contains("rsyslogd")
    );
}

/// Plain TCP, the same half-open link the other way: for 15 s what the engine writes is
/// discarded on the way and nothing says so. The engine cannot know; the report must not say
/// "nothing lost", but "none lost before sending" with the unconfirmed and missing counted.
#[test]
fn the_tcp_half_open_drill_counts_what_was_sent_unconfirmed_apart_from_lost() {
    if !have_rsyslogd() {
        return;
    }
    let ran = catalogue_drill_passes("syslog-tcp-half-open");
    let r = &ran.report;
    let headline = r["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("None lost before sending"),
        "{headline}"
    );
    assert!(
        !headline.to_lowercase().contains("nothing lost"),
        "{headline}"
    );
    let l = &r["ledger"];
    let (held, delivered, unconfirmed) = (
        ran.number(&["ledger", "held"]),
        ran.number(&["ledger", "delivered"]),
        ran.number(&["ledger", "sent_unconfirmed_missing"]),
    );
    assert_eq!(ran.number(&["ledger", "lost"]), 0, "{l}");
    // 15 s at 100 records/s went into the void, give or take what was in flight at the edges.
    assert!((1000..=2000).contains(&unconfirmed), "{l}");
    assert_eq!(held, delivered + unconfirmed, "{l}");
    assert!(headline.contains(&format!("{unconfirmed} sent but not confirmed and missing")));
    assert_eq!(r["promise"], "at_most_once");
    assert!(ran.number(&["attempts", "sent_unconfirmed"]) >= held);
    assert_eq!(ran.number(&["attempts", "delivered"]), 0);
    assert!(
        ran.markdown.contains("lost before sending"),
        "{}",
        ran.markdown
    );
}

/// UDP through a datagram link: 30 % of the datagrams dropped for 10 s, then all of them for
/// 5 s. Nothing answers on UDP: every missing record was sent (the OS took the datagram) and
/// is counted apart — about 300 + 500 — and none was lost before sending.
#[test]
fn the_udp_drill_counts_the_dropped_datagrams_as_sent_unconfirmed() {
    if !have_rsyslogd() {
        return;
    }
    let ran = catalogue_drill_passes("syslog-udp-loss");
    let r = &ran.report;
    let headline = r["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("None lost before sending"),
        "{headline}"
    );
    let unconfirmed = ran.number(&["ledger", "sent_unconfirmed_missing"]);
    assert!((650..=950).contains(&unconfirmed), "{:#}", r["ledger"]);
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(
        ran.number(&["ledger", "held"]),
        ran.number(&["ledger", "delivered"]) + unconfirmed
    );
    let datagrams = &r["link"]["datagrams"];
    assert!(
        datagrams["dropped_upstream"].as_u64().unwrap() >= unconfirmed,
        "the link dropped at least what is missing: {datagrams}"
    );
}

/// Two SIGKILLs of the engine while it drains over a slow plain-TCP link: at_most_once allows
/// no copy, so each record is marked settled before its bytes leave. Measured: with the marks
/// written only after the send (the 100 ms tick), 21 duplicates beyond at_most_once; with
/// them written before, 0.
#[test]
fn an_engine_killed_while_it_sends_over_tcp_sends_nothing_twice() {
    if !have_rsyslogd() {
        return;
    }
    let ran = catalogue_drill_passes("syslog-tcp-kill");
    let r = &ran.report;
    assert_eq!(
        ran.number(&["ledger", "duplicates"]),
        0,
        "{:#}",
        r["ledger"]
    );
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert!(
        ran.number(&["ledger", "delivered"]) > 0,
        "a drill that delivered nothing proves nothing: {:#}",
        r["ledger"]
    );
}

/// The receiving side in a container (`drill-local/rsyslog`, built by `ci/images.sh` from the
/// same Debian packages): RELP through the half-open link, and UDP (the port published as a
/// datagram port) through loss and a blackhole. Each passes as it does with a local rsyslog,
/// and the report names the image.
#[test]
fn the_relp_and_udp_drills_run_against_rsyslog_in_a_container() {
    if !have_local_image("drill-local/rsyslog") {
        return;
    }
    let env = [("DRILL_IMAGE_SYSLOG", "drill-local/rsyslog")];
    for name in ["syslog-relp-half-open", "syslog-udp-loss"] {
        let file = format!("{}/scenarios/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
        let ran = run_drill_with(&file, name, &["--runtime", "container"], &env);
        ran.say(name);
        let (o, r) = (&ran.output, &ran.report);
        assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
        assert_eq!(r["inconclusive"], serde_json::json!([]), "{r:#}");
        assert_eq!(r["runtime"], "container", "{r:#}");
        let broker = r["versions"]["broker"].as_str().unwrap_or("");
        assert!(broker.contains("drill-local/rsyslog (image "), "{broker}");
        assert_eq!(ran.number(&["ledger", "lost"]), 0, "{:#}", r["ledger"]);
        if name == "syslog-udp-loss" {
            let unconfirmed = ran.number(&["ledger", "sent_unconfirmed_missing"]);
            assert!((650..=950).contains(&unconfirmed), "{:#}", r["ledger"]);
        } else {
            assert_eq!(r["headline"], "Nothing lost.");
        }
    }
}

/// A UDP receiver the user runs (here: a socket in this test that appends each datagram to a
/// file, as a receiver's file rule would): drill cannot check it is there (nothing answers a
/// datagram) and says so; the link in front of it is a datagram link, and what its loss fault
/// dropped is counted sent-unconfirmed, never lost before sending.
#[test]
fn a_udp_receiver_the_user_runs_is_drilled_through_a_datagram_link() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("received.log");
    std::fs::write(&file, "a line from before the drill\n").unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    socket
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let receiver = {
        let (file, stop) = (file.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut out = std::fs::OpenOptions::new().append(true).open(file).unwrap();
            let mut buf = vec![0u8; 65536];
            let mut got = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(n) = socket.recv(&mut buf) {
                    out.write_all(&buf[..n]).unwrap();
                    out.write_all(b"\n").unwrap();
                    got += 1;
                }
            }
            got
        })
    };
    let text = format!(
        "name: udp-external\n\
         destination: {{ kind: syslog, transport: udp, runtime: external, address: \"{addr}\", read_back: {{ file: {} }} }}\n\
         workload: {{ rate: 100/s, duration: 6s }}\n\
         faults:\n  - {{ at: 1s, link: syslog, fault: loss, direction: upstream, loss: 0.5, for: 3s }}\n\
         expect: {{ lost_before_sending: 0, duplicates: 0, ledger: closes }}\n",
        file.display()
    );
    let path = scenario(dir.path(), "udp-external", &text);
    let ran = run_drill(&path, "udp-external", &[]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let got = receiver.join().unwrap();
    ran.say("udp-external");
    let (o, r) = (&ran.output, &ran.report);
    assert_eq!(o.status.code(), Some(0), "{}\n{r:#}", show(o));
    assert_eq!(r["runtime"], "external", "{r:#}");
    assert!(
        ran.markdown
            .contains("could not check that a receiver listens"),
        "{}",
        ran.markdown
    );
    let unconfirmed = ran.number(&["ledger", "sent_unconfirmed_missing"]);
    let (held, delivered) = (
        ran.number(&["ledger", "held"]),
        ran.number(&["ledger", "delivered"]),
    );
    assert_eq!(delivered, got, "the receiver's count is what was read back");
    assert_eq!(held, delivered + unconfirmed, "{:#}", r["ledger"]);
    // Half of 300 datagrams dropped, give or take what a seeded fraction gives.
    assert!((90..=210).contains(&unconfirmed), "{:#}", r["ledger"]);
}

/// A refused link on each transport, and an engine that drops records older than 5 s (the
/// mutant `expire-by-age`): the drill fails, and every dropped record is counted lost — on TCP
/// as lost before sending, not among the unconfirmed. Only in test builds.
#[cfg(feature = "mutants")]
#[test]
fn an_engine_that_drops_what_waited_fails_on_both_transports_with_its_losses_counted() {
    if !have_rsyslogd() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for transport in ["relp", "tcp"] {
        let name = format!("syslog-{transport}-lossy");
        let file = scenario(
            dir.path(),
            &name,
            &format!(
                "name: {name}\n\
                 destination: {{ kind: syslog, transport: {transport} }}\n\
                 workload: {{ rate: 100/s, duration: 12s, keys: 4 }}\n\
                 faults:\n\
                 \x20 - {{ at: 2s, link: syslog, fault: refuse, for: 8s }}\n"
            ),
        );
        let ran = run_drill_with(&file, &name, &[], &[("DRILL_MUTANT", "expire-by-age")]);
        ran.say(&format!("expire-by-age over {transport}"));
        let (o, r) = (&ran.output, &ran.report);
        assert_eq!(o.status.code(), Some(1), "{}\n{r:#}", show(o));
        let held = ran.number(&["ledger", "held"]);
        let delivered = ran.number(&["ledger", "delivered"]);
        let lost = ran.number(&["ledger", "lost"]);
        assert_eq!(held, 1200, "{r:#}");
        // Records accepted more than 5 s into an 8 s refusal are dropped: about 300.
        assert!(lost >= 100, "{r:#}");
        let unconfirmed = r["ledger"]["sent_unconfirmed_missing"]
            .as_u64()
            .unwrap_or(0);
        assert_eq!(held, delivered + lost + unconfirmed, "{r:#}");
        let headline = r["headline"].as_str().unwrap();
        if transport == "tcp" {
            assert!(
                headline.contains(&format!("{lost} records lost before sending")),
                "{headline}"
            );
        } else {
            assert!(
                headline.contains(&format!("{lost} records lost")),
                "{headline}"
            );
        }
    }
}

/// On TCP and UDP the engine's journal is the only word that a record was sent — unless the
/// link reads what the engine wrote. An engine that journals every tenth message as sent
/// without writing it (the mutant `sent-without-writing`) fails the half-open TCP drill and
/// the UDP loss drill with exactly what it skipped counted lost before sending, none of it
/// hidden among the unconfirmed; the link's tap read none of those from the engine. The
/// verdict before the tap (the journal alone) passed it. Only in test builds.
#[cfg(feature = "mutants")]
#[test]
fn an_engine_that_journals_sent_without_writing_is_caught_by_what_the_link_read() {
    if !have_rsyslogd() {
        return;
    }
    let runs: Vec<_> = ["syslog-tcp-half-open", "syslog-udp-loss"]
        .into_iter()
        .map(|name| {
            std::thread::spawn(move || {
                (
                    name,
                    crate::common::run::catalogue_drill_fails_mutant(name, "sent-without-writing"),
                )
            })
        })
        .collect();
    for run in runs {
        let (name, ran) = run.join().unwrap();
        let r = &ran.report;
        let held = ran.number(&["ledger", "held"]);
        let lost = ran.number(&["ledger", "lost"]);
        let unconfirmed = ran.number(&["ledger", "sent_unconfirmed_missing"]);
        // Every tenth write skipped: about held / 10 (each record is written once).
        let tenth = held / 10;
        assert!(
            (tenth.saturating_sub(tenth / 10)..=tenth + tenth / 10 + 1).contains(&lost),
            "{name}: lost {lost} of {held} held: {r:#}"
        );
        let failed: Vec<&str> = r["expectations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["ok"] == false)
            .filter_map(|x| x["check"].as_str())
            .collect();
        assert!(failed.contains(&"lost"), "{name}: {failed:?}");
        let headline = r["headline"].as_str().unwrap();
        assert!(
            headline.contains(&format!("{lost} records lost before sending")),
            "{name}: {headline}"
        );
        assert!(
            ran.markdown
                .contains(&format!("{lost} missing records the engine's attempt journal calls sent never reached the link")),
            "{name}: {}",
            ran.markdown
        );
        // The fault still bit: the link swallowed or dropped what was in flight.
        assert!(unconfirmed > 0, "{name}: {r:#}");
    }
}

/// What a syslog destination cannot honour is an invalid scenario: exit 2, one line with
/// file:line:col and the field.
#[test]
fn what_a_syslog_destination_cannot_honour_exits_2_located() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "unknown-transport",
            "destination: { kind: syslog, transport: smtp }\n",
            "relp, tcp or udp",
            "smtp",
        ),
        (
            "tcp-at-least-once",
            "destination: { kind: syslog, transport: tcp }\nsystem: { builtin: { promise: at_least_once } }\n",
            "declare at_most_once or less",
            "at_least_once",
        ),
        (
            "user-engine-claims-more",
            "destination: { kind: syslog, transport: tcp }\nsystem: { command: [x, \"{ingest}\"], ingest: { kind: http }, promise: effectively_once }\n",
            "field `system.promise`",
            "effectively_once",
        ),
        (
            "lost-before-sending-on-relp",
            "destination: { kind: syslog }\nexpect: { lost_before_sending: 0 }\n",
            "use `lost`",
            "0 }",
        ),
        (
            "external-without-file",
            "destination: { kind: syslog, runtime: external, address: \"127.0.0.1:6514\" }\n",
            "read_back",
            "syslog",
        ),
        (
            "read-back-without-external",
            "destination: { kind: syslog, read_back: { file: /tmp/x.log } }\n",
            "goes with `runtime: external`",
            "{ file",
        ),
        (
            "poison",
            "destination: { kind: syslog }\nworkload: { rate: 10/s, duration: 5s, poison: [3] }\n",
            "refuses no message",
            "[3]",
        ),
        (
            "hang-on-udp",
            "destination: { kind: syslog, transport: udp }\nworkload: { rate: 10/s, duration: 5s }\nfaults:\n  - { at: 1s, link: syslog, fault: hang, for: 1s }\n",
            "field `faults[0].fault`",
            "{ at: 1s",
        ),
        (
            "transport-on-mqtt",
            "destination: { kind: mqtt, transport: tcp }\n",
            "only a `syslog` destination takes it",
            "transport: tcp",
        ),
    ];
    // Each: the scenario's name, its body, what the error says, and the text it points at
    // (its first occurrence in the file gives the line and column the error must name).
    for (name, body, says, points_at) in cases {
        let mut text = format!("name: {name}\n{body}");
        if !body.contains("workload") {
            text.push_str("workload: { rate: 10/s, duration: 5s }\n");
        }
        refused_at(dir.path(), name, &text, says, points_at, &[]);
    }
}

/// rsyslog missing, or without its RELP module, when a drill needs it: exit 3 (the drill could
/// not be set up, not a verdict), one line naming the Debian package to install. Shown with
/// `DRILL_RSYSLOGD` pointing nowhere, and at a root that has rsyslog's modules but not
/// `rsyslog-relp`'s `imrelp.so`, so the test does not depend on what the machine has.
#[test]
fn a_missing_rsyslog_or_relp_module_exits_3_naming_the_package() {
    let root = tempfile::tempdir().unwrap();
    let sbin = root.path().join("usr/sbin");
    let modules = root.path().join("usr/lib/x86_64-linux-gnu/rsyslog");
    std::fs::create_dir_all(&sbin).unwrap();
    std::fs::create_dir_all(&modules).unwrap();
    std::fs::write(sbin.join("rsyslogd"), "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::write(modules.join("imtcp.so"), "").unwrap();
    let without_relp = sbin.join("rsyslogd").display().to_string();
    let nowhere = root.path().join("no-such-rsyslogd").display().to_string();
    let file = scenario(
        root.path(),
        "needs-rsyslog",
        "name: needs-rsyslog\ndestination: { kind: syslog, transport: relp }\nworkload: { rate: 10/s, duration: 2s }\n",
    );
    for (rsyslogd, says) in [
        (nowhere.as_str(), "apt-get install rsyslog rsyslog-relp"),
        (without_relp.as_str(), "install rsyslog-relp (Debian)"),
    ] {
        let ran = run_drill_with(&file, "needs-rsyslog", &[], &[("DRILL_RSYSLOGD", rsyslogd)]);
        let o = &ran.output;
        assert_eq!(o.status.code(), Some(3), "{}", show(o));
        let stderr = String::from_utf8_lossy(&o.stderr);
        let errors: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(errors.len(), 1, "one line: {}", show(o));
        assert!(errors[0].contains(says), "{}", show(o));
    }
}

/// `drill run --out` a relative folder: the broker gets absolute paths. rsyslog refused a
/// relative work directory (error -3000), so every syslog drill run with `--out reports/x`
/// failed to start (exit 3) — and every run of an explore with a relative `--out`.
#[test]
fn a_syslog_drill_runs_with_a_relative_out_folder() {
    if !have_rsyslogd() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rel.yaml"),
        "name: rel-out\n\
         destination: { kind: syslog, transport: tcp, runtime: process }\n\
         workload: { rate: 50/s, duration: 3s, keys: 2 }\n",
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_drill"))
        .current_dir(dir.path())
        .args(["run", "rel.yaml", "--out", "out"])
        .output()
        .unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", show(&o));
    assert!(
        dir.path().join("out/rel-out/report.json").is_file(),
        "{}",
        show(&o)
    );
}
