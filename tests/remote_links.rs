//! Links driven from another host (issue: past one machine). A fault put on a `drill proxy`
//! with a lease holds only while its driver renews it: a drill that crashes or loses its
//! network mid-fault leaves nothing applied. Real `drill proxy` processes, real sockets.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::hosts::{
    CUT_HALF_OPEN_KILL, Started, command, free, in_ns_connects, mosquitto, until,
};
use crate::common::{drill_proxy, echo, link_status};
use serde_json::json;

/// The link's fault as `GET /links` reports it.
async fn fault_on(api: std::net::SocketAddr) -> String {
    link_status(api).await["fault"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A leased fault holds while renewed, is healed by the proxy once renewals stop (not before
/// the lease, and within a generous bound after it), and cannot be renewed after; a fault put
/// after a `DELETE` carries no stale lease.
#[tokio::test]
async fn a_leased_fault_holds_while_renewed_and_heals_when_its_driver_stops() {
    let up = echo().await;
    let proxy = drill_proxy(Some(up.addr)).await;
    let http = reqwest::Client::new();
    let fault = format!("http://{}/links/t/fault", proxy.api);
    let lease = format!("http://{}/links/t/lease", proxy.api);
    let zero = http
        .put(&fault)
        .json(&json!({"fault": "refuse", "lease_ms": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(zero.status().as_u16(), 400);
    let put = http
        .put(&fault)
        .json(&json!({"fault": "refuse", "lease_ms": 600}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 200);
    // Renewed every 200 ms for 1.5 s: still in force, well past one lease.
    let renewing = Instant::now();
    let mut last_renewal = renewing;
    while renewing.elapsed() < Duration::from_millis(1500) {
        last_renewal = Instant::now();
        let r = http.post(&lease).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fault_on(proxy.api).await, "refuse");
    assert!(tokio::net::TcpStream::connect(proxy.listen).await.is_err());
    // The driver stops: the proxy heals the link by itself.
    let stopped = Instant::now();
    while fault_on(proxy.api).await != "pass" {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "the lease ran out and the fault is still there"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The proxy took the last renewal after it was sent, so it cannot heal before 600 ms.
    let healed_after = last_renewal.elapsed();
    println!("healed {healed_after:?} after the last renewal was sent (lease 600 ms)");
    assert!(
        healed_after >= Duration::from_millis(600),
        "{healed_after:?}"
    );
    assert!(tokio::net::TcpStream::connect(proxy.listen).await.is_ok());
    let late = http.post(&lease).send().await.unwrap();
    assert_eq!(late.status().as_u16(), 404);
    // DELETE ends the lease with the fault: a fault put later without one stays.
    http.put(&fault)
        .json(&json!({"fault": "refuse", "lease_ms": 300}))
        .send()
        .await
        .unwrap();
    http.delete(&fault).send().await.unwrap();
    let ended = http.post(&lease).send().await.unwrap();
    assert_eq!(
        ended.status().as_u16(),
        404,
        "DELETE ends the lease with the fault"
    );
    http.put(&fault)
        .json(&json!({"fault": "swallow"}))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(fault_on(proxy.api).await, "swallow");
}

/// `drill proxy` with the link `mqtt` from `listen` to `upstream`, its API on `api` behind
/// `token` (in `ns` when given).
fn remote_proxy(
    ns: Option<&str>,
    api: SocketAddr,
    token: &str,
    listen: SocketAddr,
    upstream: SocketAddr,
) -> Started {
    let (api_s, link) = (api.to_string(), format!("mqtt={listen},{upstream}"));
    let child = command(
        ns,
        &[
            env!("CARGO_BIN_EXE_drill"),
            "proxy",
            "--api",
            &api_s,
            "--token",
            token,
            "--link",
            &link,
        ],
    )
    .spawn()
    .unwrap();
    let started = Started(child);
    until("drill proxy did not listen", || in_ns_connects(ns, api));
    started
}

/// The drill the single-host and two-host runs share: through the remote link, a refusal, a
/// half-open link (answers swallowed) and a SIGKILL of the engine in the middle of it.
fn remote_drill(dir: &std::path::Path, broker: SocketAddr, api: SocketAddr) -> String {
    crate::common::run::scenario(
        dir,
        "remote-link",
        &format!(
            "name: remote-link\n\
             seed: 5\n\
             destination: {{ kind: mqtt, runtime: external, address: \"{broker}\", topic: drill/remote }}\n\
             links: {{ mqtt: {{ remote: \"http://{api}\", token_env: DRILL_TEST_PROXY_TOKEN }} }}\n\
             system: {{ builtin: {{ keepalive: 2s, answer_timeout: 3s }} }}\n\
             {CUT_HALF_OPEN_KILL}"
        ),
    )
}

/// `GET /links` on the proxy at `api` (from this host's network).
fn proxy_links(api: SocketAddr, token: &str) -> serde_json::Value {
    crate::common::hosts::get_json(&format!("http://{api}/links"), Some(token))
}

/// mosquitto and a `drill proxy` with the remote link in front of it, on this host, and the
/// remote-link drill for them.
struct OneHost {
    broker: SocketAddr,
    api: SocketAddr,
    file: String,
    _processes: [Started; 2],
}

impl OneHost {
    fn start(dir: &std::path::Path) -> Option<OneHost> {
        let broker = free();
        let mosquitto = mosquitto(dir, None, broker)?;
        let (api, listen) = (free(), free());
        let proxy = remote_proxy(None, api, "s3cret", listen, broker);
        Some(OneHost {
            broker,
            api,
            file: remote_drill(dir, broker, api),
            _processes: [mosquitto, proxy],
        })
    }
}

/// A drill through a link served by a `drill proxy` it did not start (here on this host):
/// the faults are applied over the token-protected API and bite (the engine's traffic crosses
/// the remote link), the report names the link and its calls' round trips, and nothing is
/// left applied on the proxy. A refused token and a link the proxy lacks exit 2, an API that
/// does not answer exits 3 — one line each, nothing applied.
#[test]
fn a_drill_through_a_remote_link_passes_and_leaves_nothing_applied() {
    let dir = tempfile::tempdir().unwrap();
    let Some(one) = OneHost::start(dir.path()) else {
        return;
    };
    let (broker, api, file) = (one.broker, one.api, one.file.clone());
    let ran = crate::common::run::run_drill_with(
        &file,
        "remote-link",
        &[],
        &[("DRILL_TEST_PROXY_TOKEN", "s3cret")],
    );
    let o = &ran.output;
    assert_eq!(o.status.code(), Some(0), "{}", crate::common::run::show(o));
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    // 2400 offered; about 200 are refused at ingest while the killed engine is down.
    assert!(
        ran.number(&["ledger", "delivered"]) >= 2000,
        "{}",
        ran.markdown
    );
    assert!(
        ran.number(&["link", "bytes_upstream"]) > 0,
        "{:#}",
        ran.report["link"]
    );
    assert!(
        ran.number(&["link", "bytes_swallowed_downstream"]) > 0,
        "{:#}",
        ran.report["link"]
    );
    assert!(
        ran.markdown
            .contains("remote link mqtt on the drill proxy at http://"),
        "{}",
        ran.markdown
    );
    assert!(
        ran.markdown.contains("round trip median"),
        "{}",
        ran.markdown
    );
    let links = proxy_links(api, "s3cret");
    assert_eq!(links[0]["fault"], "pass", "{links:#}");

    // Bad input and an unreachable proxy: one line each, nothing applied.
    let closed = free();
    for (token, at, code, says) in [
        ("wrong", api, 2, "refused the token"),
        ("s3cret", closed, 3, "check that drill proxy runs there"),
    ] {
        let file = remote_drill(dir.path(), broker, at);
        let ran = crate::common::run::run_drill_with(
            &file,
            "remote-link",
            &[],
            &[("DRILL_TEST_PROXY_TOKEN", token)],
        );
        let o = &ran.output;
        let said = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(code),
            "{}",
            crate::common::run::show(o)
        );
        assert_eq!(said.trim().lines().count(), 1, "one line: {said}");
        assert!(said.contains(says), "{said}");
    }
}

/// A drill stopped in the middle of a fault on a remote link leaves nothing applied: after
/// Ctrl-C (SIGINT) drill heals the link as it stops; after SIGKILL (a crash: drill can do
/// nothing) the proxy heals it once the lease is no longer renewed — not at once, and within
/// the 5 s lease and a generous margin.
#[test]
fn a_drill_stopped_mid_fault_leaves_no_fault_on_the_remote_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let Some(one) = OneHost::start(dir.path()) else {
        return;
    };
    let (api, file) = (one.api, one.file.clone());
    let fault_now = || {
        proxy_links(api, "s3cret")[0]["fault"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    for (signal, at_least, at_most) in [
        (
            nix::sys::signal::Signal::SIGINT,
            Duration::ZERO,
            Duration::from_secs(3),
        ),
        (
            nix::sys::signal::Signal::SIGKILL,
            Duration::from_secs(3),
            Duration::from_secs(9),
        ),
    ] {
        let out = dir.path().join(format!("out-{signal}"));
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_drill"))
            .args(["run", &file, "--out", &out.display().to_string()])
            .env("DRILL_TEST_PROXY_TOKEN", "s3cret")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut drill = Started(child);
        until("the drill's swallow never reached the remote link", || {
            fault_now() == "swallow"
        });
        let pid = nix::unistd::Pid::from_raw(drill.0.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        let stopped = Instant::now();
        let _ = drill.0.wait();
        until("the remote link kept the dead drill's fault", || {
            fault_now() == "pass"
        });
        let healed = stopped.elapsed();
        println!("{signal}: the remote link was healed {healed:?} after the drill was stopped");
        assert!(
            healed >= at_least && healed <= at_most,
            "{signal}: {healed:?}"
        );
    }
}

/// What a remote link cannot do is an invalid scenario: exit 2, one line with file:line:col,
/// before anything starts.
#[test]
fn what_a_remote_link_cannot_do_exits_2_located() {
    let dir = tempfile::tempdir().unwrap();
    let ext = "destination: { kind: mqtt, runtime: external, address: \"127.0.0.1:1883\" }\n";
    let link = "links: { mqtt: { remote: \"http://127.0.0.1:8474\" } }\n";
    let faults = |f: &str| format!("{ext}{link}faults:\n{f}");
    let cases = [
        (
            "not-external",
            format!("destination: {{ kind: mqtt }}\n{link}"),
            "use `destination.runtime: external`",
            "\"http://",
        ),
        (
            "not-a-url",
            format!("{ext}links: {{ mqtt: {{ remote: \"proxy-host\" }} }}\n"),
            "give http://HOST:PORT",
            "\"proxy-host\"",
        ),
        (
            "another-link",
            format!("{ext}links: {{ nats: {{ remote: \"http://127.0.0.1:8474\" }} }}\n"),
            "the destination's link is `mqtt`",
            "{ remote",
        ),
        (
            "token-unset",
            format!(
                "{ext}links: {{ mqtt: {{ remote: \"http://127.0.0.1:8474\", token_env: DRILL_TEST_NO_SUCH_TOKEN }} }}\n"
            ),
            "`DRILL_TEST_NO_SUCH_TOKEN` is not set",
            "DRILL_TEST_NO_SUCH_TOKEN",
        ),
        (
            "overlapping",
            faults(
                "  - { at: 1s, link: mqtt, fault: refuse, for: 3s }\n  - { at: 2s, link: mqtt, fault: swallow, for: 1s }\n",
            ),
            "holds one fault at a time",
            "{ at: 2s",
        ),
        (
            "proxy-restart",
            faults("  - { at: 1s, target: proxy, action: restart, down_for: 1s }\n"),
            "a proxy restart acts on drill's own links",
            "{ at: 1s",
        ),
    ];
    for (name, body, says, points_at) in cases {
        let text = format!("name: {name}\n{body}workload: {{ rate: 10/s, duration: 5s }}\n");
        crate::common::run::refused_at(dir.path(), name, &text, says, points_at, &[]);
    }
}
