//! Draining: after the workload and the timeline, wait until the system says nothing waits
//! (or the drain timeout), then let the reader catch up until its count has been still.
//!
//! A system that gives no account (a user's engine without `stats`) drains until arrivals have
//! stopped for [`QUIET`], or the drain timeout: drill never guesses what it still holds.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::RunError;
use crate::dest::ReadBack;
use crate::source::Source;
use crate::sut::{Account, System};

/// How long arrivals must have stopped before an engine without an account counts as drained.
const QUIET: Duration = Duration::from_secs(5);

/// Drains and returns the system's last account (if it gives one).
pub async fn drain(
    system: &System,
    reader: &dyn ReadBack,
    timeout: Duration,
    notes: &mut Vec<String>,
    source: Option<&Source>,
    cancel: &CancellationToken,
) -> Result<Option<Account>, RunError> {
    let deadline = Instant::now() + timeout;
    let mut last: Option<Account> = None;
    // An engine that reads from a source is idle only once it has read to its end (a file's,
    // or committed a topic's), twice in a row (a line read and not yet stored leaves nothing
    // waiting for a moment).
    let mut read_to_end = 0;
    if system.gives_account() {
        loop {
            if let Some(account) = system.account().await {
                let read = match source {
                    Some(s) => s.read_to_end(system.procs()).await,
                    None => true,
                };
                read_to_end = if read { read_to_end + 1 } else { 0 };
                let idle = account.waiting == 0 && account.in_flight == 0 && read_to_end >= 2;
                super::progress::message(format!(
                    "draining: {} waiting, {} in flight",
                    account.waiting, account.in_flight
                ));
                last = Some(account);
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
    } else {
        super::progress::message(
            "draining: until arrivals stop (the engine gives no account)".to_string(),
        );
        let quiet = until_still(reader, QUIET, deadline, true, cancel).await?;
        if !quiet {
            notes.push(format!(
                "drain: arrivals had not stopped for {QUIET:?} within {timeout:?}"
            ));
        }
    }
    until_still(
        reader,
        Duration::from_millis(1500),
        Instant::now() + Duration::from_secs(20),
        false,
        cancel,
    )
    .await?;
    if cancel.is_cancelled() {
        return Err(RunError::Interrupted);
    }
    Ok(system.account().await.or(last))
}

/// Waits until the reader's count has been still for `still` (or `deadline`); returns whether
/// it was. A reader that cannot count (Kafka's) waits until the deadline when `blind_waits`,
/// else not at all.
async fn until_still(
    reader: &dyn ReadBack,
    still: Duration,
    deadline: Instant,
    blind_waits: bool,
    cancel: &CancellationToken,
) -> Result<bool, RunError> {
    let mut count = reader.count().await;
    if count.is_none() && !blind_waits {
        return Ok(false);
    }
    let mut still_since = Instant::now();
    loop {
        if count.is_some() && still_since.elapsed() >= still {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::select! {
            _ = cancel.cancelled() => return Err(RunError::Interrupted),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let now = reader.count().await;
        if now != count {
            count = now;
            still_since = Instant::now();
        }
    }
}
