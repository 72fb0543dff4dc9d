//! `drill bench engine`, the engine at depth: how fast a held backlog drains to each kind of
//! destination against the raw client library sending the same records to the same broker,
//! how much memory the engine takes while millions of records are held, and how long the
//! verifier takes to reconcile millions of arrivals.
//!
//! Each drain is measured the way a drill meets it: the engine's output link (an in-process
//! [`crate::proxy::Link`]) refuses while `records` are ingested, then heals; the clock runs from
//! the first delivery the engine reports to the last. The raw client then sends the same
//! records (same bytes, same write key carried, same deliveries in flight) to the same broker
//! through the same healed link. This module prints numbers; it asserts nothing.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;

use super::BenchError;
use super::engine::record_line;
use crate::dest::{BenchBroker, BenchKind, Kind};
use crate::engine::Stats;
use crate::proxy::{Direction, Fault, Link};

pub(super) fn other(e: impl std::fmt::Display) -> BenchError {
    BenchError::Io(std::io::Error::other(e.to_string()))
}

/// A `drill engine` child, killed on drop.
pub(super) struct EngineChild {
    child: Child,
    pub(super) api: SocketAddr,
}

impl Drop for EngineChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl EngineChild {
    /// Starts `drill engine` in `dir` with one output of `kind` at `address`, the kind's own
    /// window (the engine.yaml leaves it out).
    pub(super) fn start(
        drill_exe: &Path,
        dir: &Path,
        kind: &str,
        address: SocketAddr,
        topic: &str,
    ) -> Result<EngineChild, BenchError> {
        std::fs::create_dir_all(dir)?;
        let api = crate::process::free_addr()?;
        let config = dir.join("engine.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: {api}\ndata_dir: {}\noutputs:\n  - {{ name: out, kind: {kind}, address: {address}, topic: {topic}, order: in_order }}\n",
                dir.join("data").display()
            ),
        )?;
        let log = std::fs::File::create(dir.join("engine.log"))?;
        let child = Command::new(drill_exe)
            .args(["engine", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let engine = EngineChild { child, api };
        super::wait_listening("drill engine", api)?;
        Ok(engine)
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The engine's resident memory, in bytes (`VmRSS`).
    pub(super) fn rss(&self) -> u64 {
        rss_of(self.pid())
    }
}

/// `VmRSS` of a process, in bytes (0 if unreadable).
pub fn rss_of(pid: u32) -> u64 {
    status_field(&format!("/proc/{pid}/status"), "VmRSS:")
}

fn status_field(path: &str, field: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

pub(super) async fn stats(http: &reqwest::Client, api: SocketAddr) -> Result<Stats, BenchError> {
    http.get(format!("http://{api}/stats"))
        .send()
        .await
        .map_err(other)?
        .json()
        .await
        .map_err(other)
}

/// Posts `total` records to the engine in batches of `batch` from `clients` concurrent
/// clients. Returns when every batch was answered 200; calls `at_each(held)` after every
/// `every` records.
pub(super) async fn fill(
    http: &reqwest::Client,
    api: SocketAddr,
    total: u64,
    batch: usize,
    clients: usize,
    record_bytes: usize,
) -> Result<(), BenchError> {
    let url = format!("http://{api}/ingest");
    let batches = total.div_ceil(batch as u64);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = FuturesUnordered::new();
    for _ in 0..clients {
        let (http, url, next) = (http.clone(), url.clone(), next.clone());
        tasks.push(async move {
            loop {
                let b = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if b >= batches {
                    return Ok::<(), BenchError>(());
                }
                let from = b * batch as u64;
                let to = (from + batch as u64).min(total);
                let mut body = String::with_capacity((to - from) as usize * (record_bytes + 1));
                for i in from..to {
                    body.push_str(&record_line(i, record_bytes));
                    body.push('\n');
                }
                let answer = http.post(&url).body(body).send().await.map_err(other)?;
                if !answer.status().is_success() {
                    return Err(other(format!("ingest answered {}", answer.status())));
                }
            }
        });
    }
    while let Some(done) = tasks.next().await {
        done?;
    }
    Ok(())
}

/// One round of a drain: the engine's drain and the raw client's, one right after the other.
#[derive(Debug, Clone)]
pub struct DrainRound {
    /// From the engine's first attempt opened to its last closed (`attempts.jsonl`).
    pub engine: Duration,
    /// From the heal to the first attempt (probe, reconnect).
    pub reconnect: Duration,
    /// CPU time of the engine process from the heal to its last delivery, per record.
    pub engine_cpu: Duration,
    pub raw: Duration,
    /// CPU time of this process (the raw client on its own runtime, and the link) over `raw`,
    /// per record.
    pub raw_cpu: Duration,
    /// CPU time of this process (the link and the stats polling) while the engine drained, per
    /// record: what `raw_cpu` holds besides the raw client.
    pub link_cpu: Duration,
}

impl DrainRound {
    /// Engine rate over raw-client rate.
    pub fn ratio(&self) -> f64 {
        self.raw.as_secs_f64() / self.engine.as_secs_f64()
    }
}

/// Drain measurements of one destination kind: `rounds` taking turns with the raw client.
pub struct Drain {
    pub kind: &'static str,
    pub records: u64,
    pub rounds: Vec<DrainRound>,
    pub window: usize,
    pub note: String,
}

impl Drain {
    /// The round whose ratio is the median (the lower middle one for an even count).
    pub fn median(&self) -> &DrainRound {
        let mut by_ratio: Vec<&DrainRound> = self.rounds.iter().collect();
        by_ratio.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
        by_ratio[(by_ratio.len() - 1) / 2]
    }
}

/// Linux reports process CPU times in `/proc` in units of `USER_HZ`, 100 a second on every
/// architecture it runs on (whatever the kernel's own tick).
const USER_HZ: u64 = 100;

/// User + system CPU time of a process so far (`/proc/<pid>/stat`, fields 14 and 15).
fn cpu_of(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces; the fields after it are plain numbers.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 1000 / USER_HZ)
}

/// One destination for every round of a drain: a broker of its kind and the in-process link
/// in front of it (refused while a backlog builds, healed for the drain and the raw client).
/// A bench broker with a drill link in front of it (the link started first, so a broker that
/// advertises an address is told the link's). Also the tap bench's path (`taps.rs`).
pub(super) struct Destination {
    pub(super) kind: Kind,
    pub(super) bench: &'static dyn BenchKind,
    pub(super) broker: BenchBroker,
    pub(super) link: Link,
}

impl Destination {
    pub(super) async fn start(dir: &Path, kind: Kind) -> Result<Destination, BenchError> {
        let Some(bench) = kind.entry().bench else {
            return Err(other(format!("{} takes no part in the bench", kind.name())));
        };
        let any: SocketAddr = "127.0.0.1:0".parse().map_err(other)?;
        // The link first: a broker that advertises an address is told the link's.
        let port = crate::process::free_port()?;
        let upstream = SocketAddr::from(([127, 0, 0, 1], port));
        let link = Link::start("bench", any, upstream, CancellationToken::new())
            .await
            .map_err(other)?;
        let advertise = link.listen_addr();
        let at = crate::dest::BenchAt {
            dir,
            port,
            advertise,
        };
        let broker = bench.start(at).await.map_err(other)?;
        link.set_upstream(broker.addr);
        Ok(Destination {
            kind,
            bench,
            broker,
            link,
        })
    }

    /// One run of `who` (`engine` or `raw`) in `round`.
    pub(super) fn run<'a>(&self, who: &'a str, round: usize) -> crate::dest::BenchRun<'a> {
        crate::dest::BenchRun {
            broker: self.broker.addr,
            via: self.link.listen_addr(),
            who,
            round,
        }
    }

    /// A fresh topic, stream or topic name for one run of `who` (`engine` or `raw`) in
    /// `round`: what each publishes to, named apart from every other.
    async fn fresh(&self, who: &str, round: usize) -> Result<String, BenchError> {
        self.bench.fresh(self.run(who, round)).await.map_err(other)
    }

    /// Frees what [`Destination::fresh`] made once its run is measured (a million records a
    /// run add up in a broker's memory over the rounds).
    async fn done_with(&self, who: &str, round: usize, topic: &str) {
        let gone = self.bench.done_with(self.run(who, round), topic).await;
        if let Err(e) = gone {
            eprintln!("drill bench: {}: {e} (left in place)", self.kind.name());
        }
    }
}

/// What one engine drain measured.
struct EngineDrain {
    took: Duration,
    reconnect: Duration,
    cpu: Duration,
    link_cpu: Duration,
}

/// One engine drain: a fresh engine publishing to `topic` holds `records` behind the refused
/// link, the link heals, and the clock runs from the first attempt the engine opened to the
/// last it closed (its own journal's times).
async fn engine_drain(
    drill_exe: &Path,
    dir: &Path,
    to: &Destination,
    topic: &str,
    records: u64,
    record_bytes: usize,
) -> Result<EngineDrain, BenchError> {
    let http = reqwest::Client::new();
    let _ = std::fs::remove_dir_all(dir);
    to.link.apply_settled(Fault::Refuse, Direction::Both).await;
    let engine = EngineChild::start(drill_exe, dir, to.kind.name(), to.link.listen_addr(), topic)?;
    fill(&http, engine.api, records, 1000, 8, record_bytes).await?;
    let held = stats(&http, engine.api).await?;
    if held.held != records || held.delivered != 0 {
        return Err(other(format!(
            "before the heal the engine holds {} and delivered {} (expected {records} and 0)",
            held.held, held.delivered
        )));
    }
    let pid = engine.pid().to_string();
    let cpu_at_heal = (cpu_of(&pid), cpu_of("self"));
    to.link.apply_settled(Fault::Heal, Direction::Both).await;
    let healed = Instant::now();
    let healed_ms = crate::engine::output::wall_ms();
    let cpu_at_last = loop {
        let s = stats(&http, engine.api).await?;
        if s.delivered >= records {
            break (cpu_of(&pid), cpu_of("self"));
        }
        if healed.elapsed() > Duration::from_secs(600) {
            return Err(other(format!(
                "{}: {} of {records} delivered after 10 minutes",
                to.kind.name(),
                s.delivered
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(engine);
    // The engine's own clock, not the polling's: from its first attempt opened to its last
    // one closed, as `attempts.jsonl` says.
    let (first_opened, last_closed) = attempt_span(&dir.join("data"))?;
    let _ = std::fs::remove_dir_all(dir);
    let per_record = |d: Duration| d / records.max(1) as u32;
    Ok(EngineDrain {
        took: Duration::from_millis(last_closed.saturating_sub(first_opened)),
        reconnect: Duration::from_millis(first_opened.saturating_sub(healed_ms)),
        cpu: per_record(cpu_at_last.0.saturating_sub(cpu_at_heal.0)),
        link_cpu: per_record(cpu_at_last.1.saturating_sub(cpu_at_heal.1)),
    })
}

/// The earliest `opened_ms` and the latest `closed_ms` in an engine's attempt journal.
fn attempt_span(data: &Path) -> Result<(u64, u64), BenchError> {
    use std::io::BufRead;
    #[derive(serde::Deserialize)]
    struct Span {
        opened_ms: u64,
        closed_ms: u64,
    }
    let file = std::fs::File::open(data.join("attempts.jsonl"))?;
    let (mut first, mut last) = (u64::MAX, 0);
    for line in std::io::BufReader::with_capacity(1 << 20, file).lines() {
        let span: Span = serde_json::from_str(&line?).map_err(other)?;
        first = first.min(span.opened_ms);
        last = last.max(span.closed_ms);
    }
    if first > last {
        return Err(other("the engine journalled no attempt"));
    }
    Ok((first, last))
}

/// Drains `records` held behind a refused link to a broker of `kind`, and sends the same
/// records with the raw client through the same healed link to the same broker, in `rounds`
/// that take turns (engine first in even rounds, raw client first in odd ones), so that load
/// which comes or goes falls on both alike. `work` holds the brokers' and engines' files.
pub async fn drain(
    drill_exe: &Path,
    work: &Path,
    kind: Kind,
    records: u64,
    record_bytes: usize,
    rounds: usize,
) -> Result<Drain, BenchError> {
    let dir = work.join(format!("drain-{}", kind.name()));
    std::fs::create_dir_all(&dir)?;
    let to = Destination::start(&dir, kind).await?;
    let window = kind.sink().default_window();
    let mut measured = Vec::new();
    for round in 0..rounds.max(1) {
        let mut engine = None;
        let mut raw = None;
        for engine_turn in [round % 2 == 0, round % 2 != 0] {
            if engine_turn {
                let topic = to.fresh("engine", round).await?;
                engine = Some(
                    engine_drain(
                        drill_exe,
                        &dir.join("engine"),
                        &to,
                        &topic,
                        records,
                        record_bytes,
                    )
                    .await?,
                );
                to.done_with("engine", round, &topic).await;
            } else {
                let topic = to.fresh("raw", round).await?;
                to.link.apply_settled(Fault::Heal, Direction::Both).await;
                let own = cpu_of("self");
                let run = crate::dest::RawRun {
                    addr: to.link.listen_addr(),
                    topic: topic.clone(),
                    records,
                    bytes: record_bytes,
                    window,
                    line: record_line,
                };
                let took = to.bench.raw_client(run).await.map_err(other)?;
                let cpu = cpu_of("self").saturating_sub(own) / records.max(1) as u32;
                raw = Some((took, cpu));
                to.done_with("raw", round, &topic).await;
            }
        }
        let (Some(e), Some((raw, raw_cpu))) = (engine, raw) else {
            unreachable!("each round runs both");
        };
        eprintln!(
            "drill bench: drain {} round {}: engine {:.1} s, raw client {:.1} s ({:.2}×)",
            to.kind.name(),
            round + 1,
            e.took.as_secs_f64(),
            raw.as_secs_f64(),
            raw.as_secs_f64() / e.took.as_secs_f64()
        );
        measured.push(DrainRound {
            engine: e.took,
            reconnect: e.reconnect,
            engine_cpu: e.cpu,
            raw,
            raw_cpu,
            link_cpu: e.link_cpu,
        });
    }
    Ok(Drain {
        kind: to.kind.name(),
        records,
        rounds: measured,
        window,
        note: to.broker.version.clone(),
    })
}

/// Engine memory with records held behind a refused destination: `(held, VmRSS)` at each of
/// `marks`, and the highest VmRSS seen.
pub async fn held_memory(
    drill_exe: &Path,
    work: &Path,
    marks: &[u64],
    record_bytes: usize,
) -> Result<(Vec<(u64, u64)>, u64), BenchError> {
    let http = reqwest::Client::new();
    // Nothing listens on port 9 of loopback: every connect is refused.
    let refused: SocketAddr = "127.0.0.1:9".parse().map_err(other)?;
    let engine = EngineChild::start(drill_exe, &work.join("held"), "mqtt", refused, "bench")?;
    let mut out = Vec::new();
    let mut peak = 0;
    let mut held = 0;
    for &mark in marks {
        while held < mark {
            let step = (mark - held).min(1_000_000);
            fill(&http, engine.api, step, 1000, 8, record_bytes).await?;
            held += step;
            peak = peak.max(engine.rss());
        }
        let s = stats(&http, engine.api).await?;
        if s.held != held {
            return Err(other(format!("the engine holds {} of {held}", s.held)));
        }
        out.push((held, engine.rss()));
    }
    peak = peak.max(engine.rss());
    let _ = std::fs::remove_dir_all(work.join("held"));
    Ok((out, peak))
}

/// `verify::reconcile` over `n` records sent and arrived: how long it took, and how much its
/// own peak added to the process's resident memory (inputs excluded).
pub fn reconcile(n: u64) -> Result<(Duration, u64, u64), BenchError> {
    use crate::verify::{Arrival, Received, reconcile};
    use crate::workload::{Ingested, Record, Sent};
    let before_inputs = status_field("/proc/self/status", "VmRSS:");
    let sent = Sent {
        destroyed: Default::default(),
        order: (0..n)
            .map(|i| {
                (
                    Record {
                        id: format!("bench/k{}/{i}", i % 8),
                        key: format!("k{}", i % 8),
                        seq: i,
                        index: i,
                        pad: String::new(),
                    },
                    Ingested::Accepted {
                        write_key: None,
                        at: Duration::from_millis(i / 1000),
                    },
                )
            })
            .collect(),
    };
    let received = Received {
        arrivals: (0..n)
            .map(|i| Arrival {
                id: Some(format!("bench/k{}/{i}", i % 8)),
                write_key: None,
                at: Duration::from_millis(i / 1000 + 1),
                pad: None,
            })
            .collect(),
        ..Received::default()
    };
    let inputs = status_field("/proc/self/status", "VmRSS:").saturating_sub(before_inputs);
    // Reset the peak so VmHWM afterwards is reconcile's own.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let base = status_field("/proc/self/status", "VmRSS:");
    let started = Instant::now();
    let r = reconcile(&sent, &received);
    let took = started.elapsed();
    let peak = status_field("/proc/self/status", "VmHWM:");
    if r.missing != 0 || r.duplicates != 0 {
        return Err(other(format!(
            "reconcile found {} lost and {} duplicates in a clean run",
            r.missing, r.duplicates
        )));
    }
    drop(r);
    Ok((took, peak.saturating_sub(base), inputs))
}
