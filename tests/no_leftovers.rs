//! No child process outlives drill: not after Ctrl-C (SIGINT), not even after SIGKILL; and no
//! container outlives a drill run in the container runtime after Ctrl-C.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::run::running;

/// Children of `pid`, read from /proc.
fn children(pid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let ppid = after
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            let cmd = std::fs::read_to_string(format!("/proc/{child}/cmdline"))
                .unwrap_or_default()
                .replace('\0', " ");
            found.push((child, cmd));
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    // A zombie is dead for our purpose: it holds no port and runs no code.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rfind(')').map(|i| &s[i + 2..i + 3]) != Some("Z"))
        .unwrap_or(false)
}

fn start_drill(dir: &std::path::Path) -> Child {
    start_drill_named(dir, "long", &[], &[])
}

fn start_drill_named(
    dir: &std::path::Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Child {
    start_drill_out(dir, name, &dir.join("out"), args, env)
}

fn start_drill_out(
    dir: &std::path::Path,
    name: &str,
    out: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Child {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &file,
        format!("name: {name}\ndestination: {{ kind: mqtt, topic: t/long }}\nworkload: {{ rate: 50/s, duration: 60s }}\n"),
    )
    .unwrap();
    Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", &file.display().to_string(), "--out"])
        .arg(out)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Containers labelled with drill run `run` (created, running or stopped).
fn containers_of(run: &str) -> Vec<String> {
    let o = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=drill.run={run}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until drill has started the broker (when it is a process) and the engine.
fn wait_for_children(drill: &Child) -> Vec<(u32, String)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let kids = children(drill.id());
        if kids.iter().any(|(_, c)| c.contains(" engine --config")) {
            return kids;
        }
        assert!(
            Instant::now() < deadline,
            "drill did not start its engine: {kids:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_all_gone(kids: &[(u32, String)]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while kids.iter().any(|(p, _)| alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}",
            kids.iter().filter(|(p, _)| alive(*p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ctrl_c_stops_every_child() {
    let dir = tempfile::tempdir().unwrap();
    let mut drill = start_drill(dir.path());
    let kids = wait_for_children(&drill);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(drill.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = drill.wait().unwrap();
    assert_eq!(status.code(), Some(3), "interrupted drills exit 3");
    assert_all_gone(&kids);
}

#[test]
fn even_a_sigkilled_drill_leaves_no_child_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut drill = start_drill(dir.path());
    let kids = wait_for_children(&drill);
    println!("children before SIGKILL: {kids:?}");
    drill.kill().unwrap();
    let _ = drill.wait();
    assert_all_gone(&kids);
}

/// Whether `drill-local/mosquitto` (ci/images.sh) is there; under CI=true its absence fails
/// the test instead of skipping it.
fn have_local_mosquitto_image() -> bool {
    crate::common::run::have_local_image("drill-local/mosquitto")
}

#[test]
fn ctrl_c_removes_the_broker_container_and_every_child() {
    if !have_local_mosquitto_image() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut drill = start_drill_named(
        dir.path(),
        "long-in-a-container",
        &["--runtime", "container"],
        &[("DRILL_IMAGE_MQTT", "drill-local/mosquitto")],
    );
    let kids = wait_for_children(&drill);
    let run = "long-in-a-container-1";
    let running = containers_of(run);
    assert_eq!(
        running.len(),
        1,
        "the broker runs in a container: {running:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(drill.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = drill.wait().unwrap();
    assert_eq!(status.code(), Some(3), "interrupted drills exit 3");
    assert_all_gone(&kids);
    let left = containers_of(run);
    println!(
        "containers of {run}: {} while running, {} after Ctrl-C",
        running.len(),
        left.len()
    );
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn ctrl_c_stops_a_users_engine_and_everything_its_wrapper_started() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wrapped.yaml");
    // A wrapper script whose children (a forwarder, a helper) are not drill's own children:
    // only signals to the process group reach them.
    std::fs::write(
        &file,
        format!(
            r#"name: wrapped
destination: {{ kind: mqtt, runtime: process, topic: t/wrapped }}
system:
  command: [sh, -c, "sleep 3921 & exec python3 {}/fixtures/forwarder.py --ingest-kind http --ingest {{ingest}} --mqtt {{link.mqtt}} --topic t3921 --data {{data_dir}}"]
  ingest: {{ kind: http }}
  ready: {{ http: /health }}
workload: {{ rate: 50/s, duration: 60s }}
"#,
            env!("CARGO_MANIFEST_DIR")
        ),
    )
    .unwrap();
    let mut drill = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", &file.display().to_string(), "--out"])
        .arg(dir.path().join("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while running("topic t3921") == 0 || running("sleep 3921") == 0 {
        assert!(Instant::now() < deadline, "the engine did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(drill.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(drill.wait().unwrap().code(), Some(3));
    let deadline = Instant::now() + Duration::from_secs(10);
    while running("topic t3921") + running("sleep 3921") > 0 {
        assert!(
            Instant::now() < deadline,
            "the wrapper's children were left behind"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_stops_every_child() {
    let dir = tempfile::tempdir().unwrap();
    let mut drill = start_drill(dir.path());
    let kids = wait_for_children(&drill);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(drill.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(drill.wait().unwrap().code(), Some(3));
    assert_all_gone(&kids);
}

/// A short drill (6 s) whose report cannot be written: its folder holds a directory where
/// `report.md` goes. It exits 3 saying why, with nothing left running.
#[test]
fn an_unwritable_report_exits_3_and_leaves_no_child() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("short").join("report.md")).unwrap();
    let file = dir.path().join("short.yaml");
    std::fs::write(
        &file,
        "name: short\ndestination: { kind: mqtt, topic: t/short }\nworkload: { rate: 20/s, duration: 6s }\n",
    )
    .unwrap();
    let drill = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", &file.display().to_string(), "--out"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let kids = wait_for_children(&drill);
    let output = drill.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("cannot write the report"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_all_gone(&kids);
}

/// The broker process dies in the middle of a drill (killed from outside): the drill ends with
/// a verdict that names the verifier, and stops everything it started.
#[test]
fn a_broker_that_dies_mid_drill_leaves_no_child() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker-dies.yaml");
    std::fs::write(
        &file,
        "name: broker-dies\ndestination: { kind: mqtt, runtime: process, topic: t/dies }\nworkload: { rate: 20/s, duration: 8s }\ndrain_timeout: 5s\n",
    )
    .unwrap();
    let mut drill = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", &file.display().to_string(), "--out"])
        .arg(dir.path().join("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let kids = wait_for_children(&drill);
    let broker = kids
        .iter()
        .find(|(_, c)| c.contains("mosquitto"))
        .expect("a mosquitto broker")
        .0;
    std::thread::sleep(Duration::from_secs(3));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(broker as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = drill.wait().unwrap();
    assert!(matches!(status.code(), Some(1 | 3)), "{status:?}");
    assert_all_gone(&kids);
}

/// A panic inside the runner (a test hook, `test-hooks` builds only) unwinds through the rig
/// and the system under test: nothing is left running.
#[cfg(feature = "test-hooks")]
#[test]
fn a_panic_inside_the_runner_leaves_no_child() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("panics.yaml");
    std::fs::write(
        &file,
        "name: panics\ndestination: { kind: mqtt, topic: t/panics }\nworkload: { rate: 20/s, duration: 3s }\n",
    )
    .unwrap();
    let mut drill = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", &file.display().to_string(), "--out"])
        .arg(dir.path().join("out"))
        .env("DRILL_TEST_PANIC_AFTER_PLAY", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let kids = wait_for_children(&drill);
    let status = drill.wait().unwrap();
    assert!(!status.success(), "{status:?}");
    assert_all_gone(&kids);
}

/// The same panic with the broker in a container: the container is removed too (the broker's
/// `Drop`, on a thread of its own, since the panicking runtime cannot be waited on).
#[cfg(feature = "test-hooks")]
#[test]
fn a_panic_inside_the_runner_removes_the_broker_container() {
    if !have_local_mosquitto_image() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("panics-in-a-container.yaml");
    std::fs::write(
        &file,
        "name: panics-in-a-container\ndestination: { kind: mqtt, topic: t/panics }\nworkload: { rate: 20/s, duration: 3s }\n",
    )
    .unwrap();
    let err = dir.path().join("stderr");
    let mut drill = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args([
            "run",
            &file.display().to_string(),
            "--runtime",
            "container",
            "--out",
        ])
        .arg(dir.path().join("out"))
        .env("DRILL_TEST_PANIC_AFTER_PLAY", "1")
        .env("DRILL_IMAGE_MQTT", "drill-local/mosquitto")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    // The broker's container is seen while the drill runs (else "none left" proves nothing).
    let mut seen = false;
    let status = loop {
        if let Some(status) = drill.try_wait().unwrap() {
            break status;
        }
        seen |= !containers_of("panics-in-a-container-1").is_empty();
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(!status.success(), "{status:?}");
    assert!(seen, "the broker's container was never seen running");
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(
        stderr.contains("DRILL_TEST_PANIC_AFTER_PLAY: a panic inside the runner, on purpose"),
        "{stderr}"
    );
    let left = containers_of("panics-in-a-container-1");
    assert!(left.is_empty(), "left behind after a panic: {left:?}");
}
