//! drill's engine as the engine tests drive it: records posted to its `/ingest`, its `/stats`
//! waited on, its attempts journal read back, and a small real filesystem to fill.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use drill::engine::Stats;
use drill::sut::EngineProcess;
use futures::StreamExt;

/// One record as an ingest line: harness id `r-{i}` and `pad` bytes of padding.
pub fn record(i: usize, pad: usize) -> String {
    format!("{{\"id\":\"r-{i}\",\"pad\":\"{}\"}}\n", "x".repeat(pad))
}

/// Posts `lines` to the engine's `/ingest`, 100 a request, one request after the other; every
/// answer must be a success.
pub async fn ingest(engine: SocketAddr, lines: impl IntoIterator<Item = String>) {
    ingest_batches(engine, lines, 100, 1).await;
}

/// As [`ingest`], `batch` lines a request and up to `at_once` requests at a time (in any order
/// when more than one).
pub async fn ingest_batches(
    engine: SocketAddr,
    lines: impl IntoIterator<Item = String>,
    batch: usize,
    at_once: usize,
) {
    let client = reqwest::Client::new();
    let lines: Vec<String> = lines.into_iter().collect();
    futures::stream::iter(lines.chunks(batch))
        .for_each_concurrent(at_once, |chunk| {
            let client = client.clone();
            async move {
                let answer = client
                    .post(format!("http://{engine}/ingest"))
                    .body(chunk.concat())
                    .send()
                    .await
                    .unwrap();
                let status = answer.status();
                assert!(status.is_success(), "ingest answered {status}");
            }
        })
        .await;
}

/// Posts `lines` to the engine's `/ingest` 50 a request, asking for every record's write key
/// (`?write_keys=all`); returns the keys in the order of `lines`.
pub async fn ingest_keyed(
    engine: SocketAddr,
    lines: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let client = reqwest::Client::new();
    let lines: Vec<String> = lines.into_iter().collect();
    let mut keys = Vec::new();
    for chunk in lines.chunks(50) {
        let answer: serde_json::Value = client
            .post(format!("http://{engine}/ingest?write_keys=all"))
            .body(chunk.concat())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for k in answer["write_keys"].as_array().unwrap() {
            keys.push(k.as_str().unwrap().to_string());
        }
    }
    keys
}

/// Polls the engine's `/stats` until `cond` holds and returns them; fails after `within`,
/// naming `what` it waited for and the last stats.
pub async fn wait_stats(
    engine: &EngineProcess,
    what: &str,
    within: Duration,
    cond: impl Fn(&Stats) -> bool,
) -> Stats {
    let deadline = Instant::now() + within;
    loop {
        let stats = engine.stats().await.unwrap();
        if cond(&stats) {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every line of the attempts journal the engine keeps under `work/engine-data`.
pub fn attempts(work: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(work.join("engine-data/attempts.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A tmpfs mounted for one test (needs root), unmounted (lazily) when dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`4m`) at `at`, made if missing; `None` if it cannot.
    pub fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then(|| Tmpfs(at.to_path_buf()))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
