//! `drill bench proxy`: what a healed drill link costs, measured side by side in one run.
//! (`drill bench engine` is [`engine`] and [`depth`].)
//!
//! Three paths to the same servers: direct, through a healed link of `drill proxy` (its own
//! process, as users run it), and through haproxy in tcp mode (when installed) as the yardstick.
//! Two measurements per path: the throughput of one bulk TCP stream (the sink confirms the byte
//! count, so nothing is counted that did not arrive), and the round trip of 1-byte ping-pong
//! (p50, p99). The load generator is plain blocking sockets on threads, the same for every
//! path. This module prints ratios; it asserts nothing — numbers are evidence, not tests.

mod depth;
mod engine;
mod taps;

pub use depth::rss_of;
pub use engine::{EngineOptions, engine};

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{KillOnDrop, free_addr};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{what} did not start listening on {addr}")]
    NotListening { what: String, addr: SocketAddr },
    #[error("the sink counted {got} bytes where {sent} were sent")]
    Short { sent: u64, got: u64 },
}

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub bytes: u64,
    pub pings: usize,
    pub runs: usize,
    /// Records per run on the Kafka produce path.
    pub kafka_records: u64,
}

/// One path's numbers.
#[derive(Debug, Clone)]
pub struct PathResult {
    pub name: String,
    pub bytes_per_s: f64,
    pub p50: Duration,
    pub p99: Duration,
}

/// Listens on a free loopback port and serves every connection on its own thread.
fn serve_each(handle: fn(TcpStream)) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || handle(stream));
        }
    });
    Ok(addr)
}

/// A sink that reads a stream to its end and answers the byte count (8 bytes, LE).
fn sink() -> std::io::Result<SocketAddr> {
    serve_each(|mut s| {
        let mut buf = vec![0u8; 256 * 1024];
        let mut total: u64 = 0;
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        let _ = s.write_all(&total.to_le_bytes());
    })
}

/// An echo server for 1-byte ping-pong.
fn echo() -> std::io::Result<SocketAddr> {
    serve_each(|mut s| {
        let _ = s.set_nodelay(true);
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    })
}

fn wait_listening(what: &str, addr: SocketAddr) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            return Err(BenchError::NotListening {
                what: what.to_string(),
                addr,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// One bulk stream of `bytes`; returns bytes per second.
fn bulk(addr: SocketAddr, bytes: u64) -> Result<f64, BenchError> {
    let chunk = vec![0x5au8; 256 * 1024];
    let started = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    let mut sent = 0u64;
    while sent < bytes {
        let n = (bytes - sent).min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..n])?;
        sent += n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count)?;
    let took = started.elapsed();
    let got = u64::from_le_bytes(count);
    if got != bytes {
        return Err(BenchError::Short { sent: bytes, got });
    }
    Ok(bytes as f64 / took.as_secs_f64())
}

/// `n` 1-byte round trips after a warm-up; returns the sorted round trips.
fn pings(addr: SocketAddr, n: usize) -> Result<Vec<Duration>, BenchError> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut b = [1u8; 1];
    for _ in 0..n / 10 {
        s.write_all(&b)?;
        s.read_exact(&mut b)?;
    }
    let mut rtts = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&b)?;
        s.read_exact(&mut b)?;
        rtts.push(t.elapsed());
    }
    Ok(rtts)
}

/// One path under test: where its bulk sink and its echo are reached.
struct Path3 {
    name: String,
    bulk: SocketAddr,
    ping: SocketAddr,
    rates: Vec<f64>,
    rtts: Vec<Duration>,
}

/// Measures every path in rounds, rotating, so that drift on a shared, noisy machine falls on
/// all paths alike instead of on whichever ran during a bad minute.
fn measure(paths: &mut [Path3], o: Options) -> Result<Vec<PathResult>, BenchError> {
    let rounds = o.runs.max(5);
    for round in 0..rounds {
        for p in paths.iter_mut() {
            if round < o.runs {
                p.rates.push(bulk(p.bulk, o.bytes)?);
            }
            p.rtts.extend(pings(p.ping, o.pings / rounds)?);
        }
    }
    Ok(paths
        .iter_mut()
        .map(|p| {
            p.rates.sort_by(f64::total_cmp);
            p.rtts.sort();
            let at = |q: f64| p.rtts[((p.rtts.len() as f64 * q) as usize).min(p.rtts.len() - 1)];
            PathResult {
                name: p.name.clone(),
                bytes_per_s: p.rates[p.rates.len() / 2],
                p50: at(0.50),
                p99: at(0.99),
            }
        })
        .collect())
}

fn haproxy_path() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into()])
        .map(|d| d.join("haproxy"))
        .find(|p| p.is_file())
}

/// Starts `drill proxy EXTRA…` with a link to `sink` and one to `echo`; where they listen.
fn drill_proxy(
    drill_exe: &Path,
    extra: &[&str],
    sink: SocketAddr,
    echo: SocketAddr,
    children: &mut KillOnDrop,
) -> Result<(SocketAddr, SocketAddr), BenchError> {
    let (bulk, ping, api) = (free_addr()?, free_addr()?, free_addr()?);
    children.0.push(
        Command::new(drill_exe)
            .arg("proxy")
            .args(extra)
            .args(["--api", &api.to_string()])
            .args(["--link", &format!("bulk={bulk},{sink}")])
            .args(["--link", &format!("ping={ping},{echo}")])
            .stdout(Stdio::null())
            .spawn()?,
    );
    wait_listening("drill proxy", bulk)?;
    wait_listening("drill proxy", ping)?;
    Ok((bulk, ping))
}

/// Runs the proxy benchmark and returns the rendered table.
pub fn proxy(drill_exe: &Path, o: Options) -> Result<String, BenchError> {
    let (sink, echo) = (sink()?, echo()?);
    let mut children = KillOnDrop::default();
    let path = |name: &str, bulk, ping| Path3 {
        name: name.to_string(),
        bulk,
        ping,
        rates: Vec::new(),
        rtts: Vec::new(),
    };
    let mut paths = vec![path("direct", sink, echo)];

    let (bulk, ping) = drill_proxy(drill_exe, &[], sink, echo, &mut children)?;
    paths.push(path("drill link (healed, zero-copy)", bulk, ping));
    // The same link through drill's own buffers: what the zero-copy path saves.
    let (bulk, ping) = drill_proxy(drill_exe, &["--copy-only"], sink, echo, &mut children)?;
    let copying = path("drill link (healed, copying)", bulk, ping);

    let mut note = None;
    let dir = tempfile_dir()?;
    match haproxy_path() {
        Some(haproxy) => {
            let (bulk_h, ping_h) = (free_addr()?, free_addr()?);
            let cfg = dir.join("haproxy.cfg");
            std::fs::write(
                &cfg,
                format!(
                    "global\n  maxconn 1000\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 5m\n  timeout server 5m\n\
                     listen bulk\n  bind {bulk_h}\n  server sink {sink}\n\
                     listen ping\n  bind {ping_h}\n  server echo {echo}\n"
                ),
            )?;
            children.0.push(
                Command::new(haproxy)
                    .arg("-db")
                    .arg("-f")
                    .arg(&cfg)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()?,
            );
            wait_listening("haproxy", bulk_h)?;
            wait_listening("haproxy", ping_h)?;
            paths.push(path("haproxy (tcp mode)", bulk_h, ping_h));
        }
        None => {
            note = Some(
                "haproxy is not installed (Debian: apt-get install haproxy): no yardstick column"
                    .to_string(),
            )
        }
    }
    paths.push(copying);
    let results = measure(&mut paths, o);
    let _ = std::fs::remove_dir_all(&dir);
    let mut table = render(&results?, o, note);
    drop(children);
    // Each kind with a link of its own kind (Kafka's, which reads the protocol) measures it.
    for kind in crate::dest::Kind::ALL {
        if let Some(link_bench) = kind.entry().link_bench {
            table.push_str(&link_bench(drill_exe, o.kafka_records, o.runs)?);
        }
    }
    table.push_str(&taps::measure(o.kafka_records, o.runs)?);
    Ok(table)
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("drill-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn render(paths: &[PathResult], o: Options, note: Option<String>) -> String {
    let direct = &paths[0];
    let mut out = format!(
        "drill bench proxy: one bulk stream of {} MiB (median of {} runs), {} 1-byte ping-pongs, paths interleaved\n\n",
        o.bytes / (1024 * 1024),
        o.runs,
        o.pings
    );
    out.push_str("| path | throughput | vs direct | p50 rtt | p99 rtt | added p50 | added p99 |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    for p in paths {
        let added = |a: Duration, b: Duration| a.as_secs_f64() * 1e6 - b.as_secs_f64() * 1e6;
        out.push_str(&format!(
            "| {} | {:.0} MiB/s | {:.2}× | {:.1} µs | {:.1} µs | {:+.1} µs | {:+.1} µs |\n",
            p.name,
            p.bytes_per_s / (1024.0 * 1024.0),
            p.bytes_per_s / direct.bytes_per_s,
            p.p50.as_secs_f64() * 1e6,
            p.p99.as_secs_f64() * 1e6,
            added(p.p50, direct.p50),
            added(p.p99, direct.p99),
        ));
    }
    let drill = &paths[1];
    let added = |p: &PathResult, q: f64| {
        let at = |r: &PathResult| if q < 0.9 { r.p50 } else { r.p99 };
        at(p).as_secs_f64() * 1e6 - at(direct).as_secs_f64() * 1e6
    };
    out.push_str(&format!(
        "\ndrill (zero-copy) / direct throughput: {:.2}× (target ≥ 0.75×)",
        drill.bytes_per_s / direct.bytes_per_s
    ));
    if let Some(copying) = paths.iter().find(|p| p.name.contains("copying")) {
        out.push_str(&format!(
            "; zero-copy / copying: {:.2}×",
            drill.bytes_per_s / copying.bytes_per_s
        ));
    }
    if let Some(haproxy) = paths.iter().find(|p| p.name.starts_with("haproxy")) {
        out.push_str(&format!(
            "\ndrill / haproxy throughput: {:.2}×; added p99 latency: drill {:+.1} µs, haproxy {:+.1} µs (target: drill ≤ haproxy); added p50: drill {:+.1} µs, haproxy {:+.1} µs",
            drill.bytes_per_s / haproxy.bytes_per_s,
            added(drill, 0.99),
            added(haproxy, 0.99),
            added(drill, 0.5),
            added(haproxy, 0.5),
        ));
    }
    out.push('\n');
    if let Some(n) = note {
        out.push_str(&format!("\n{n}\n"));
    }
    out
}
