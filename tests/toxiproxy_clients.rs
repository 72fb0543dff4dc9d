//! Real Toxiproxy clients against `drill proxy`, unchanged: a Chaos Toolkit experiment
//! (chaostoolkit-toxiproxy) and a toxiproxy-python script that stack a latency and a bandwidth
//! toxic on one proxy — "a slow mobile link" — and measure the link from the client's side. Both
//! were refused with 409 while a drill link held one fault at a time; now both hold, each within
//! 10 % of what it asked for, and a second cut is still refused with the reason.

use std::process::Command;

use crate::common::run::{fixtures, required};
use crate::common::{drill_proxy, echo};
use serde_json::Value;

/// What the experiment asks for: 80 ms each way on the answers, 100 KB/s on the answers.
const LATENCY_MS: f64 = 80.0;
const RATE: f64 = 100_000.0;
/// The measure's bulk transfer: it comes back at the rate, the latency once on top.
const TOTAL: f64 = 300_000.0;

/// Whether python3 can import `module` (ci/setup.sh installs `package` from PyPI).
fn python_has(module: &str, package: &str) -> bool {
    let found = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .status()
        .is_ok_and(|s| s.success());
    required(found, &format!("{package} (PyPI)"))
}

/// The probe's numbers against what the toxics ask for, within 10 %.
fn within_ten_percent(measured: &Value) {
    let rtt = measured["rtt_ms"].as_f64().expect("rtt_ms");
    let rate = measured["rate"].as_f64().expect("rate");
    let expected_rate = TOTAL / (TOTAL / RATE + LATENCY_MS / 1000.0);
    println!(
        "latency {LATENCY_MS} ms + bandwidth {RATE} B/s stacked: rtt {rtt:.1} ms, rate {rate:.0} B/s (expected {expected_rate:.0})"
    );
    assert!(
        (rtt - LATENCY_MS).abs() <= 0.1 * LATENCY_MS,
        "rtt {rtt} ms for a latency of {LATENCY_MS} ms"
    );
    assert!(
        (rate - expected_rate).abs() <= 0.1 * expected_rate,
        "rate {rate} B/s, expected {expected_rate}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chaos_toolkit_experiment_stacking_latency_and_bandwidth_completes() {
    if !python_has("chaostoxi", "chaostoolkit-toxiproxy") || !python_has("chaoslib", "chaostoolkit")
    {
        return;
    }
    let up = echo().await;
    let proxy = drill_proxy(None).await;
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.json");
    let experiment = format!("{}/chaostoolkit/slow-mobile-link.json", fixtures());
    let chaos = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args([
                "-m",
                "chaostoolkit",
                "--no-version-check",
                "--no-log-file",
                "run",
            ])
            .arg("--journal-path")
            .arg(&journal)
            .arg(&experiment)
            .env("TOXIPROXY_URL", format!("http://{}", proxy.api))
            .env("ECHO_PORT", up.addr.port().to_string())
            .env("PYTHONPATH", format!("{}/chaostoolkit", fixtures()))
            .current_dir(journal.parent().unwrap())
            .output()
            .map(|o| (o, std::fs::read_to_string(&journal)))
    })
    .await
    .unwrap()
    .expect("python3 -m chaostoolkit runs");
    let (output, journal) = chaos;
    let said = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    println!("{said}");
    let journal: Value = serde_json::from_str(&journal.expect("the journal")).unwrap();
    assert_eq!(journal["status"], "completed", "{said}");
    assert!(output.status.success(), "{said}");
    let runs = journal["run"].as_array().unwrap();
    for action in runs.iter().filter(|r| r["activity"]["type"] == "action") {
        assert_eq!(action["status"], "succeeded", "{action:#}");
        assert_eq!(action["output"], true, "{action:#}");
    }
    let probe = runs
        .iter()
        .find(|r| r["activity"]["name"] == "measure the link")
        .expect("the probe ran");
    within_ten_percent(&probe["output"]);
    // The rollback removed the proxy.
    let proxies: Value = reqwest::get(format!("http://{}/proxies", proxy.api))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(proxies, serde_json::json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toxiproxy_python_stacks_toxics_and_is_refused_a_second_cut() {
    if !python_has("toxiproxy", "toxiproxy-python") {
        return;
    }
    let up = echo().await;
    let proxy = drill_proxy(None).await;
    let script = format!("{}/toxiproxy-python-stack.py", fixtures());
    let (api, echo_port) = (proxy.api.port().to_string(), up.addr.port().to_string());
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args([&script, &api, &echo_port])
            .output()
    })
    .await
    .unwrap()
    .expect("python3 runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let measured: Value = serde_json::from_str(stdout.trim()).unwrap();
    println!("{measured}");
    within_ten_percent(&measured);
    assert_eq!(measured["toxics"], serde_json::json!(["lag", "narrow"]));
    let second = measured["second_cut"].as_str().unwrap();
    assert!(second.contains("at most one cut"), "{second}");
}
