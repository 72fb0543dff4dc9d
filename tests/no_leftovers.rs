//! No child process outlives drill: not after Ctrl-C (SIGINT), not even after SIGKILL.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    let file = dir.join("long.yaml");
    std::fs::write(
        &file,
        "name: long\ndestination: { kind: mqtt, topic: t/long }\nworkload: { rate: 50/s, duration: 60s }\n",
    )
    .unwrap();
    Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", &file.display().to_string(), "--out"])
        .arg(dir.join("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
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
