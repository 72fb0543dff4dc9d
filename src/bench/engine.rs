//! `drill bench engine`, ingest: durable ingest (acknowledged only after fdatasync) against a
//! raw sequential write + fdatasync of the same bytes in the same batch sizes on the same disk,
//! over HTTP with one client and with eight; then the parts in [`super::depth`]. It prints
//! numbers; it asserts nothing.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{BenchError, depth};
use crate::dest::Kind;

/// How much `drill bench engine` measures. [`EngineOptions::from_env`] gives the published
/// run; the variables below shrink it for a quick look.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub record_bytes: usize,
    /// Seconds to spend on each path and batch size (roughly).
    pub seconds: f64,
    /// Which parts run: `ingest`, `drain`, `held`, `verify` (`DRILL_BENCH_PARTS`, comma
    /// separated; all by default).
    pub parts: Vec<String>,
    /// Records in each drained backlog (`DRILL_BENCH_DRAIN`, default 1 000 000).
    pub drain_records: u64,
    /// Rounds of engine drain and raw client taking turns, per destination
    /// (`DRILL_BENCH_DRAIN_ROUNDS`, default 3).
    pub drain_rounds: usize,
    /// Destination kinds drained (`DRILL_BENCH_DESTINATIONS`, comma separated: `kafka`,
    /// `nats`, `mqtt`; all by default).
    pub destinations: Vec<Kind>,
    /// Held records at which the engine's memory is read (`DRILL_BENCH_HELD`, default
    /// `1000000,10000000`).
    pub held_marks: Vec<u64>,
    /// Arrivals the verifier reconciles (`DRILL_BENCH_ARRIVALS`, default 10 000 000).
    pub arrivals: u64,
}

impl EngineOptions {
    pub fn from_env() -> EngineOptions {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str, default: u64| {
            var(name)
                .and_then(|v| v.replace('_', "").parse().ok())
                .unwrap_or(default)
        };
        EngineOptions {
            record_bytes: 200,
            seconds: 3.0,
            parts: var("DRILL_BENCH_PARTS")
                .map(|v| v.split(',').map(|p| p.trim().to_string()).collect())
                .unwrap_or_else(|| {
                    ["ingest", "drain", "held", "verify"]
                        .map(String::from)
                        .to_vec()
                }),
            drain_records: number("DRILL_BENCH_DRAIN", 1_000_000),
            drain_rounds: number("DRILL_BENCH_DRAIN_ROUNDS", 3).clamp(1, 100) as usize,
            destinations: var("DRILL_BENCH_DESTINATIONS")
                .map(|v| v.split(',').filter_map(|k| Kind::parse(k.trim())).collect())
                .unwrap_or_else(|| {
                    Kind::ALL
                        .iter()
                        .copied()
                        .filter(|k| k.entry().bench.is_some())
                        .collect()
                }),
            held_marks: var("DRILL_BENCH_HELD")
                .map(|v| {
                    v.split(',')
                        .filter_map(|n| n.trim().replace('_', "").parse().ok())
                        .collect()
                })
                .unwrap_or_else(|| vec![1_000_000, 10_000_000]),
            arrivals: number("DRILL_BENCH_ARRIVALS", 10_000_000),
        }
    }

    fn runs(&self, part: &str) -> bool {
        self.parts.iter().any(|p| p == part)
    }
}

struct Rate {
    records: u64,
    bytes: u64,
    took: Duration,
}

impl Rate {
    fn zero() -> Rate {
        Rate {
            records: 0,
            bytes: 0,
            took: Duration::ZERO,
        }
    }
    fn add(&mut self, other: Rate) {
        self.records += other.records;
        self.bytes += other.bytes;
        self.took += other.took;
    }
    fn per_s(&self) -> f64 {
        self.records as f64 / self.took.as_secs_f64()
    }
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.took.as_secs_f64() / 1e6
    }
    fn cell(&self, against: &Rate) -> String {
        format!(
            "{:.0} rec/s, {:.1} MB/s ({:.2}×)",
            self.per_s(),
            self.mb_per_s(),
            self.per_s() / against.per_s()
        )
    }
}

pub(crate) fn record_line(i: u64, bytes: usize) -> String {
    let head = format!("{{\"id\":\"bench/{i}\",\"pad\":\"");
    let pad = bytes.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// Slices per path and batch size in `drill bench engine`.
const ROUNDS: usize = 5;

/// Like [`timed`], but `prepare` makes each call's input off the clock, and what the call
/// hands on is dropped off the clock too.
fn timed_with<T, U>(
    seconds: f64,
    batch: usize,
    record_bytes: usize,
    mut prepare: impl FnMut() -> T,
    mut one: impl FnMut(T) -> Result<U, BenchError>,
) -> Result<Rate, BenchError> {
    let mut took = Duration::ZERO;
    let mut n = 0u64;
    while took.as_secs_f64() < seconds {
        let input = prepare();
        let started = Instant::now();
        let handed_on = one(input)?;
        took += started.elapsed();
        drop(handed_on);
        n += 1;
    }
    Ok(Rate {
        records: n * batch as u64,
        bytes: n * (batch * record_bytes) as u64,
        took,
    })
}

/// Runs `batch` until `seconds` have passed; returns records and payload bytes per second.
fn timed(
    seconds: f64,
    batch: usize,
    record_bytes: usize,
    mut one: impl FnMut(u64) -> Result<(), BenchError>,
) -> Result<Rate, BenchError> {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        one(n)?;
        n += 1;
    }
    Ok(Rate {
        records: n * batch as u64,
        bytes: n * (batch * record_bytes) as u64,
        took: started.elapsed(),
    })
}

/// `clients` HTTP clients posting `body` (a batch of `batch` records) back to back for
/// `seconds`, each waiting for its answer before its next post.
async fn http_clients(
    http: &reqwest::Client,
    url: &str,
    body: &str,
    clients: usize,
    seconds: f64,
    batch: usize,
    record_bytes: usize,
) -> Result<Rate, BenchError> {
    let started = Instant::now();
    let limit = Duration::from_secs_f64(seconds);
    let posts = (0..clients).map(|_| async {
        let mut n = 0u64;
        while started.elapsed() < limit {
            let answer = http
                .post(url)
                .body(body.to_string())
                .send()
                .await
                .map_err(std::io::Error::other)?;
            if !answer.status().is_success() {
                return Err(BenchError::Io(std::io::Error::other(format!(
                    "ingest answered {}",
                    answer.status()
                ))));
            }
            n += 1;
        }
        Ok::<u64, BenchError>(n)
    });
    let counts = futures::future::join_all(posts).await;
    let took = started.elapsed();
    let mut n = 0;
    for c in counts {
        n += c?;
    }
    Ok(Rate {
        records: n * batch as u64,
        bytes: n * (batch * record_bytes) as u64,
        took,
    })
}

/// `drill bench engine`: durable ingest (acknowledged only after fdatasync) against a raw
/// sequential write + fdatasync of the same bytes in the same batch sizes on the same disk;
/// then (see [`depth`]) backlog drains against the raw clients, memory with millions held,
/// and the verifier over millions of arrivals.
pub fn engine(drill_exe: &Path, dir: &Path, o: EngineOptions) -> Result<String, BenchError> {
    let work = dir.join(format!("drill-bench-engine-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let machine = machine();
    let mut out = format!(
        "drill bench engine: {}-byte records, on {} ({machine})\n",
        o.record_bytes,
        dir.display(),
    );
    if o.runs("ingest") {
        out.push_str(&ingest_table(drill_exe, &work, &runtime, &o)?);
    }
    if o.runs("drain") {
        out.push_str(&drain_table(drill_exe, &work, &runtime, &o));
    }
    if o.runs("held") && !o.held_marks.is_empty() {
        let (marks, peak) = runtime.block_on(depth::held_memory(
            drill_exe,
            &work,
            &o.held_marks,
            o.record_bytes,
        ))?;
        out.push_str("\nEngine memory with records held behind a refused destination (VmRSS):\n\n| held | engine RSS |\n|---:|---:|\n");
        for (held, rss) in marks {
            out.push_str(&format!("| {held} | {:.1} MB |\n", rss as f64 / 1e6));
        }
        out.push_str(&format!(
            "\nHighest RSS seen while filling: {:.1} MB. Target: ≤ 200 MB with 10 M records held.\n",
            peak as f64 / 1e6
        ));
    }
    if o.runs("verify") {
        let (took, extra, inputs) = depth::reconcile(o.arrivals)?;
        out.push_str(&format!(
            "\nVerifier: `verify::reconcile` of {} records sent and {} arrived: {:.2} s, its own peak {:.0} MB above the inputs (which take {:.0} MB). Target: ≤ 10 s and ≤ 1 GB.\n",
            o.arrivals,
            o.arrivals,
            took.as_secs_f64(),
            extra as f64 / 1e6,
            inputs as f64 / 1e6
        ));
    }
    if std::env::var_os("DRILL_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(out)
}

/// Backlog drains against the raw clients, [`depth::drain`] for each destination kind.
fn drain_table(
    drill_exe: &Path,
    work: &Path,
    runtime: &tokio::runtime::Runtime,
    o: &EngineOptions,
) -> String {
    let mut out = format!(
        "\nBacklog drain: {} records held behind a refused link, then healed; the same records through the same healed link with the raw client, as many in flight. {} rounds per destination, engine and raw client taking turns (engine first, then raw client first, ...), each on a fresh topic or stream. Engine time from the first attempt it opened to the last it closed, by its own journal (`attempts.jsonl`); reconnect: from the heal to that first attempt. CPU per record: the engine process; this process while the raw client ran (the raw client and the link); this process while the engine drained (the link alone, and polling).\n\n",
        o.drain_records, o.drain_rounds
    );
    out.push_str("| destination | ratio per round | median round: engine | raw client | ratio | engine CPU/rec | raw client + link CPU/rec | link CPU/rec | in flight | reconnect after heal |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for &kind in &o.destinations {
        let drained = runtime.block_on(depth::drain(
            drill_exe,
            work,
            kind,
            o.drain_records,
            o.record_bytes,
            o.drain_rounds,
        ));
        let d = match drained {
            Ok(d) => d,
            Err(e) => {
                out.push_str(&format!(
                    "| {kind:?} | not measured: {e} | | | | | | | | |\n"
                ));
                continue;
            }
        };
        let client = match d.kind {
            "kafka" => "rdkafka FutureProducer",
            "nats" => "async-nats JetStream publish",
            _ => "drill's MQTT 5 QoS 1",
        };
        let per_round: Vec<String> = d
            .rounds
            .iter()
            .map(|r| format!("{:.2}×", r.ratio()))
            .collect();
        let m = d.median();
        let rate = |took: Duration| d.records as f64 / took.as_secs_f64();
        let micros = |cpu: Duration| format!("{:.1} µs", cpu.as_secs_f64() * 1e6);
        out.push_str(&format!(
            "| {} ({}) | {} | {:.0} rec/s ({:.1} s) | {:.0} rec/s ({:.1} s, {client}) | {:.2}× | {} | {} | {} | {} | {:.1} s |\n",
            d.kind,
            d.note,
            per_round.join(", "),
            rate(m.engine),
            m.engine.as_secs_f64(),
            rate(m.raw),
            m.raw.as_secs_f64(),
            m.ratio(),
            micros(m.engine_cpu),
            micros(m.raw_cpu),
            micros(m.link_cpu),
            d.window,
            m.reconnect.as_secs_f64()
        ));
    }
    out.push_str("\nTarget: drain ≥ 0.7× the raw client to the same broker.\n");
    out
}

/// `uname -srm` and the core count, for the table's heading.
fn machine() -> String {
    let uname = Command::new("uname")
        .arg("-srm")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{uname}, {cores} cores")
}

/// Ingest: raw write+fdatasync, the engine's log alone, and the engine over HTTP with one
/// and with eight clients, in interleaved slices.
fn ingest_table(
    drill_exe: &Path,
    work: &Path,
    runtime: &tokio::runtime::Runtime,
    o: &EngineOptions,
) -> Result<String, BenchError> {
    use crate::engine::log::RecordLog;
    let mut rows = Vec::new();
    // The engine under test, forwarding nowhere (its output's address refuses): this measures
    // ingest alone.
    let refused: SocketAddr = ([127, 0, 0, 1], 9).into();
    let engine =
        depth::EngineChild::start(drill_exe, &work.join("engine"), "mqtt", refused, "bench")?;
    let http = reqwest::Client::new();
    for batch in [1usize, 10, 100, 1000] {
        let lines: Vec<String> = (0..batch as u64)
            .map(|i| record_line(i, o.record_bytes))
            .collect();
        let bytes: Vec<u8> = lines
            .iter()
            .flat_map(|l| l.bytes().chain([b'\n']))
            .collect();

        let raw_path = work.join(format!("raw-{batch}"));
        let mut raw = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&raw_path)?;
        let log_dir = work.join(format!("log-{batch}"));
        let (mut log, _) = RecordLog::recover(&log_dir, crate::engine::log::DEFAULT_SEGMENT_BYTES)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let body = String::from_utf8_lossy(&bytes).into_owned();
        let url = format!("http://{}/ingest", engine.api);
        // The paths take turns in short slices, so a drift of the disk (or of whatever else
        // runs on the machine) falls on all of them alike.
        let (mut raw_rate, mut log_rate, mut one_rate, mut eight_rate) =
            (Rate::zero(), Rate::zero(), Rate::zero(), Rate::zero());
        let slice = o.seconds / ROUNDS as f64;
        for _ in 0..ROUNDS {
            raw_rate.add(timed(slice, batch, o.record_bytes, |_| {
                raw.write_all(&bytes)?;
                raw.sync_data()?;
                Ok(())
            })?);
            log_rate.add(timed_with(
                slice,
                batch,
                o.record_bytes,
                || (),
                |()| {
                    log.append_batch(lines.len(), lines.iter().map(String::as_str))
                        .map_err(|e| BenchError::from(std::io::Error::other(e.to_string())))
                },
            )?);
            one_rate.add(runtime.block_on(http_clients(
                &http,
                &url,
                &body,
                1,
                slice,
                batch,
                o.record_bytes,
            ))?);
            eight_rate.add(runtime.block_on(http_clients(
                &http,
                &url,
                &body,
                8,
                slice,
                batch,
                o.record_bytes,
            ))?);
        }
        let _ = std::fs::remove_file(&raw_path);
        drop(log);
        let _ = std::fs::remove_dir_all(&log_dir);
        rows.push((batch, raw_rate, log_rate, one_rate, eight_rate));
    }
    drop(engine);
    let _ = std::fs::remove_dir_all(work.join("engine"));
    let mut out = format!(
        "\nIngest, each batch acknowledged only after fdatasync; {:.1} s per cell; ratios against the raw write+fdatasync of the same bytes in the same batch size (one writer, one sync per batch):\n\n",
        o.seconds
    );
    out.push_str("| batch | raw write+fdatasync | engine log | engine over HTTP, 1 client | engine over HTTP, 8 clients |\n");
    out.push_str("|---:|---:|---:|---:|---:|\n");
    for (batch, raw, log, one, eight) in &rows {
        out.push_str(&format!(
            "| {batch} | {:.0} rec/s, {:.1} MB/s | {} | {} | {} |\n",
            raw.per_s(),
            raw.mb_per_s(),
            log.cell(raw),
            one.cell(raw),
            eight.cell(raw),
        ));
    }
    out.push_str("\nTarget: durable ingest with 8 clients ≥ 0.7× the raw write + fdatasync of the same bytes.\n");
    Ok(out)
}
