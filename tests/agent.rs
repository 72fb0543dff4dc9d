//! A user's engine on another host, run by a `drill agent` (issue: past one machine). The
//! agent is a real `drill agent` process, the engine drill's own run as a user's command on
//! it, the broker a real mosquitto; the faults on the engine (SIGSTOP/SIGCONT, SIGKILL, power
//! cut, full disk) are carried out by the agent, the link's by its proxy.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::hosts::{
    CUT_HALF_OPEN_KILL, Started, TwoHosts, command, free, in_ns_connects, mosquitto, until,
};
use crate::common::run::running;

/// `drill agent` (in `ns` when given) with its API on `api` (behind `token` when given), the
/// link `mqtt` from `listen` to `upstream`, and the engines' folders under `work`.
fn agent(
    ns: Option<&str>,
    api: SocketAddr,
    token: Option<&str>,
    listen: SocketAddr,
    upstream: SocketAddr,
    work: &Path,
) -> Started {
    let (api_s, link) = (api.to_string(), format!("mqtt={listen},{upstream}"));
    let work = work.display().to_string();
    let mut argv = vec![
        env!("CARGO_BIN_EXE_drill"),
        "agent",
        "--api",
        &api_s,
        "--link",
        &link,
        "--work",
        &work,
    ];
    if let Some(token) = token {
        argv.extend(["--token", token]);
    }
    let started = Started(command(ns, &argv).spawn().unwrap());
    until("drill agent did not listen", || in_ns_connects(ns, api));
    started
}

/// drill's own engine, started as a user's command: on the agent at `api` when given, else on
/// drill's host; `extra` goes under `system:` (env, token_env).
fn engine_system(api: Option<SocketAddr>, extra: &str) -> String {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");
    let agent = api.map_or(String::new(), |a| format!("  agent: \"http://{a}\"\n"));
    format!(
        "system:\n{agent}\
         \x20 command: [drill, engine, --config, \"{{work_dir}}/engine.yaml\"]\n\
         \x20 files: {{ engine.yaml: \"{fixtures}/builtin-engine.yaml.tmpl\" }}\n\
         \x20 ingest: {{ kind: http, path: /ingest }}\n\
         \x20 ready: {{ http: /stats }}\n\
         \x20 stats: {{ path: /stats }}\n\
         \x20 write_key: {{ mqtt_user_property: write-key }}\n\
         \x20 promise: at_least_once\n{extra}"
    )
}

/// A drill of an engine on the agent at `engine_api` through the link of the proxy at
/// `link_api`, against `broker`.
fn agent_drill(
    dir: &Path,
    name: &str,
    broker: SocketAddr,
    (link_api, engine_api): (SocketAddr, SocketAddr),
    extra: &str,
    rest: &str,
) -> String {
    crate::common::run::scenario(
        dir,
        name,
        &format!(
            "name: {name}\n\
             seed: 5\n\
             destination: {{ kind: mqtt, runtime: external, address: \"{broker}\", topic: drill/{name} }}\n\
             links: {{ mqtt: {{ remote: \"http://{link_api}\" }} }}\n\
             {}{rest}",
            engine_system(Some(engine_api), extra)
        ),
    )
}

/// mosquitto and a `drill agent` (no token) with the link in front of it, on this host.
struct OneAgent {
    dir: tempfile::TempDir,
    broker: SocketAddr,
    api: SocketAddr,
    work: std::path::PathBuf,
    _processes: [Started; 2],
}

impl OneAgent {
    fn start() -> Option<OneAgent> {
        let dir = tempfile::tempdir().unwrap();
        let broker = free();
        let mosquitto = mosquitto(dir.path(), None, broker)?;
        let (api, work) = (free(), dir.path().join("agent"));
        let agent = agent(None, api, None, free(), broker, &work);
        Some(OneAgent {
            dir,
            broker,
            api,
            work,
            _processes: [mosquitto, agent],
        })
    }
}

/// The report a run wrote, and its output.
fn run(file: &str, out: &Path, name: &str) -> (std::process::Output, serde_json::Value) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", file, "--out", &out.display().to_string()])
        .output()
        .unwrap();
    let report = std::fs::read_to_string(out.join(name).join("report.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    (o, report)
}

/// `drill run FILE --out OUT`, left running.
fn in_background(file: &str, out: &str) -> Started {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["run", file, "--out", out])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    Started(child)
}

fn agent_state(api: SocketAddr) -> serde_json::Value {
    crate::common::hosts::get_json(&format!("http://{api}/engine"), None)
}

fn powerfs_mounts(under: &Path) -> usize {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let under = under.display().to_string();
    mounts
        .lines()
        .filter(|l| l.starts_with("drill-powerfs") && l.contains(&under))
        .count()
}

/// Whether this machine can put a data directory on the power-cut filesystem; under CI it
/// must.
fn have_fuse() -> bool {
    let fuse =
        std::path::Path::new("/dev/fuse").exists() && nix::unistd::Uid::effective().is_root();
    assert!(
        fuse || std::env::var_os("CI").is_none(),
        "CI=true and the power-cut filesystem cannot be mounted here (/dev/fuse, root)"
    );
    fuse
}

/// Every engine fault the agent carries out, in one drill: SIGSTOP/SIGCONT (while the link
/// refuses, so records wait in the paused engine), SIGKILL with a restart, a full disk and a
/// power cut, beside a refusal and a half-open link on the agent's link. drill's correct engine passes (nothing lost, the ledger closes); the same drill of the
/// `memory-only` mutant (it keeps what it holds in memory) fails with the records its SIGKILL
/// and power cut threw away. The engine's log comes back to the report folder, and nothing is
/// left on the agent: no engine, no mount, no folder.
#[test]
fn an_engine_on_an_agent_goes_through_every_engine_fault_and_a_broken_one_fails() {
    if !have_fuse() {
        println!("skipped: no /dev/fuse or not root");
        return;
    }
    let Some(one) = OneAgent::start() else {
        return;
    };
    let (dir, broker, api, work) = (&one.dir, one.broker, one.api, one.work.clone());
    let faults = "workload: { rate: 100/s, duration: 24s, keys: 4 }\n\
                  faults:\n\
                  \x20 - { at: 3s, link: mqtt, fault: refuse, for: 5s }\n\
                  \x20 - { at: 5s, target: engine, action: pause, restart_after: 2s }\n\
                  \x20 - { at: 10s, link: mqtt, fault: swallow, direction: downstream, for: 6s }\n\
                  \x20 - { at: 12s, target: engine, action: kill, restart_after: 2s }\n\
                  \x20 - { at: 17s, target: engine, action: fill_disk, for: 2s }\n\
                  \x20 - { at: 20s, target: engine, action: power_cut, restart_after: 1s }\n\
                  expect: { lost: 0, ledger: closes }\n";
    let file = agent_drill(dir.path(), "on-agent", broker, (api, api), "", faults);
    let out = dir.path().join("out");
    let (o, report) = run(&file, &out, "on-agent");
    println!("correct engine: {}", report["ledger"]);
    assert_eq!(o.status.code(), Some(0), "{}", crate::common::run::show(&o));
    assert_eq!(report["ledger"]["lost"], 0);
    let struck: Vec<String> = report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{} {}", f["target"], f["fault"]))
        .collect();
    for expected in [
        "pause (SIGSTOP)",
        "kill (SIGKILL)",
        "power cut (SIGKILL; ",
        "disk full",
    ] {
        assert!(
            struck.iter().any(|f| f.contains(expected)),
            "{expected} missing from {struck:?}"
        );
    }
    let cut = struck.iter().find(|f| f.contains("power cut")).unwrap();
    let unsynced: u64 = cut
        .split("SIGKILL; ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of unsynced writes in {cut}"));
    assert!(unsynced > 0, "{cut}");
    let log = std::fs::read_to_string(out.join("on-agent/engine.log")).unwrap();
    assert!(log.contains("listening on 127.0.0.1:"), "{log}");
    assert!(log.contains("drill: restarted by the drill"), "{log}");
    assert_eq!(agent_state(api)["run"], serde_json::Value::Null);
    assert_eq!(powerfs_mounts(&work), 0);
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);

    let broken = agent_drill(
        dir.path(),
        "on-agent-broken",
        broker,
        (api, api),
        "  env: { DRILL_MUTANT: memory-only }\n",
        faults,
    );
    let (o, report) = run(&broken, &out, "on-agent-broken");
    println!("memory-only: {}", report["ledger"]);
    assert_eq!(o.status.code(), Some(1), "{}", crate::common::run::show(&o));
    assert_eq!(report["verdict"], "fail");
    assert!(report["ledger"]["lost"].as_u64() > Some(0), "{report:#}");
}

/// A drill SIGKILLed while its engine runs on the agent leaves no engine there: the agent
/// SIGKILLs it once the lease runs out (not before the lease, within a generous bound after),
/// and the next drill, started at once, waits for that and runs.
#[test]
fn a_drill_killed_mid_run_leaves_no_engine_on_the_agent() {
    let Some(one) = OneAgent::start() else {
        return;
    };
    let (dir, broker, api, work) = (&one.dir, one.broker, one.api, one.work.clone());
    let rest = "workload: { rate: 50/s, duration: 6s }\nexpect: { lost: 0 }\n";
    let file = agent_drill(dir.path(), "killed", broker, (api, api), "", rest);
    let out = dir.path().join("out").display().to_string();
    let mut drill = in_background(&file, &out);
    let marker = work.join("killed-5-").display().to_string();
    let held = || agent_state(api)["run"] == "killed-5";
    until("the engine never ran on the agent", held);
    assert!(running(&marker) > 0);
    let killed = Instant::now();
    drill.0.kill().unwrap();
    let _ = drill.0.wait();
    // The agent forgets the engine once it is dead and its folder removed.
    until("the agent kept the dead drill's engine", || {
        running(&marker) == 0 && agent_state(api)["run"].is_null()
    });
    let gone = killed.elapsed();
    println!("the engine on the agent was SIGKILLed {gone:?} after its drill");
    assert!(
        gone >= Duration::from_secs(3) && gone <= Duration::from_secs(9),
        "{gone:?}"
    );
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "a folder left"
    );
    // A drill whose engine the agent still holds waits for that lease, then runs.
    let mut first = in_background(&file, &out);
    until("the engine never ran on the agent", held);
    first.0.kill().unwrap();
    let _ = first.0.wait();
    let started = Instant::now();
    let (o, report) = run(&file, &dir.path().join("out"), "killed");
    let waited = started.elapsed();
    println!("the next drill waited and ran in {waited:?}");
    assert_eq!(o.status.code(), Some(0), "{}", crate::common::run::show(&o));
    // One lease (5 s) and the drill itself (12.9 s measured): bounded, not forever.
    assert!(waited < Duration::from_secs(45), "{waited:?}");
    assert_eq!(report["ledger"]["lost"], 0);
}

/// What an agent cannot do is an invalid scenario: exit 2, one line with file:line:col, before
/// anything starts.
#[test]
fn what_an_agent_cannot_do_exits_2_located() {
    let dir = tempfile::tempdir().unwrap();
    let api = "127.0.0.1:9";
    let ext = "destination: { kind: mqtt, runtime: external, address: \"127.0.0.1:1883\" }\n";
    let link = "links: { mqtt: { remote: \"http://127.0.0.1:19\" } }\n";
    let a: SocketAddr = api.parse().unwrap();
    let cases = [
        (
            "builtin-on-agent",
            format!("{ext}{link}system: {{ agent: \"http://{api}\" }}\n"),
            "an agent runs a user's engine",
            "\"http://127.0.0.1:9\"",
        ),
        (
            "not-a-url",
            format!(
                "{ext}{link}{}",
                engine_system(Some(a), "").replace(&format!("http://{api}"), "agent-host")
            ),
            "give http://HOST:PORT",
            "\"agent-host\"",
        ),
        (
            "no-remote-link",
            format!("{ext}{}", engine_system(Some(a), "")),
            "serve the destination's link there too",
            "\"http://127.0.0.1:9\"",
        ),
        (
            "scenario-dir",
            format!(
                "{ext}{link}{}",
                engine_system(Some(a), "  env: { CONF: \"{scenario_dir}/x\" }\n")
            ),
            "`{scenario_dir}…}` names a file or folder on drill's host",
            "\"http://127.0.0.1:9\"",
        ),
        (
            "https",
            format!(
                "{ext}{link}{}",
                engine_system(Some(a), "").replace("http://", "https://")
            ),
            "give http://HOST:PORT",
            "\"https://127.0.0.1:9\"",
        ),
        (
            "crash-point",
            format!(
                "{ext}{link}{}faults:\n  - {{ at: 1s, target: engine, action: power_cut, crash_at: {{ op: fsync, path: \"records-*.log\" }} }}\n",
                engine_system(Some(a), "")
            ),
            "crash points are not carried out by a drill agent",
            "{ at: 1s",
        ),
        (
            "token-unset",
            format!(
                "{ext}{link}{}",
                engine_system(Some(a), "  token_env: DRILL_TEST_NO_SUCH_TOKEN\n")
            ),
            "`DRILL_TEST_NO_SUCH_TOKEN` is not set",
            "DRILL_TEST_NO_SUCH_TOKEN",
        ),
        (
            "token-without-agent",
            format!(
                "{ext}{}",
                engine_system(None, "  token_env: DRILL_TEST_NO_SUCH_TOKEN\n")
            ),
            "it goes with `system.agent`",
            "DRILL_TEST_NO_SUCH_TOKEN",
        ),
    ];
    for (name, body, says, points_at) in cases {
        let text = format!("name: {name}\n{body}workload: {{ rate: 10/s, duration: 5s }}\n");
        crate::common::run::refused_at(dir.path(), name, &text, says, points_at, &[]);
    }
    // An agent reachable from elsewhere needs a token.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["agent", "--api", "0.0.0.0:0"])
        .env_remove("DRILL_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", crate::common::run::show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs a bearer token"));
}

/// Found only at start: an agent that refuses the token exits 2, one that does not answer
/// exits 3 — one line each. (The link is another agent's, which takes no token.)
#[test]
fn an_agent_that_refuses_the_token_exits_2_and_one_that_is_not_there_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let broker = free();
    let Some(_broker) = mosquitto(dir.path(), None, broker) else {
        return;
    };
    let (link_api, engine_api) = (free(), free());
    let _link = agent(None, link_api, None, free(), broker, &dir.path().join("a"));
    let _engine = agent(
        None,
        engine_api,
        Some("s3cret"),
        free(),
        broker,
        &dir.path().join("b"),
    );
    let rest = "workload: { rate: 10/s, duration: 2s }\n";
    let with_token = |name: &str, engine_api: SocketAddr| {
        let file = agent_drill(
            dir.path(),
            name,
            broker,
            (link_api, engine_api),
            "  token_env: DRILL_TEST_AGENT_TOKEN\n",
            rest,
        );
        std::process::Command::new(env!("CARGO_BIN_EXE_drill"))
            .args(["run", &file, "--out"])
            .arg(dir.path().join("out"))
            .env("DRILL_TEST_AGENT_TOKEN", "wrong")
            .output()
            .unwrap()
    };
    for (name, api, code, says) in [
        ("refused", engine_api, 2, "refused the token"),
        ("absent", free(), 3, "did not answer"),
    ] {
        let o = with_token(name, api);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        println!("{name}: {}", err.trim());
        assert_eq!(
            o.status.code(),
            Some(code),
            "{}",
            crate::common::run::show(&o)
        );
        assert!(
            err.contains(says) && err.contains(&api.to_string()),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// The engine and a `drill agent` on host a, the broker and `drill run` on host b (two network
/// namespaces joined by a veth pair): the engine's records go a → b through the agent's link,
/// drill's workload and account reads b → a through the agent's relay. A refusal, a half-open
/// link and a SIGKILL of the engine across them give the verdict of the same drill with the
/// engine and drill's own link on host b; a drill SIGKILLed mid-fault on host b leaves neither
/// a fault nor an engine on host a.
#[test]
fn across_two_hosts_an_engine_on_the_agent_gets_its_single_host_verdict() {
    let Some(hosts) = TwoHosts::make() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let broker = SocketAddr::from((TwoHosts::B, 1883));
    let Some(_broker) = mosquitto(dir.path(), Some(&hosts.b), broker) else {
        return;
    };
    let api = SocketAddr::from((TwoHosts::A, 8474));
    let listen = SocketAddr::from(([127, 0, 0, 1], 1884));
    let work = dir.path().join("agent");
    let _agent = agent(Some(&hosts.a), api, Some("s3cret"), listen, broker, &work);
    let drill_text = |name: &str, on_agent: bool| {
        let (links, system) = if on_agent {
            (
                format!(
                    "links: {{ mqtt: {{ remote: \"http://{api}\", token_env: DRILL_TEST_AGENT_TOKEN }} }}\n"
                ),
                engine_system(Some(api), "  token_env: DRILL_TEST_AGENT_TOKEN\n"),
            )
        } else {
            (String::new(), engine_system(None, ""))
        };
        format!(
            "name: {name}\n\
             seed: 5\n\
             destination: {{ kind: mqtt, runtime: external, address: \"{broker}\", topic: drill/two }}\n\
             {links}{system}{CUT_HALF_OPEN_KILL}"
        )
    };
    let across = crate::common::run::scenario(dir.path(), "across", &drill_text("across", true));
    let twin = crate::common::run::scenario(dir.path(), "twin", &drill_text("twin", false));
    let run_in_b = |file: &str, name: &str| {
        let out = dir.path().join(format!("out-{name}"));
        let o = command(
            Some(&hosts.b),
            &[
                env!("CARGO_BIN_EXE_drill"),
                "run",
                file,
                "--out",
                &out.display().to_string(),
            ],
        )
        .env("DRILL_TEST_AGENT_TOKEN", "s3cret")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
        let report: serde_json::Value = std::fs::read_to_string(out.join(name).join("report.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_else(|| panic!("{name}: no report: {}", crate::common::run::show(&o)));
        (o, report)
    };
    let (o, across_report) = run_in_b(&across, "across");
    let (_, twin_report) = run_in_b(&twin, "twin");
    let summary = |r: &serde_json::Value| (r["verdict"].clone(), r["ledger"]["lost"].clone());
    println!(
        "across two hosts: {:?} {}; the twin on one: {:?} {}",
        summary(&across_report),
        across_report["ledger"],
        summary(&twin_report),
        twin_report["ledger"]
    );
    assert_eq!(o.status.code(), Some(0), "{}", crate::common::run::show(&o));
    assert_eq!(summary(&across_report), summary(&twin_report));
    assert_eq!(across_report["link"]["upstream"], broker.to_string());
    assert!(
        across_report["link"]["bytes_swallowed_downstream"].as_u64() > Some(0),
        "{:#}",
        across_report["link"]
    );
    assert!(
        across_report["system"]
            .to_string()
            .contains(&format!("drill agent http://{api}")),
        "{}",
        across_report["system"]
    );
    // A drill killed mid-fault on host b leaves nothing on host a.
    let on_a = |path: &str| {
        let o = command(
            Some(&hosts.b),
            &["bash", "-c", &format!("exec 3<>/dev/tcp/{}/{}; printf 'GET {path} HTTP/1.0\\r\\nAuthorization: Bearer s3cret\\r\\n\\r\\n' >&3; cat <&3", api.ip(), api.port())],
        )
        .stdout(std::process::Stdio::piped())
        .output()
        .unwrap();
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("null").to_string();
        serde_json::from_str::<serde_json::Value>(&body).unwrap_or_default()
    };
    let fault_now = || {
        on_a("/links")[0]["fault"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let out = dir.path().join("out-killed").display().to_string();
    let child = command(
        Some(&hosts.b),
        &[env!("CARGO_BIN_EXE_drill"), "run", &across, "--out", &out],
    )
    .env("DRILL_TEST_AGENT_TOKEN", "s3cret")
    .stdout(std::fs::File::create(dir.path().join("killed.log")).unwrap())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let mut drill = Started(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while fault_now() != "swallow" {
        let said = std::fs::read_to_string(dir.path().join("killed.log")).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "the swallow never reached host a: {said}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let marker = work.join("across-5-").display().to_string();
    assert!(running(&marker) > 0, "no engine on host a");
    let killed = Instant::now();
    drill.0.kill().unwrap();
    let _ = drill.0.wait();
    until("host a kept the dead drill's fault", || {
        fault_now() == "pass"
    });
    until("host a kept the dead drill's engine", || {
        on_a("/engine")["run"].is_null() && running(&marker) == 0
    });
    let gone = killed.elapsed();
    println!("host a: fault healed and engine ended {gone:?} after drill was SIGKILLed on host b");
    assert!(gone <= Duration::from_secs(9), "{gone:?}");
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "a folder left"
    );
}

/// The agent's API itself: one engine at a time, every call about it under the lease its order
/// was answered with (another lease, or none, is refused), the engine's port published for the
/// ordering address only, restarts counted, nothing left after `DELETE`, a file name that
/// would leave the run's folder refused, and nothing without the token.
#[tokio::test]
async fn the_agent_holds_one_engine_under_a_lease_for_one_address() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let (api, work) = (free(), dir.path().join("agent"));
    let _agent = agent(None, api, Some("s3cret"), free(), free(), &work);
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{api}{path}");
    let template = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/builtin-engine.yaml.tmpl"
    ))
    .unwrap();
    let order = |files: Vec<(String, String)>| drill::sut::remote::EngineOrder {
        run: "api-1".to_string(),
        argv: ["drill", "engine", "--config", "{work_dir}/engine.yaml"]
            .map(String::from)
            .to_vec(),
        env: Default::default(),
        files,
        values: [("link.mqtt", "127.0.0.1:9"), ("topic", "t")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        ports: vec![],
        ready: drill::scenario::Ready::Http {
            path: "/stats".to_string(),
            port: None,
        },
        ready_within_ms: 10_000,
        stop_grace_ms: 1_000,
        power: false,
        lease_ms: 60_000,
    };
    let engine_yaml = vec![("engine.yaml".to_string(), template)];
    let no_token = http.get(url("/engine")).send().await.unwrap();
    assert_eq!(no_token.status().as_u16(), 401);
    let put_order = |files: Vec<(String, String)>| {
        http.put(url("/engine"))
            .bearer_auth("s3cret")
            .json(&order(files))
            .send()
    };
    let put = put_order(engine_yaml.clone()).await.unwrap();
    assert_eq!(put.status().as_u16(), 200);
    let slot: drill::sut::remote::EngineSlot = put.json().await.unwrap();
    let lease = drill::sut::remote::LEASE_HEADER;
    // The engine's port, published: from the ordering address it answers ...
    let stats = http
        .get(format!("http://{}/stats", slot.ingest))
        .send()
        .await
        .unwrap();
    assert_eq!(stats.status().as_u16(), 200);
    // ... from another address it is closed at once.
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut s = other.connect(slot.ingest).await.unwrap();
    let _ = s.write_all(b"GET /stats HTTP/1.0\r\n\r\n").await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "another address got {:?}",
        String::from_utf8_lossy(&answer)
    );
    // One engine at a time; calls without its lease are refused.
    let again = put_order(engine_yaml).await.unwrap();
    assert_eq!(again.status().as_u16(), 409);
    let act = |act: serde_json::Value, with: Option<&str>| {
        let mut r = http
            .post(url("/engine/act"))
            .bearer_auth("s3cret")
            .json(&act);
        if let Some(l) = with {
            r = r.header(lease, l);
        }
        r.send()
    };
    let kill = serde_json::json!({"act": "kill"});
    assert_eq!(
        act(kill.clone(), None).await.unwrap().status().as_u16(),
        409
    );
    let other_lease = act(kill.clone(), Some("other")).await.unwrap();
    assert_eq!(other_lease.status().as_u16(), 409);
    let killed: serde_json::Value = act(kill, Some(&slot.lease))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(killed["starts"], 1);
    let start = serde_json::json!({"act": "start"});
    let started: serde_json::Value = act(start, Some(&slot.lease))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(started["starts"], 2);
    let marker = work.join("api-1-").display().to_string();
    assert!(running(&marker) > 0);
    let end = http
        .delete(url("/engine"))
        .bearer_auth("s3cret")
        .header(lease, &slot.lease)
        .send()
        .await
        .unwrap();
    assert_eq!(end.status().as_u16(), 204);
    assert_eq!(running(&marker), 0);
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "a folder left"
    );
    let outside = put_order(vec![("../x".to_string(), String::new())])
        .await
        .unwrap();
    assert_eq!(outside.status().as_u16(), 400);
    assert!(!dir.path().join("x").exists());
}

/// An order whose caller hangs up while the engine is still getting ready (drill killed at
/// start) leaves nothing running: the agent SIGKILLs the engine's whole process group, helper
/// children included, and takes the next order.
#[tokio::test]
async fn a_start_abandoned_halfway_leaves_no_process_of_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let (api, work) = (free(), dir.path().join("agent"));
    let _agent = agent(None, api, None, free(), free(), &work);
    // A wrapper that starts a helper and never gets ready (nothing listens on its ingest).
    let marker = format!("sleep 3{}", std::process::id() % 1000);
    let order = drill::sut::remote::EngineOrder {
        run: "abandoned-1".to_string(),
        argv: ["sh", "-c", &format!("{marker} & {marker}")]
            .map(String::from)
            .to_vec(),
        env: Default::default(),
        files: vec![],
        values: Default::default(),
        ports: vec![],
        ready: drill::scenario::Ready::Tcp,
        ready_within_ms: 60_000,
        stop_grace_ms: 1_000,
        power: false,
        lease_ms: 5_000,
    };
    let hung_up = reqwest::Client::new()
        .put(format!("http://{api}/engine"))
        .json(&order)
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(hung_up.is_err(), "the order was answered: {hung_up:?}");
    // The wrapper shell and its two sleeps.
    assert!(running(&marker) >= 2, "the engine was not running");
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(&marker) > 0 {
        assert!(
            Instant::now() < deadline,
            "the engine's group outlived its order"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "a folder left"
    );
}
