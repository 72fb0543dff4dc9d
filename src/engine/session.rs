//! The one session loop of an output, generic over its destination's [`Sink`].
//!
//! Shaped as crucible's `Upstairs`: [`Connected::select`] turns I/O, the ingest channel,
//! timers and cancellation into an [`Action`]; [`Connected::apply`] carries it out against the
//! synchronous [`Output`] state machine and its journal. Around it, [`OutputTask::run`]:
//! connect and probe with backoff (100 ms → 1 s, a probe a second during a long outage),
//! taking in new records meanwhile and saying once that the destination is down and once that
//! it is back; then the connected loop; then every open attempt ends `possibly_sent`
//! (`Journal::end_session`) and the next connect waits for a probe again.
//!
//! A failed connect spends nothing (docs/src/design.md#rule-1-1); a resend happens only in a new
//! session, after a probe answered (docs/src/design.md#rule-1-5, docs/src/design.md#rule-1-6).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::config::OutputConfig;
use super::journal::{Journal, ToOutput};
use super::output::Output;
use super::sink::{Answers, Attempts, Connect, Open, Session, Sink, Tick};
use super::stats::publish_stats;
use crate::promise::Promise;

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

/// One output's worker, ready to run: its state machine, its journal, its channel. Made by the
/// engine, run by [`SinkKind::spawn`](super::SinkKind::spawn) over the kind's sink.
pub struct OutputTask {
    out: Output,
    cfg: OutputConfig,
    index: usize,
    rx: mpsc::UnboundedReceiver<ToOutput>,
    journal: Journal,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    /// MUTANT `stop-after-outage`: set after the first failed connect or lost session.
    #[cfg(feature = "mutants")]
    gave_up: bool,
}

/// How a connected session ended.
enum Ended {
    /// Lost (cut, reset, silent, refused the protocol): reconnect after a probe.
    Lost(String),
    /// The engine is stopping, or ingest closed.
    Stopping(String),
}

impl OutputTask {
    pub(super) fn new(
        out: Output,
        cfg: OutputConfig,
        index: usize,
        rx: mpsc::UnboundedReceiver<ToOutput>,
        journal: Journal,
        shared: Arc<Shared>,
        cancel: CancellationToken,
    ) -> OutputTask {
        OutputTask {
            out,
            cfg,
            index,
            rx,
            journal,
            shared,
            cancel,
            #[cfg(feature = "mutants")]
            gave_up: false,
        }
    }

    /// The output's name, for the log.
    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// The worker: sessions one after another until the engine stops or ingest closes.
    pub async fn run<S: Sink>(mut self, sink: S) {
        let client_id = self
            .cfg
            .client_id
            .clone()
            .unwrap_or_else(|| format!("drill-engine-{}", self.cfg.name));
        let mut said_down = false;
        publish_stats(&self.shared, self.index, &self.out, false);
        loop {
            self.journal.refill(&mut self.out);
            let Some(session) = self.connect(&sink, &client_id, &mut said_down).await else {
                break;
            };
            self.out.limit_window(session.window());
            publish_stats(&self.shared, self.index, &self.out, true);
            let mut connected = Connected {
                session,
                sends: Vec::new(),
                answers: Vec::new(),
            };
            let ended = connected.run(&mut self).await;
            let why = match &ended {
                Ended::Lost(why) | Ended::Stopping(why) => why.clone(),
            };
            if matches!(ended, Ended::Stopping(_)) {
                connected.session.close().await;
            }
            self.journal
                .end_session(&mut self.out, &self.shared, self.index, &why);
            drop(connected);
            if matches!(ended, Ended::Stopping(_)) || self.cancel.is_cancelled() {
                break;
            }
            eprintln!(
                "drill engine: output {}: {} lost: {why}",
                self.cfg.name,
                S::SESSION
            );
            said_down = true;
            #[cfg(feature = "mutants")]
            if mutant::is(Mutant::StopAfterOutage) {
                self.gave_up = true;
            }
        }
        self.journal.sync();
        publish_stats(&self.shared, self.index, &self.out, false);
    }

    /// Connects and probes until it succeeds, backing off 100 ms → 1 s and taking in new
    /// records meanwhile. Says once that the destination is down, and that it is back. `None`
    /// when the engine stops or ingest closes.
    async fn connect<S: Sink>(
        &mut self,
        sink: &S,
        client_id: &str,
        said_down: &mut bool,
    ) -> Option<S::Session> {
        let mut retry = Duration::from_millis(100);
        loop {
            #[cfg(feature = "mutants")]
            if self.gave_up {
                // MUTANT `stop-after-outage`: never connects again (docs/src/design.md#rule-1-1:
                // an outage holds records until the destination is back; it never ends delivery).
                // New records are taken in and reported waiting, honestly.
                loop {
                    tokio::select! {
                        m = self.rx.recv() => take(&mut self.journal, &mut self.out, &self.shared, self.index, m)?,
                        _ = self.cancel.cancelled() => return None,
                    }
                }
            }
            #[cfg(feature = "mutants")]
            let oldest = self.out.oldest_waiting();
            // MUTANT `backoff-by-wall-clock`: when this attempt began, by the wall clock.
            #[cfg(feature = "mutants")]
            let attempted = std::time::SystemTime::now();
            let to = Connect {
                cfg: &self.cfg,
                client_id,
                #[cfg(feature = "mutants")]
                oldest: oldest.as_deref(),
            };
            let result = {
                let connecting = sink.connect(to);
                tokio::pin!(connecting);
                loop {
                    tokio::select! {
                        result = &mut connecting => break result,
                        m = self.rx.recv() => take(&mut self.journal, &mut self.out, &self.shared, self.index, m)?,
                        _ = self.cancel.cancelled() => return None,
                    }
                }
            };
            match result {
                Ok(session) => {
                    if *said_down {
                        eprintln!(
                            "drill engine: output {}: destination back (probe answered)",
                            self.cfg.name
                        );
                    }
                    return Some(session);
                }
                Err(why) => {
                    self.outage(&why, said_down);
                    #[cfg(feature = "mutants")]
                    let wake = async move {
                        if mutant::is(Mutant::BackoffByWallClock) {
                            // MUTANT: the next attempt waits until `retry` has passed since the
                            // last began, by the wall clock; a clock jumped back any time after
                            // it began moves that moment away (docs/src/design.md#rule-1-1: an
                            // outage holds records only until the destination is back).
                            while std::time::SystemTime::now()
                                .duration_since(attempted)
                                .is_ok_and(|since| since < retry)
                                || std::time::SystemTime::now() < attempted
                            {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        } else {
                            tokio::time::sleep(retry).await;
                        }
                    };
                    #[cfg(not(feature = "mutants"))]
                    let wake = tokio::time::sleep(retry);
                    tokio::pin!(wake);
                    loop {
                        tokio::select! {
                            _ = &mut wake => break,
                            m = self.rx.recv() => take(&mut self.journal, &mut self.out, &self.shared, self.index, m)?,
                            _ = self.cancel.cancelled() => return None,
                        }
                    }
                    retry = (retry * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// A connect failed: an outage, which spends nothing. Said once.
    fn outage(&mut self, why: &str, said_down: &mut bool) {
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::StopAfterOutage) {
            self.gave_up = true;
        }
        #[cfg(feature = "mutants")]
        if mutant::is(Mutant::OutageSpendsAttempts)
            || (mutant::is(Mutant::HandshakeFailureIsRefusal) && why.contains("certificate"))
        {
            // MUTANT: a failed connect (`handshake-failure-is-refusal`: one that failed on the
            // broker's certificate) is taken for a refusal of every waiting record
            // (docs/src/design.md#rule-1-1: an outage never spends an attempt; a handshake is no
            // write).
            self.journal.refill(&mut self.out);
            self.journal.record(self.out.outage_as_refusal(why));
            self.journal.flush();
            publish_stats(&self.shared, self.index, &self.out, false);
        }
        if !*said_down {
            eprintln!(
                "drill engine: output {}: destination unreachable: {why}",
                self.cfg.name
            );
            *said_down = true;
        }
    }
}

/// Takes one message from the ingest channel while disconnected; `None` once it closed.
fn take(
    journal: &mut Journal,
    out: &mut Output,
    shared: &Shared,
    index: usize,
    message: Option<ToOutput>,
) -> Option<()> {
    journal.take(&shared.data_dir, out, message?);
    publish_stats(shared, index, out, false);
    Some(())
}

/// What woke the connected loop.
enum Action {
    /// The engine is stopping.
    Stop,
    /// Answers came in (collected in `Connected::answers`); `Err`: and then the session was
    /// lost.
    Answers(Result<(), String>),
    /// Records from ingest (or a replay), or `None`: ingest closed.
    Ingest(Option<ToOutput>),
    /// A refused record's backoff ended.
    Due,
    /// 100 ms passed: keepalive, answer timeout, housekeeping.
    Tick,
}

/// One connected session and the buffers its loop keeps between rounds (no allocation per
/// round on a drain's hot path).
struct Connected<S> {
    session: S,
    sends: Attempts,
    answers: Answers,
}

impl<S: Session> Connected<S> {
    /// Sends what the window allows, waits for the next action, applies it; until the session
    /// ends.
    async fn run(&mut self, task: &mut OutputTask) -> Ended {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            if let Err(why) = self.send(task).await {
                return Ended::Lost(why);
            }
            let action = self.select(task, &mut tick).await;
            if let Some(ended) = self.apply(task, action).await {
                return ended;
            }
        }
    }

    /// Opens attempts for as many waiting records as the window allows and sends them.
    async fn send(&mut self, task: &mut OutputTask) -> Result<(), String> {
        task.journal.refill(&mut task.out);
        task.out.next_attempts_into(Instant::now(), &mut self.sends);
        if self.sends.is_empty() {
            return Ok(());
        }
        if task.cfg.promise == Promise::AtMostOnce {
            // at_most_once (a destination that cannot confirm): each record is marked settled
            // before its bytes leave, so an engine killed right after a send never sends it
            // again (docs/src/design.md#5-verdict: at_most_once allows no copy).
            task.journal.settle_before_sending(&self.sends);
        }
        let sent = self.session.send(&mut self.sends, &mut self.answers).await;
        self.sends.clear();
        self.record_answers(task);
        sent
    }

    /// Waits for whatever comes first.
    async fn select(&mut self, task: &mut OutputTask, tick: &mut tokio::time::Interval) -> Action {
        let due = task.out.next_due().map(tokio::time::Instant::from_std);
        tokio::select! {
            biased;
            _ = task.cancel.cancelled() => Action::Stop,
            answered = self.session.answers(&mut self.answers) => Action::Answers(answered),
            m = task.rx.recv() => Action::Ingest(m),
            _ = async { if let Some(d) = due { tokio::time::sleep_until(d).await } }, if due.is_some() => Action::Due,
            _ = tick.tick() => Action::Tick,
        }
    }

    /// Carries out one action; `Some` when the session ended.
    async fn apply(&mut self, task: &mut OutputTask, action: Action) -> Option<Ended> {
        match action {
            Action::Stop => return Some(Ended::Stopping("engine stopping".to_string())),
            Action::Answers(answered) => {
                self.record_answers(task);
                task.journal.write_marks();
                if let Err(why) = answered {
                    return Some(Ended::Lost(why));
                }
            }
            Action::Ingest(Some(m)) => task.journal.take(&task.shared.data_dir, &mut task.out, m),
            Action::Ingest(None) => return Some(Ended::Stopping("ingest closed".to_string())),
            Action::Due => {}
            Action::Tick => {
                let now = Instant::now();
                let open = Open {
                    in_flight: task.out.in_flight(),
                    oldest_waited: task.out.oldest_open_waited(now),
                };
                match self.session.tick(now, open).await {
                    Tick::Fine => {}
                    Tick::Lost(why) => return Some(Ended::Lost(why)),
                    #[cfg(feature = "mutants")]
                    Tick::RefuseUnanswered(limit) => {
                        // MUTANT `local-connected-flag`: an attempt unanswered for the answer
                        // timeout is a refusal (docs/src/design.md#rule-1-2: silence is not a
                        // refusal).
                        let effects = task.out.unanswered_as_refused(limit, Instant::now());
                        task.journal.record(effects);
                    }
                }
                task.journal
                    .housekeeping(&task.out, &task.shared, task.index);
            }
        }
        None
    }

    /// Every answer collected so far goes to the state machine and its journal.
    fn record_answers(&mut self, task: &mut OutputTask) {
        if self.answers.is_empty() {
            return;
        }
        let now = Instant::now();
        for (tag, answer) in self.answers.drain(..) {
            task.journal.record(task.out.on_answer(tag, answer, now));
        }
    }
}
