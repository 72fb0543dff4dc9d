//! Clock faults (`{ target: engine, clock: jump, by: +2h }`) on the real libfaketime: a running
//! process follows each jump of the offset file, a process started without the clock does not;
//! the correct engine passes `clock-jump-forward` and `clock-jump-back`, and the wall-clock
//! mutants are caught there by their signatures (lost, undelivered) with the counts the
//! outage makes. Needs libfaketime (ci/setup.sh installs Debian's `faketime`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use drill::clock::{FakeClock, libfaketime};

use crate::common::run::required;

/// A running process printing its wall clock (seconds) ten times a second: perl's `time`
/// goes through the C library, as an engine's clock does.
fn clock_printer(env: Vec<(String, String)>) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new("perl")
        .args([
            "-e",
            "$| = 1; while (1) { print time, qq(\\n); select(undef, undef, undef, 0.1) }",
        ])
        .envs(env)
        .stdout(Stdio::piped())
        .spawn()
        .expect("perl");
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// The printed clock minus the real one, once the process has printed `skip` more lines.
fn offset_after(out: &mut BufReader<std::process::ChildStdout>, skip: usize) -> i64 {
    let mut line = String::new();
    for _ in 0..skip {
        line.clear();
        out.read_line(&mut line).unwrap();
    }
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    line.trim().parse::<i64>().unwrap() - real
}

#[test]
fn a_running_process_follows_each_jump_and_one_without_the_clock_does_not() {
    if !required(libfaketime().is_some(), "libfaketime (Debian: faketime)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clock = FakeClock::new(dir.path()).unwrap();
    let (mut faked, mut out) = clock_printer(clock.env(None));
    let (mut plain, mut plain_out) = clock_printer(Vec::new());
    assert!(offset_after(&mut out, 3).abs() <= 1);
    clock.jump(7200).unwrap();
    // Three lines (300 ms) later the running process reads the new offset.
    let forward = offset_after(&mut out, 3);
    assert!((7199..=7201).contains(&forward), "forward: {forward}");
    clock.jump(-7800).unwrap();
    let back = offset_after(&mut out, 3);
    assert!((-601..=-599).contains(&back), "back: {back}");
    assert_eq!(clock.offset_s(), -600);
    // The same program without the clock's environment: no jump reaches it.
    let unmoved = offset_after(&mut plain_out, 3);
    assert!(unmoved.abs() <= 1, "without the clock: {unmoved}");
    for c in [&mut faked, &mut plain] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The correct engine holds through a forward jump and reconnects on time after a backward
/// one; `expire-by-wall-clock` loses what waited when the clock jumped (the outage's 600
/// records, give or take the second around the jump), and `backoff-by-wall-clock` still holds
/// what came after the outage began when the drain ends.
#[cfg(feature = "mutants")]
#[test]
fn wall_clock_jumps_catch_the_engines_that_time_by_the_wall_clock() {
    use crate::common::run::{catalogue_drill_fails_mutant, catalogue_drill_passes};
    if !required(libfaketime().is_some(), "libfaketime (Debian: faketime)") {
        return;
    }
    let (forward, back, expire, backoff) = std::thread::scope(|s| {
        let f = s.spawn(|| catalogue_drill_passes("clock-jump-forward"));
        let b = s.spawn(|| catalogue_drill_passes("clock-jump-back"));
        let e =
            s.spawn(|| catalogue_drill_fails_mutant("clock-jump-forward", "expire-by-wall-clock"));
        let k =
            s.spawn(|| catalogue_drill_fails_mutant("clock-jump-back", "backoff-by-wall-clock"));
        (
            f.join().unwrap(),
            b.join().unwrap(),
            e.join().unwrap(),
            k.join().unwrap(),
        )
    });
    for ran in [&forward, &back] {
        assert_eq!(
            ran.number(&["ledger", "lost"]),
            0,
            "{:#}",
            ran.report["ledger"]
        );
        assert!(
            ran.markdown.contains("| engine clock | wall clock jumps"),
            "{}",
            ran.markdown
        );
    }
    // Refused from 4 s to 16 s at 100/s, the jump at 10 s: about 600 records waited then.
    let lost = expire.number(&["ledger", "lost"]);
    assert!(
        (450..=750).contains(&lost),
        "lost {lost}: {:#}",
        expire.report["ledger"]
    );
    // From 4 s on (1600 records) nothing reached the broker again before the drain ended.
    let undelivered = backoff.number(&["ledger", "waiting"]);
    assert!(
        (1400..=1700).contains(&undelivered),
        "undelivered {undelivered}: {:#}",
        backoff.report["ledger"]
    );
    assert_eq!(backoff.number(&["ledger", "lost"]), 0);
}

/// A drift (`clock: drift, by: +2h, for: 8s`) reaches the engine a step a second: the report
/// names it with its span; the correct engine holds everything, and `expire-by-wall-clock`
/// loses what waited once the clock had gained an hour (refused 4–16 s at 100/s: up to 1200
/// waited; those accepted after the clock passed +1 h stay younger than an hour).
#[cfg(feature = "mutants")]
#[test]
fn a_drifting_clock_is_stepped_a_second_at_a_time_and_catches_wall_clock_expiry() {
    use crate::common::run::{catalogue_drill_fails_mutant, catalogue_drill_passes};
    if !required(libfaketime().is_some(), "libfaketime (Debian: faketime)") {
        return;
    }
    let (correct, expire) = std::thread::scope(|s| {
        let c = s.spawn(|| catalogue_drill_passes("clock-drift"));
        let e = s.spawn(|| catalogue_drill_fails_mutant("clock-drift", "expire-by-wall-clock"));
        (c.join().unwrap(), e.join().unwrap())
    });
    assert_eq!(correct.number(&["ledger", "lost"]), 0);
    assert!(
        correct
            .markdown
            .contains("| engine clock | wall clock drifts +2h over 8 s"),
        "{}",
        correct.markdown
    );
    let lost = expire.number(&["ledger", "lost"]);
    assert!(
        (200..=1300).contains(&lost),
        "lost {lost}: {:#}",
        expire.report["ledger"]
    );
}
