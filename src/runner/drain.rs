//! Draining: after the workload and the timeline, wait until the system says nothing waits
//! (or the drain timeout), then let the reader catch up until its count has been still.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::RunError;
use crate::engine::Stats;
use crate::sut::System;
use crate::verify::ReadBack;

/// Drains and returns the system's last account (if it gives one).
pub async fn drain(
    system: &System,
    reader: &ReadBack,
    timeout: Duration,
    notes: &mut Vec<String>,
    cancel: &CancellationToken,
) -> Result<Option<Stats>, RunError> {
    let deadline = Instant::now() + timeout;
    let mut last_stats: Option<Stats> = None;
    loop {
        if let Some(stats) = system.stats().await {
            let idle = stats.waiting == 0 && stats.outputs.iter().all(|o| o.in_flight == 0);
            last_stats = Some(stats);
            if idle {
                break;
            }
        }
        if Instant::now() > deadline {
            notes.push(format!("drain timed out after {timeout:?}"));
            break;
        }
        tokio::select! {
            _ = cancel.cancelled() => return Err(RunError::Interrupted),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    settle(reader).await;
    if cancel.is_cancelled() {
        return Err(RunError::Interrupted);
    }
    Ok(system.stats().await.or(last_stats))
}

/// Lets the reader catch up: until its count has been still for 1.5 s (at most 20 s).
async fn settle(reader: &ReadBack) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut count = reader.count().await;
    let mut still_since = Instant::now();
    while count.is_some()
        && Instant::now() < deadline
        && still_since.elapsed() < Duration::from_millis(1500)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = reader.count().await;
        if now != count {
            count = now;
            still_since = Instant::now();
        }
    }
}
