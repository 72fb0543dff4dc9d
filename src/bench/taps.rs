//! `drill bench proxy`'s tap table: what a protocol tap costs a healed link, per destination
//! kind, side by side in one run.
//!
//! For each kind with a bench side, two brokers and two in-process links in front of them, alike
//! but for one thing: the second link reads its connections with the kind's tap. The kind's
//! raw client sends the same records (each carrying a harness id, so the tap finds and notes
//! every one) through each in turn, rounds interleaved; the table gives records/s and the
//! tapped link's ratio to the untapped one (target ≥ 0.9×). This module prints; it asserts
//! nothing.

use std::sync::Arc;
use std::time::Duration;

use super::BenchError;
use super::depth::{Destination, other};
use crate::dest::{Kind, RawRun};
use crate::proxy::tap::{TapLog, Tapping};

/// Bytes per record.
const RECORD_BYTES: usize = 200;

/// A record the tap can read: a harness id of run `bench` (`bench/k0/<n>`), padded.
fn tapped_line(i: u64, bytes: usize) -> String {
    let head = format!("{{\"id\":\"bench/k0/{i}\",\"pad\":\"");
    let pad = bytes.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// One path: a broker and the link in front of it, and the link's tap log when tapped.
struct Path {
    to: Destination,
    tap: Option<Arc<TapLog>>,
}

async fn path(kind: Kind, dir: &std::path::Path, tapped: bool) -> Result<Path, BenchError> {
    let to = Destination::start(dir, kind).await?;
    let mut tap = None;
    if let Some(taps) = kind.entry().taps.filter(|_| tapped) {
        let log = Arc::new(TapLog::default());
        to.link.set_tap(Tapping {
            maker: taps("bench"),
            log: log.clone(),
        });
        tap = Some(log);
    }
    Ok(Path { to, tap })
}

/// The tap table, for every kind with a bench side.
pub fn measure(records: u64, runs: usize) -> Result<String, BenchError> {
    let runtime = tokio::runtime::Runtime::new()?;
    let dir = std::env::temp_dir().join(format!("drill-bench-taps-{}", std::process::id()));
    let mut out = format!(
        "\nWhat a protocol tap costs a healed link: {records} records of {RECORD_BYTES} B per run through an untapped and a tapped link (two brokers alike), the kind's raw client, median of {} runs, paths interleaved\n\n| destination | untapped records/s | tapped records/s | tapped / untapped | records the tap noted |\n|---|---:|---:|---:|---:|\n",
        runs.max(1)
    );
    for &kind in Kind::ALL {
        if kind.entry().bench.is_none() {
            continue;
        }
        let row = runtime.block_on(one_kind(kind, &dir, records, runs.max(1)));
        match row {
            Ok(row) => out.push_str(&row),
            Err(e) => out.push_str(&format!("| {} | not measured: {e} | | | |\n", kind.name())),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

async fn one_kind(
    kind: Kind,
    dir: &std::path::Path,
    records: u64,
    runs: usize,
) -> Result<String, BenchError> {
    let plain = path(kind, &dir.join(format!("{}-plain", kind.name())), false).await?;
    let tapped = path(kind, &dir.join(format!("{}-tapped", kind.name())), true).await?;
    let bench = plain.to.bench;
    let mut rates = [Vec::new(), Vec::new()];
    for round in 0..runs {
        // Which path goes first alternates, so neither always follows the other's work.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let p = [&plain, &tapped][i];
            let run = p.to.run(if i == 0 { "plain" } else { "tapped" }, round);
            let topic = bench.fresh(run).await.map_err(other)?;
            let took = bench
                .raw_client(RawRun {
                    addr: p.to.link.listen_addr(),
                    topic: topic.clone(),
                    records,
                    bytes: RECORD_BYTES,
                    window: kind.sink().default_window(),
                    line: tapped_line,
                })
                .await
                .map_err(other)?;
            let _ = bench.done_with(run, &topic).await;
            rates[i].push(records as f64 / took.max(Duration::from_micros(1)).as_secs_f64());
        }
    }
    let median = |r: &mut Vec<f64>| {
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    let (untapped, with_tap) = (median(&mut rates[0]), median(&mut rates[1]));
    let noted = tapped.tap.as_ref().map_or(0, |l| l.seen().sent.len());
    for p in [plain, tapped] {
        p.to.link.shutdown().await;
        if let Some(mut process) = p.to.broker.process {
            process.stop(false).await;
        }
    }
    Ok(format!(
        "| {} | {untapped:.0} | {with_tap:.0} | {:.2}× | {noted} |\n",
        kind.name(),
        with_tap / untapped
    ))
}
