//! What every destination driver does while it is not connected: connect and probe with
//! backoff (100 ms → 1 s), taking in new records meanwhile, saying once that the destination is
//! down and once that it is back. A failed connect spends nothing (DESIGN.md §1.1).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::journal::{Journal, ToOutput};
use super::output::Output;
use super::stats::publish_stats;

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

/// What an output's driver works on while it is not connected.
pub(super) struct OutputSide<'a> {
    pub(super) out: &'a mut Output,
    pub(super) index: usize,
    pub(super) rx: &'a mut mpsc::UnboundedReceiver<ToOutput>,
    pub(super) journal: &'a mut Journal,
    pub(super) shared: &'a Shared,
}

impl OutputSide<'_> {
    /// Connects and probes with `attempt` until it succeeds, backing off 100 ms → 1 s (a probe
    /// a second during a long outage) and taking in new records meanwhile. Says once that the
    /// destination is down, and that it is back. `None` when the engine stops or ingest closes.
    pub(super) async fn connect<T, F, Fut>(
        &mut self,
        name: &str,
        said_down: &mut bool,
        cancel: &CancellationToken,
        mut attempt: F,
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let mut retry = Duration::from_millis(100);
        loop {
            let connecting = attempt();
            tokio::pin!(connecting);
            let result = loop {
                tokio::select! {
                    result = &mut connecting => break result,
                    m = self.rx.recv() => self.take(m)?,
                    _ = cancel.cancelled() => return None,
                }
            };
            match result {
                Ok(connected) => {
                    if *said_down {
                        eprintln!("drill engine: output {name}: destination back (probe answered)");
                    }
                    return Some(connected);
                }
                Err(why) => {
                    #[cfg(feature = "mutants")]
                    if mutant::is(Mutant::OutageSpendsAttempts) {
                        // MUTANT: a failed connect is taken for a refusal of every waiting
                        // record (DESIGN.md §1.1: an outage never spends an attempt).
                        self.journal.refill(self.out);
                        self.journal.record(self.out.outage_as_refusal(&why));
                        self.journal.flush();
                        publish_stats(self.shared, self.index, self.out, false);
                    }
                    if !*said_down {
                        eprintln!("drill engine: output {name}: destination unreachable: {why}");
                        *said_down = true;
                    }
                    let wake = tokio::time::sleep(retry);
                    tokio::pin!(wake);
                    loop {
                        tokio::select! {
                            _ = &mut wake => break,
                            m = self.rx.recv() => self.take(m)?,
                            _ = cancel.cancelled() => return None,
                        }
                    }
                    retry = (retry * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Takes one message from the ingest channel while disconnected; `None` once it closed.
    fn take(&mut self, message: Option<ToOutput>) -> Option<()> {
        self.journal.take(&self.shared.data_dir, self.out, message?);
        publish_stats(self.shared, self.index, self.out, false);
        Some(())
    }
}
