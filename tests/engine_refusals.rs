//! Only the destination decides a write's fate (docs/src/design.md#rule-1-2): a real mosquitto
//! refuses one oversized record (PUBACK 0x95) while it accepts the others. The engine counts
//! exactly 10 refusals with growing gaps, an outage in the middle spends none, the record lands in
//! Failed messages with the broker's words, and a replay after the limit is raised delivers one
//! copy with the same write key. Backoff is scaled down (100 ms → 400 ms) to keep the test short.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drill::dest::mqtt::read::Reader;
use drill::engine::{DurText, EngineConfig, OutputConfig, RefusalConfig};
use drill::promise::Order;
use drill::sut::EngineProcess;
use tokio_util::sync::CancellationToken;

use crate::common::engine::{attempts, ingest_keyed};

struct Mosquitto(Child);

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn mosquitto(dir: &Path, port: u16, limit: Option<usize>) -> Mosquitto {
    let bin =
        drill::dest::mqtt::broker::mosquitto_path().expect("mosquitto is installed (ci/setup.sh)");
    let conf = dir.join(format!("m-{port}-{}.conf", limit.unwrap_or(0)));
    let mut text = format!("listener {port} 127.0.0.1\nallow_anonymous true\nuser root\n");
    if let Some(limit) = limit {
        text.push_str(&format!("message_size_limit {limit}\n"));
    }
    std::fs::write(&conf, text).unwrap();
    let child = Command::new(bin)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "mosquitto did not start on {port}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Mosquitto(child)
}

/// The attempts journal's refusals of one write key.
fn refused(dir: &Path, key: &str) -> Vec<serde_json::Value> {
    attempts(dir)
        .into_iter()
        .filter(|v| v["key"] == key && v["outcome"] == "refused")
        .collect()
}

fn drill_cli(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn wait_until(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_counted_refusals_then_failed_then_one_copy_on_replay() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let port = drill::process::free_port().unwrap();
    let broker: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut mq = mosquitto(work, port, Some(2000)).await;
    let cancel = CancellationToken::new();
    let t0 = Instant::now();
    let reader = Reader::start(broker, "t/refusals", t0, cancel.clone())
        .await
        .unwrap();
    let config = EngineConfig {
        tail: None,
        consume: None,
        outbox: None,
        listen: ([127, 0, 0, 1], drill::process::free_port().unwrap()).into(),
        data_dir: work.join("engine-data"),
        outputs: vec![OutputConfig {
            order: Order::Any,
            keepalive: DurText(Duration::from_secs(1)),
            answer_timeout: DurText(Duration::from_secs(2)),
            window: 16,
            refusals: Some(RefusalConfig {
                max: 10,
                backoff: [
                    DurText(Duration::from_millis(100)),
                    DurText(Duration::from_millis(400)),
                ],
            }),
            ..OutputConfig::new("mqtt", "mqtt", broker, "t/refusals")
        }],
        disk: Default::default(),
    };
    let mut engine = EngineProcess::start(Path::new(env!("CARGO_BIN_EXE_drill")), config, work)
        .await
        .unwrap();
    // 50 records, the poison (too large for the broker), 50 more; the poison's write key.
    let lines = (0..50)
        .map(|i| format!("{{\"id\":\"r/{i}\"}}\n"))
        .chain([format!(
            "{{\"id\":\"poison\",\"pad\":\"{}\"}}\n",
            "x".repeat(5000)
        )])
        .chain((50..100).map(|i| format!("{{\"id\":\"r/{i}\"}}\n")));
    let keys = ingest_keyed(engine.addr(), lines).await;
    let poison = keys[50].clone();

    // Three refusals, then the broker goes away for 1.5 s and comes back (same limit).
    wait_until("3 refusals", Duration::from_secs(20), async || {
        refused(work, &poison).len() >= 3
    })
    .await;
    drop(mq);
    let during = refused(work, &poison).len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        refused(work, &poison).len(),
        during,
        "an outage spends no attempt"
    );
    mq = mosquitto(work, port, Some(2000)).await;
    wait_until(
        "the record set aside",
        Duration::from_secs(30),
        async || engine.stats().await.map(|s| s.failed == 1).unwrap_or(false),
    )
    .await;

    let refusals = refused(work, &poison);
    assert_eq!(refusals.len(), 10, "exactly 10 counted refusals");
    let opened: Vec<u64> = refusals
        .iter()
        .map(|r| r["opened_ms"].as_u64().unwrap())
        .collect();
    let gaps: Vec<u64> = opened.windows(2).map(|w| w[1] - w[0]).collect();
    println!("refusal gaps (ms): {gaps:?}; outage after refusal {during}");
    assert!(
        gaps.iter().all(|g| *g >= 90),
        "backoff between refusals: {gaps:?}"
    );
    assert!(gaps[1] > gaps[0] + 50, "backoff grows: {gaps:?}");
    assert!(
        gaps.iter().all(|g| *g < 400 + 150 || *g > 1000),
        "capped at 400 ms (outage aside): {gaps:?}"
    );
    assert!(
        refusals[0]["error"]
            .as_str()
            .unwrap()
            .contains("packet too large")
    );
    let stats = engine.stats().await.unwrap();
    assert_eq!(
        (stats.held, stats.delivered, stats.waiting, stats.failed),
        (101, 100, 0, 1)
    );

    let config_file = work.join("engine.yaml").display().to_string();
    let listed = drill_cli(&["engine", "failed", "list", "--config", &config_file]);
    assert!(
        listed.contains(&poison) && listed.contains("packet too large"),
        "{listed}"
    );

    // Raise the limit, replay: one copy, same write key.
    drop(mq);
    let _mq = mosquitto(work, port, None).await;
    let after = Reader::start(broker, "t/refusals", t0, cancel.clone())
        .await
        .unwrap();
    let replayed = drill_cli(&[
        "engine",
        "failed",
        "replay",
        "--config",
        &config_file,
        "--key",
        &poison,
    ]);
    assert!(
        replayed.contains("replayed 1 record") && replayed.contains(&poison),
        "{replayed}"
    );
    wait_until(
        "the replayed record delivered",
        Duration::from_secs(20),
        async || {
            engine
                .stats()
                .await
                .map(|s| s.failed == 0 && s.waiting == 0 && s.delivered == 101)
                .unwrap_or(false)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let received = after.stop().await;
    let copies: Vec<_> = received
        .arrivals
        .iter()
        .filter(|a| a.id.as_deref() == Some("poison"))
        .collect();
    assert_eq!(copies.len(), 1, "exactly one copy after the replay");
    assert_eq!(copies[0].write_key.as_deref(), Some(poison.as_str()));
    let before = reader.stop().await;
    assert!(
        !before
            .arrivals
            .iter()
            .any(|a| a.id.as_deref() == Some("poison")),
        "refused means not delivered"
    );
    engine.stop(Duration::from_secs(5)).await;
}
