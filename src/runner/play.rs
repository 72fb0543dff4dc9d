//! Playing a drill: the workload and the fault timeline side by side on the drill's clock,
//! with a progress line every few seconds.
//!
//! [`Drill`] holds what the timeline has done so far (faults applied, crashes, a halted broker
//! node); [`Drill::apply`] carries out one step. The loop in [`play`] only decides which comes
//! next: cancellation, the end of the workload, a progress line, or the next step.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::events::{FaultKind, FaultRecord, FaultTarget};
use super::provision::Rig;
use super::stack::Stacks;
use super::timeline::Step;
use super::{RunError, ms, say};
use crate::dest::{AnswerFault, Halt, Node, ReadBack};
use crate::powerfs::PowerFs;
use crate::proxy::{Direction, Fault, FaultSpec};
use crate::scenario::ProcessAction;
use crate::sut::System;
use crate::sut::remote::EngineAct;
use crate::workload::Sent;

/// One drill in play: the rig, the system under test, and what the timeline did to them.
pub struct Drill<'a> {
    /// The brokers and links the faults act on.
    pub rig: &'a mut Rig,
    /// The system under test, for engine faults.
    pub system: &'a mut System,
    /// The drill's clock: every time in the report is relative to it.
    pub t0: Instant,
    /// Faults as applied, each closed (`until_ms`) when it healed.
    pub faults: Vec<FaultRecord>,
    /// When the engine was killed or stopped: records accepted before one may come twice.
    pub crashes: Vec<Duration>,
    /// Which of those were power cuts (unsynced writes lost, delivery marks too).
    pub power_cuts: Vec<Duration>,
    /// Notes for the report (a step that could not be carried out, and why).
    pub notes: Vec<String>,
    /// Whether the engine is paused (SIGSTOP) until its `restart_after`.
    engine_paused: bool,
    /// The engine's data directory, when a `power_cut` or `fill_disk` acts on it.
    disk: Option<&'a PowerFs>,
    /// A power cut armed at a crash point, waiting for its operation.
    armed: Option<Armed>,
    /// What the scenario's overlapping faults hold on each link.
    stacks: Stacks,
    /// The file the engine tails, when it tails one.
    pub source: Option<crate::source::FileSource>,
}

/// A `power_cut` with `crash_at`, armed and not yet fired.
struct Armed {
    index: usize,
    at: Duration,
    point: crate::powerfs::CrashPoint,
    restart_after: Option<Duration>,
    wipe_data: bool,
}

/// How the timeline ended.
pub enum Played {
    /// Every step ran and the workload finished.
    Done,
    /// The caller's token was cancelled (Ctrl-C): no verdict.
    Interrupted,
}

impl<'a> Drill<'a> {
    pub fn new(
        rig: &'a mut Rig,
        system: &'a mut System,
        disk: Option<&'a PowerFs>,
        t0: Instant,
    ) -> Drill<'a> {
        Drill {
            disk,
            rig,
            system,
            t0,
            faults: Vec::new(),
            crashes: Vec::new(),
            power_cuts: Vec::new(),
            notes: Vec::new(),
            engine_paused: false,
            armed: None,
            stacks: Stacks::default(),
            source: None,
        }
    }

    /// Marks the newest open fault on `target` as over, now.
    fn close_fault(&mut self, target: &FaultTarget) {
        let now = ms(self.t0.elapsed());
        if let Some(f) = self
            .faults
            .iter_mut()
            .rev()
            .find(|f| f.target == *target && f.until_ms.is_none())
        {
            f.until_ms = Some(now);
        }
    }

    /// Carries out one step of the timeline, now. Returns when to restart the engine if the
    /// step let an armed crash point fire (the engine died starting up).
    pub async fn apply(&mut self, step: &Step) -> Result<Option<Duration>, RunError> {
        let now = self.t0.elapsed();
        match step {
            Step::Link { index, link, spec } => self.link_fault(*index, link, spec, now).await,
            Step::ProxyDown { index } => self.proxy_down(*index, now).await,
            Step::Heal { index, link } => self.heal(*index, link, now).await?,
            Step::Engine {
                index,
                action,
                wipe_data,
                power,
                restart_after,
            } => match (&power.crash_at, self.disk) {
                (Some(point), Some(disk)) => {
                    disk.arm(point.clone());
                    say(&format!(
                        "  {:>4}s  engine power cut armed: at {}{}",
                        now.as_secs(),
                        point.describe(),
                        if point.torn { ", torn" } else { "" }
                    ));
                    self.armed = Some(Armed {
                        index: *index,
                        at: now,
                        point: point.clone(),
                        restart_after: *restart_after,
                        wipe_data: *wipe_data,
                    });
                }
                _ => {
                    self.engine_fault(*index, *action, *wipe_data, power, now)
                        .await?
                }
            },
            Step::RestartEngine => return self.engine_back(now).await,
            Step::DiskBack => self.disk_back(now).await?,
            Step::Broker {
                index,
                node,
                action,
            } => self.broker_fault(*index, *node, *action, now).await,
            Step::RestartBroker => self.broker_back(now).await?,
            Step::Answer { index, fault } => self.answer(*index, *fault, now),
            Step::Source { index, action } => self.source_fault(*index, *action, now),
            Step::DiskError { index, fault, ends } => self.disk_error(*index, fault, *ends, now),
            Step::ClockJump {
                index,
                by_s,
                drift: None,
            } => self.clock_jump(*index, *by_s, now),
            Step::ClockJump {
                index,
                by_s,
                drift: Some(tick),
            } => self.clock_drift(*index, *by_s, *tick, now),
        }
        Ok(None)
    }

    /// What the disk's I/O faults did, said once the timeline is over: a note, and a fault that
    /// failed no operation is marked as having met nothing (the drill proves nothing by it).
    pub fn account_disk_errors(&mut self) {
        let Some(disk) = self.disk else { return };
        let failed = disk.io_failed();
        let has = |faults: &[FaultRecord], slow: bool| {
            faults.iter().any(|f| match f.kind {
                FaultKind::DiskError(_) => !slow,
                FaultKind::DiskSlow(_) => slow,
                _ => false,
            })
        };
        let (errors, slow) = (has(&self.faults, false), has(&self.faults, true));
        for f in &mut self.faults {
            let met_nothing = match f.kind {
                FaultKind::DiskError(_) => failed.operations == 0,
                FaultKind::DiskSlow(_) => failed.delayed == 0,
                _ => false,
            };
            if met_nothing {
                f.no_target = Some(
                    "no operation it names came while it was in force: the engine never met it"
                        .to_string(),
                );
            }
        }
        if errors && failed.operations > 0 {
            self.notes.push(format!(
                "the engine's disk answered {} operations with an injected error; {} of them fsyncs, which dropped {} unsynced writes ({} bytes): reads showed them, no later fsync wrote them, and a power cut loses them (Linux's behaviour after a failed writeback)",
                failed.operations, failed.fsyncs, failed.writes_dropped, failed.bytes_dropped
            ));
        }
        if slow && failed.delayed > 0 {
            self.notes.push(format!(
                "the engine's disk answered {} operations late (each took effect at once; its answer came from a timer, and the disk answered everything else meanwhile)",
                failed.delayed
            ));
        }
    }

    /// The engine's wall clock steps by `by_s` seconds and stays there: an instant on the
    /// timeline. Its monotonic clock runs on; drill's own times are its own clock's.
    fn clock_jump(&mut self, index: usize, by_s: i64, now: Duration) {
        let kind = FaultKind::ClockJump(by_s);
        self.record(index, now, FaultTarget::EngineClock, kind.clone());
        let moved = match self.system.clock() {
            Some(clock) => clock.jump(by_s).map_err(|e| e.to_string()),
            None => Err("the engine does not run under a clock drill moves".to_string()),
        };
        match moved {
            Ok(offset) => {
                say(&format!(
                    "  {:>4}s  fault: engine {kind} (now {} from the real clock)",
                    now.as_secs(),
                    crate::runner::events::signed(offset)
                ));
                self.notes.push(format!(
                    "at {} s the engine's wall clock jumped {} (libfaketime; its monotonic clock ran on): drill's times are its own clock's and never compared with the engine's",
                    now.as_secs(),
                    crate::runner::events::signed(by_s)
                ));
            }
            Err(why) => {
                if let Some(f) = self.faults.last_mut() {
                    f.no_target = Some(format!("the clock did not move: {why}"));
                }
            }
        }
        self.close_fault(&FaultTarget::EngineClock);
    }

    /// One tick of a `clock: drift`: the first records the fault (in force until the last
    /// tick) and says it; every tick moves the engine's wall clock by its share.
    fn clock_drift(
        &mut self,
        index: usize,
        by_s: i64,
        tick: crate::runner::timeline::DriftTick,
        now: Duration,
    ) {
        if tick.first {
            let kind = FaultKind::ClockDrift {
                by_s: tick.total_s,
                over_s: tick.over.as_secs(),
            };
            self.record(index, now, FaultTarget::EngineClock, kind.clone());
            say(&format!("  {:>4}s  fault: engine {kind}", now.as_secs()));
            self.notes.push(format!(
                "from {} s the engine's wall clock drifted {} over {} s (libfaketime, stepped once a second; its monotonic clock ran on): drill's times are its own clock's and never compared with the engine's",
                now.as_secs(),
                crate::runner::events::signed(tick.total_s),
                tick.over.as_secs()
            ));
        }
        let moved = match self.system.clock() {
            Some(clock) if by_s != 0 => clock.jump(by_s).map(|_| ()).map_err(|e| e.to_string()),
            Some(_) => Ok(()),
            None => Err("the engine does not run under a clock drill moves".to_string()),
        };
        if let Err(why) = moved
            && let Some(f) = self
                .faults
                .iter_mut()
                .rev()
                .find(|f| f.index == index && f.no_target.is_none())
        {
            f.no_target = Some(format!("the clock did not move: {why}"));
        }
        if tick.last {
            // This drift's record, not the newest clock fault's: drifts may overlap.
            let end = ms(self.t0.elapsed());
            if let Some(f) = self
                .faults
                .iter_mut()
                .rev()
                .find(|f| f.index == index && f.until_ms.is_none())
            {
                f.until_ms = Some(end);
            }
            let offset = self.system.clock().map_or(0, |c| c.offset_s());
            say(&format!(
                "  {:>4}s  engine clock drift over (now {} from the real clock)",
                now.as_secs(),
                crate::runner::events::signed(offset)
            ));
        }
    }

    /// The engine's disk answers errors from now on, or (`ends`) no longer.
    fn disk_error(
        &mut self,
        index: usize,
        fault: &crate::powerfs::IoFault,
        ends: bool,
        now: Duration,
    ) {
        let Some(disk) = self.disk else {
            return;
        };
        if ends {
            disk.remove_io_fault(fault);
            say(&format!(
                "  {:>4}s  engine disk: {} no longer",
                now.as_secs(),
                fault.op.name()
            ));
            self.close_fault(&FaultTarget::EngineDisk);
            return;
        }
        disk.inject(fault.clone());
        let kind = match fault.effect {
            crate::powerfs::IoEffect::Error(_) => FaultKind::DiskError(fault.describe()),
            crate::powerfs::IoEffect::Slow(_) => FaultKind::DiskSlow(fault.describe()),
        };
        say(&format!(
            "  {:>4}s  fault: engine disk {kind}",
            now.as_secs()
        ));
        self.record(index, now, FaultTarget::EngineDisk, kind);
        if fault.nth.is_some() {
            // One operation: an instant on the timeline.
            self.close_fault(&FaultTarget::EngineDisk);
        }
    }

    /// Rotates, cuts, removes or stalls the file the engine tails.
    fn source_fault(&mut self, index: usize, action: crate::source::SourceAction, now: Duration) {
        let Some(source) = self.source.clone() else {
            return;
        };
        source.watch(self.system.procs());
        self.record(index, now, FaultTarget::Source, FaultKind::Source(action));
        if let Some(f) = self.faults.last_mut() {
            // It acts on the file, whatever the records were doing at that instant.
            f.bit = Some(true);
        }
        match source.fault(action) {
            Ok(what) => {
                say(&format!("  {:>4}s  source: {what}", now.as_secs()));
                self.close_fault(&FaultTarget::Source);
            }
            Err(e) => {
                let why = format!(
                    "the source fault `{}` could not be carried out: {e}",
                    action.describe()
                );
                say(&format!("  {:>4}s  {why}", now.as_secs()));
                if let Some(f) = self.faults.last_mut() {
                    f.no_target = Some(why.clone());
                }
                self.notes.push(why);
            }
        }
    }

    /// Where the engine is in the file it tails (sampled a few times a second).
    fn watch_source(&self) {
        if let Some(source) = &self.source {
            source.watch(self.system.procs());
        }
    }

    /// Records a fault as applied now.
    fn record(&mut self, index: usize, now: Duration, target: FaultTarget, kind: FaultKind) {
        self.faults.push(FaultRecord {
            index,
            at_ms: ms(now),
            target,
            kind,
            wiped: false,
            until_ms: None,
            bit: None,
            no_target: None,
        });
    }

    async fn link_fault(&mut self, index: usize, name: &str, spec: &FaultSpec, now: Duration) {
        let mut bit = None;
        let mut no_target = None;
        if let Some(r) = self.rig.remote.clone().filter(|r| r.name() == name) {
            if spec.fault.instantaneous() {
                let _ = r.refresh().await;
                bit = Some(r.status().connections_open > 0);
            }
            // A fault the remote proxy did not take proves nothing: the drill is inconclusive.
            if let Err(e) = r.apply(spec).await {
                no_target = Some(format!("the remote proxy did not take it: {e}"));
            }
        } else if let Some(l) = self.rig.link_named(name) {
            if spec.fault.instantaneous() {
                // A strand bites only the connections open at this instant (on a Kafka-aware
                // link, on any of its broker links).
                bit = Some(l.family_status().connections_open > 0);
            }
            if l.stacks() && !spec.fault.instantaneous() {
                // Beside what the link already holds (docs/src/design.md#3-fault-vocabulary:
                // conditions stack, one cut).
                let (cut, conditions) = self.stacks.start(name, index, *spec).specs();
                // Test builds: a link that takes no condition at all (as one the proxy refused,
                // or one that could not listen again, would not).
                #[cfg(feature = "test-hooks")]
                let refused = std::env::var_os("DRILL_TEST_LINKS_REFUSE_CONDITIONS").is_some();
                #[cfg(not(feature = "test-hooks"))]
                let refused = false;
                let applied = if refused {
                    Err(crate::proxy::ProxyError::FaultRefused {
                        name: name.to_string(),
                        why: "DRILL_TEST_LINKS_REFUSE_CONDITIONS".to_string(),
                    })
                } else {
                    l.set_stack(cut, conditions).await
                };
                if let Err(e) = applied {
                    // Not applied: it proves nothing, and the drill must not pass on it.
                    self.notes.push(format!("fault {index}: {e}"));
                    no_target = Some(format!("the link could not apply it: {e}"));
                }
            } else {
                l.apply_spec_settled(*spec).await;
            }
        } else {
            // A broker link of a Kafka-aware link (`kafka-2`), now or from its creation on.
            if spec.fault.instantaneous() {
                bit = Some(
                    self.rig
                        .link
                        .members()
                        .iter()
                        .any(|m| m.name() == name && m.status().connections_open > 0),
                );
            }
            self.rig.link.apply_member(name, *spec).await;
        }
        let what = spec.what();
        say(&format!(
            "  {:>4}s  fault: link {name} {what} {}",
            now.as_secs(),
            spec.direction.name()
        ));
        self.faults.push(FaultRecord {
            index,
            at_ms: ms(now),
            target: FaultTarget::Link(name.to_string()),
            kind: FaultKind::Link(*spec),
            wiped: false,
            until_ms: spec.fault.instantaneous().then_some(ms(now)),
            bit,
            no_target,
        });
    }

    /// A destination fault (`Some`) or its end (`None`): the endpoint drill hosts answers so.
    fn answer(&mut self, index: usize, fault: Option<AnswerFault>, now: Duration) {
        if let Some(control) = &self.rig.running.answers {
            control.set(fault);
        }
        match fault {
            Some(fault) => {
                say(&format!(
                    "  {:>4}s  fault: destination {}",
                    now.as_secs(),
                    fault.describe()
                ));
                self.record(
                    index,
                    now,
                    FaultTarget::Destination,
                    FaultKind::Answer(fault),
                );
            }
            None => {
                say(&format!(
                    "  {:>4}s  heal: destination answers again",
                    now.as_secs()
                ));
                self.close_fault(&FaultTarget::Destination);
            }
        }
    }

    /// A proxy restart: every connection dropped, nothing listens until the heal.
    async fn proxy_down(&mut self, index: usize, now: Duration) {
        for l in &self.rig.links {
            l.apply_settled(Fault::Refuse, Direction::Both).await;
        }
        say(&format!(
            "  {:>4}s  fault: proxy restart (down)",
            now.as_secs()
        ));
        self.record(index, now, FaultTarget::Proxy, FaultKind::ProxyRestart);
    }

    /// Heals a link (or the proxy). `Err` when a link could not take its port back: the
    /// drill cannot tell anything about the engine from then on (exit 3, not a verdict).
    async fn heal(
        &mut self,
        index: Option<usize>,
        name: &str,
        now: Duration,
    ) -> Result<(), RunError> {
        let mut still = String::new();
        if let Some(r) = self.rig.remote.clone().filter(|r| r.name() == name) {
            // A fault whose lease ran out ended before its time: what the drill says of it
            // would be about a shorter fault than planned, so it proves nothing.
            let early = r.take_lease_lost();
            if let Err(e) = r.heal().await {
                self.notes
                    .push(format!("heal of the remote link {name}: {e}"));
            }
            if let Some(why) = early
                && let Some(f) = self.faults.iter_mut().rev().find(|f| {
                    f.until_ms.is_none() && f.target == FaultTarget::Link(name.to_string())
                })
            {
                f.no_target = Some(why);
            }
        }
        for l in self
            .rig
            .links
            .iter()
            // A proxy restart never took the source link down: its heal leaves it be.
            .chain(self.rig.source_link.as_ref().filter(|_| name != "proxy"))
            .filter(|l| name == "proxy" || l.name() == name)
        {
            // The end of one fault leaves the others on the link in force; the end of a proxy
            // restart brings back what the link held before it.
            let held = if name == "proxy" {
                self.stacks.held(l.name())
            } else {
                self.stacks.end(l.name(), index)
            };
            if held.is_empty() {
                l.apply_settled(Fault::Heal, Direction::Both).await;
            } else {
                let (cut, conditions) = held.specs();
                if let Err(e) = l.set_stack(cut, conditions).await {
                    self.notes.push(format!("heal of {name}: {e}"));
                }
                still = format!(" ({} still in force)", held.describe());
            }
            l.listening()?;
        }
        if self.rig.remote.is_none() && self.rig.link_named(name).is_none() {
            self.rig
                .link
                .apply_member(name, FaultSpec::new(Fault::Heal, Direction::Both))
                .await;
        }
        say(&format!(
            "  {:>4}s  heal: link {name}{still}",
            now.as_secs()
        ));
        let target = if name == "proxy" {
            FaultTarget::Proxy
        } else {
            FaultTarget::Link(name.to_string())
        };
        let open = self.faults.iter_mut().rev().find(|f| {
            f.until_ms.is_none() && f.target == target && index.is_none_or(|i| f.index == i)
        });
        if let Some(f) = open {
            f.until_ms = Some(ms(now));
        }
        Ok(())
    }

    async fn engine_fault(
        &mut self,
        index: usize,
        action: ProcessAction,
        wipe_data: bool,
        power: &crate::scenario::PowerCut,
        now: Duration,
    ) -> Result<(), RunError> {
        // A kill, stop or pause of an engine that is already down (or paused) strikes nothing.
        let down = (!self.system.is_running() || self.engine_paused).then(|| {
            if self.engine_paused {
                "the engine was paused (SIGSTOP) already".to_string()
            } else {
                "the engine was already down".to_string()
            }
        });
        // A crash is dated when the engine is gone, not when the fault began: an ingest it
        // answered in between (the answer read a few ms later) was accepted before the crash,
        // and its copies after a restart are the crash's (a torn power cut at 4.3 s made one
        // such copy count "beyond at_least_once" for the correct engine).
        // Where the engine is in a file it tails, as late as drill can see it before it dies.
        self.watch_source();
        let kind = match action {
            ProcessAction::Kill => {
                self.system.kill().await;
                self.crashes.push(self.t0.elapsed().max(now));
                FaultKind::Kill
            }
            ProcessAction::Pause => {
                self.system.pause(true).await?;
                self.engine_paused = true;
                FaultKind::Pause
            }
            // Validation gives the engine none but `stop` (the rest are a broker's, the
            // proxy's or the source's).
            ProcessAction::Stop
            | ProcessAction::Restart
            | ProcessAction::Crash
            | ProcessAction::Rotate
            | ProcessAction::Truncate
            | ProcessAction::Delete
            | ProcessAction::Stall => {
                self.system.stop(Duration::from_secs(10)).await;
                self.crashes.push(self.t0.elapsed().max(now));
                FaultKind::Stop
            }
            ProcessAction::PowerCut => {
                // The engine dies first: a process holding a file open across the cut would
                // keep writing at the size the kernel remembers.
                self.system.kill().await;
                let dead = self.t0.elapsed().max(now);
                self.crashes.push(dead);
                self.power_cuts.push(dead);
                let torn = power.torn;
                let cut = match self.system.remote_disk(EngineAct::PowerCut { torn }).await {
                    Some(on_agent) => on_agent?.unwrap_or_default(),
                    None => self
                        .disk
                        .map(|d| d.power_cut(torn, power.dirents))
                        .unwrap_or_default(),
                };
                FaultKind::PowerCut {
                    cut,
                    dirents: power.dirents,
                    crash_point: None,
                }
            }
            ProcessAction::FillDisk => {
                if let Some(on_agent) = self.system.remote_disk(EngineAct::FillDisk).await {
                    on_agent?;
                } else if let Some(disk) = self.disk {
                    disk.fill();
                }
                FaultKind::DiskFull
            }
        };
        self.after_engine_fault(index, action, wipe_data, kind, now)
            .await?;
        let strikes_a_process = matches!(
            action,
            ProcessAction::Kill | ProcessAction::Stop | ProcessAction::Pause
        );
        if let (Some(why), true) = (down, strikes_a_process)
            && let Some(f) = self.faults.last_mut()
        {
            f.until_ms = Some(f.until_ms.unwrap_or(f.at_ms));
            f.no_target = Some(why);
        }
        Ok(())
    }

    /// What every engine fault does once it struck: the data wiped if asked, the fault
    /// recorded and said.
    async fn after_engine_fault(
        &mut self,
        index: usize,
        action: ProcessAction,
        wipe_data: bool,
        kind: FaultKind,
        now: Duration,
    ) -> Result<(), RunError> {
        if wipe_data {
            match self.system.remote_disk(EngineAct::Wipe).await {
                Some(on_agent) => drop(on_agent?),
                None => empty_dir(self.system.data_dir())?,
            }
        }
        let target = match action {
            ProcessAction::FillDisk => FaultTarget::EngineDisk,
            _ => FaultTarget::Engine,
        };
        // A power cut that threw away writes or names met the engine's state, whether or not
        // a record was in flight at that instant (the delivery marks it lost come back as
        // copies): it is not judged by the records alone.
        let destroyed = matches!(&kind, FaultKind::PowerCut { cut, .. }
            if cut.writes + cut.torn + cut.entries > 0);
        self.record(index, now, target, kind);
        if let Some(f) = self.faults.last_mut() {
            f.wiped = wipe_data;
            if destroyed {
                f.bit = Some(true);
            }
            say(&format!(
                "  {:>4}s  fault: engine {}",
                now.as_secs(),
                f.what()
            ));
        }
        Ok(())
    }

    /// A crash point fired (the filesystem cut power at its operation): the engine dies now,
    /// the cut is recorded at the instant it happened, power comes back for the restart.
    /// Returns when to restart the engine, if the fault says.
    async fn crashed(&mut self) -> Result<Option<Duration>, RunError> {
        let Some(disk) = self.disk else {
            return Ok(None);
        };
        let Some(crash) = disk.take_crash() else {
            return Ok(None);
        };
        let Some(armed) = self.armed.take() else {
            return Ok(None);
        };
        self.system.kill().await;
        disk.revive();
        let at = crash.at.saturating_duration_since(self.t0);
        self.crashes.push(at);
        self.power_cuts.push(at);
        let kind = FaultKind::PowerCut {
            cut: crash.cut,
            dirents: armed.point.dirents,
            crash_point: Some(armed.point.describe()),
        };
        self.after_engine_fault(
            armed.index,
            ProcessAction::PowerCut,
            armed.wipe_data,
            kind,
            at,
        )
        .await?;
        Ok(armed.restart_after.map(|d| at + d))
    }

    /// A crash point still armed when the drill ends never met its operation: the fault is
    /// recorded as one that found no target (the drill is inconclusive).
    fn never_crashed(&mut self) {
        let Some(armed) = self.armed.take() else {
            return;
        };
        if let Some(disk) = self.disk {
            disk.disarm();
        }
        self.record(
            armed.index,
            armed.at,
            FaultTarget::Engine,
            FaultKind::PowerCut {
                cut: Default::default(),
                dirents: armed.point.dirents,
                crash_point: Some(armed.point.describe()),
            },
        );
        if let Some(f) = self.faults.last_mut() {
            f.until_ms = Some(f.at_ms);
            f.no_target = Some(format!(
                "its crash point ({}) was never reached: the engine made no such call after {:.1} s",
                armed.point.describe(),
                armed.at.as_secs_f64()
            ));
        }
    }

    /// `restart_after` of an engine fault: resumed if paused, else started again. A crash
    /// point still armed counts the restarted engine's calls too: when it fires while the
    /// engine starts (power goes during recovery), the engine died of it, and the crash's own
    /// restart is returned to be scheduled.
    async fn engine_back(&mut self, now: Duration) -> Result<Option<Duration>, RunError> {
        if self.system.is_running() && !self.engine_paused {
            // Two engine faults overlapped (a crash point fired, then a timed cut): the first
            // restart brought it back.
            say(&format!(
                "  {:>4}s  engine already running (an earlier restart brought it back)",
                now.as_secs()
            ));
            return Ok(None);
        }
        if std::mem::take(&mut self.engine_paused) {
            self.system.pause(false).await?;
            self.system.note("resumed by the drill").await;
            say(&format!(
                "  {:>4}s  engine resumed (SIGCONT)",
                now.as_secs()
            ));
        } else {
            if let Err(e) = self.system.start().await {
                let crashed_starting =
                    self.armed.is_some() && self.disk.is_some_and(PowerFs::has_crash);
                if crashed_starting {
                    // The earlier fault is over (the engine was started); the crash is a new one.
                    self.close_fault(&FaultTarget::Engine);
                    return self.crashed().await;
                }
                return Err(e.into());
            }
            self.system.note("restarted by the drill").await;
            say(&format!("  {:>4}s  engine restarted", now.as_secs()));
        }
        self.close_fault(&FaultTarget::Engine);
        Ok(None)
    }

    async fn disk_back(&mut self, now: Duration) -> Result<(), RunError> {
        if let Some(on_agent) = self.system.remote_disk(EngineAct::DiskBack).await {
            on_agent?;
        } else if let Some(disk) = self.disk {
            disk.release();
        }
        say(&format!(
            "  {:>4}s  engine disk: space is back",
            now.as_secs()
        ));
        self.close_fault(&FaultTarget::EngineDisk);
        Ok(())
    }

    /// One broker node (by number, or where the data's leader is now) or the broker's
    /// container: kill, stop or pause it; its `restart_after` starts or resumes it.
    async fn broker_fault(
        &mut self,
        index: usize,
        node: Node,
        action: ProcessAction,
        now: Duration,
    ) {
        let (how, kind) = match action {
            ProcessAction::Kill => (Halt::Kill, FaultKind::Kill),
            ProcessAction::Pause => (Halt::Pause, FaultKind::Freeze),
            ProcessAction::Crash => (Halt::Crash, FaultKind::Crash),
            _ => (Halt::Stop, FaultKind::Stop),
        };
        match self.rig.running.halt(node, how).await {
            Ok(name) => {
                say(&format!(
                    "  {:>4}s  fault: broker {name} {kind}",
                    now.as_secs()
                ));
                self.record(index, now, FaultTarget::Broker(name), kind);
            }
            Err(why) => {
                // Nothing was hit: the drill proves nothing about this fault (inconclusive).
                say(&format!(
                    "  {:>4}s  broker fault found no target: {why}",
                    now.as_secs()
                ));
                let target = match node {
                    Node::Leader => "leader".to_string(),
                    Node::Number(n) => format!("n{n}"),
                };
                self.record(index, now, FaultTarget::Broker(target), kind);
                if let Some(f) = self.faults.last_mut() {
                    f.until_ms = Some(f.at_ms);
                    f.no_target = Some(why);
                }
            }
        }
    }

    /// `restart_after` of a broker fault: the node or container back; the links follow a
    /// container that came back on another host port.
    async fn broker_back(&mut self, now: Duration) -> Result<(), RunError> {
        let Some((name, moved)) = self.rig.running.back().await? else {
            return Ok(());
        };
        if let Some(addr) = moved {
            for l in &self.rig.links {
                l.set_upstream(addr);
            }
        }
        say(&format!("  {:>4}s  broker {name} back", now.as_secs()));
        self.close_fault(&FaultTarget::Broker(name));
        Ok(())
    }
}

/// Plays the workload and the timeline until both are done (or the drill is cancelled).
pub async fn play(
    drill: &mut Drill<'_>,
    steps: &[(Duration, Step)],
    mut workload: tokio::task::JoinHandle<()>,
    sent: &Arc<Mutex<Sent>>,
    reader: &dyn ReadBack,
    cancel: &CancellationToken,
) -> Result<Played, RunError> {
    let t0 = drill.t0;
    // A bar is refreshed every second; plain lines come every 5 s.
    let bars = super::progress::showing();
    let mut progress = tokio::time::interval(Duration::from_secs(if bars { 1 } else { 5 }));
    progress.tick().await;
    let mut alive = tokio::time::interval(Duration::from_millis(250));
    let mut next = 0;
    let mut workload_done = false;
    // A crash point's restart joins the timeline when the crash happens.
    let mut steps = steps.to_vec();
    let crash_signal = drill.disk.map(PowerFs::crash_signal);
    loop {
        if next >= steps.len() && workload_done {
            drill.never_crashed();
            return Ok(Played::Done);
        }
        let wake = steps
            .get(next)
            .map(|(at, _)| tokio::time::Instant::from_std(t0 + *at));
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Ok(Played::Interrupted),
            _ = &mut workload, if !workload_done => workload_done = true,
            _ = async { if let Some(w) = wake { tokio::time::sleep_until(w).await } }, if wake.is_some() => {
                let (_, step) = &steps[next];
                next += 1;
                if let Some(restart) = drill.apply(step).await? {
                    schedule_restart(&mut steps, next, restart);
                }
                reader.moved(&drill.rig.running.addrs);
            }
            _ = async { if let Some(s) = &crash_signal { s.notified().await } }, if drill.armed.is_some() && crash_signal.is_some() => {
                if let Some(restart) = drill.crashed().await? {
                    schedule_restart(&mut steps, next, restart);
                }
            }
            _ = alive.tick() => {
                // An engine that ends on its own is an infrastructure failure, not a verdict.
                if let Some(why) = drill.system.exited() {
                    return Err(RunError::Engine(crate::sut::SutError::Exited(why)));
                }
                drill.watch_source();
            }
            _ = progress.tick() => {
                let accepted = sent.lock().map(|s| s.accepted().count()).unwrap_or(0);
                let status = drill.rig.link_status();
                let read_back = reader.count().await.map_or("-".to_string(), |n| n.to_string());
                let state = format!(
                    "link {}: {}{}",
                    status.name,
                    status.fault,
                    status.direction.map(|d| format!(" {d}")).unwrap_or_default()
                );
                if bars {
                    let next_step = steps.get(next).map(|(at, step)| {
                        format!("; next: {} in {} s", describe_step(step), at.saturating_sub(t0.elapsed()).as_secs())
                    });
                    super::progress::update(
                        accepted as u64,
                        format!("read back {read_back}  {state}{}", next_step.unwrap_or_default()),
                    );
                } else {
                    say(&format!(
                        "  {:>4}s  accepted {accepted:>6}  read back {read_back:>6}  {state}",
                        t0.elapsed().as_secs(),
                    ));
                }
            }
        }
    }
}

/// A crash point's restart joins the steps still to come, in time order.
fn schedule_restart(steps: &mut Vec<(Duration, Step)>, next: usize, restart: Duration) {
    let at = steps[next..].partition_point(|(at, _)| *at <= restart) + next;
    steps.insert(at, (restart, Step::RestartEngine));
}

/// A step in a few words, for the progress bar's countdown.
fn describe_step(step: &Step) -> String {
    match step {
        Step::Link { link, spec, .. } => format!("link {link} {}", spec.what()),
        Step::ProxyDown { .. } => "proxy restart".to_string(),
        Step::Heal { link, .. } => format!("heal link {link}"),
        Step::Engine { action, .. } => format!("engine {}", action.name()),
        Step::RestartEngine => "engine back".to_string(),
        Step::DiskBack => "disk space back".to_string(),
        Step::Broker { action, .. } => format!("broker {}", action.name()),
        Step::RestartBroker => "broker back".to_string(),
        Step::Answer { fault: Some(f), .. } => format!("destination {}", f.describe()),
        Step::Answer { fault: None, .. } => "destination answers again".to_string(),
        Step::Source { action, .. } => format!("source {}", action.describe()),
        Step::DiskError {
            fault, ends: false, ..
        } => format!("disk {}", fault.describe()),
        Step::DiskError { ends: true, .. } => "disk errors end".to_string(),
        Step::ClockJump {
            by_s, drift: None, ..
        } => {
            format!("clock jumps {}", crate::runner::events::signed(*by_s))
        }
        Step::ClockJump {
            drift: Some(tick), ..
        } => format!(
            "clock drifts {} over {} s",
            crate::runner::events::signed(tick.total_s),
            tick.over.as_secs()
        ),
    }
}

/// Removes what a directory holds, keeping the directory itself (it may be a mount point).
fn empty_dir(dir: &std::path::Path) -> Result<(), RunError> {
    let io = |source| RunError::Io {
        path: dir.to_path_buf(),
        source,
    };
    if !dir.exists() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path).map_err(io)?;
        } else {
            std::fs::remove_file(&path).map_err(io)?;
        }
    }
    Ok(())
}
