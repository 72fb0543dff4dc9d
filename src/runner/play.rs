//! Playing a drill: the workload and the fault timeline side by side on the drill's clock,
//! with a progress line every few seconds.
//!
//! [`Drill`] holds what the timeline has done so far (faults applied, crashes, a halted broker
//! node); [`Drill::apply`] carries out one step. The loop in [`play`] only decides which comes
//! next: cancellation, the end of the workload, a progress line, or the next step.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::provision::Rig;
use super::timeline::{Step, describe};
use super::{RunError, ms, say};
use crate::powerfs::PowerFs;
use crate::proxy::{Direction, Fault, FaultSpec};
use crate::report::FaultRecord;
use crate::scenario::{BrokerNode, ProcessAction};
use crate::sut::System;
use crate::verify::ReadBack;
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
    /// The broker node (or container) halted by the last broker fault, until restarted.
    killed_node: Option<usize>,
    /// Whether that halt was a pause (resumed, not restarted).
    paused: bool,
    /// Whether the engine is paused (SIGSTOP) until its `restart_after`.
    engine_paused: bool,
    /// The engine's data directory, when a `power_cut` or `fill_disk` acts on it.
    disk: Option<&'a PowerFs>,
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
            killed_node: None,
            paused: false,
            engine_paused: false,
        }
    }

    /// Marks the newest open fault on `target` as over, now.
    fn close_fault(&mut self, target: &str) {
        let now = ms(self.t0.elapsed());
        if let Some(f) = self
            .faults
            .iter_mut()
            .rev()
            .find(|f| f.target == target && f.until_ms.is_none())
        {
            f.until_ms = Some(now);
        }
    }

    /// Carries out one step of the timeline, now.
    pub async fn apply(&mut self, step: &Step) -> Result<(), RunError> {
        let now = self.t0.elapsed();
        match step {
            Step::Link { index, link, spec } => self.link_fault(*index, link, spec, now).await,
            Step::ProxyDown { index } => self.proxy_down(*index, now).await,
            Step::Heal { index, link } => self.heal(*index, link, now).await,
            Step::Engine {
                index,
                action,
                wipe_data,
            } => self.engine_fault(*index, *action, *wipe_data, now).await?,
            Step::RestartEngine => self.engine_back(now).await?,
            Step::DiskBack => self.disk_back(now),
            Step::Broker { index, action, .. } if !self.rig.containers.is_empty() => {
                self.container_fault(*index, *action, now).await
            }
            Step::RestartBroker if !self.rig.containers.is_empty() => {
                self.container_back(now).await?
            }
            // Checked before the drill started; unreachable in practice.
            Step::Broker { .. } if self.rig.cluster.is_empty() => {}
            Step::Broker {
                index,
                node,
                action,
            } => self.node_fault(*index, *node, *action, now).await,
            Step::RestartBroker => self.node_back(now).await?,
        }
        Ok(())
    }

    /// Records a fault as applied now.
    fn record(&mut self, index: usize, now: Duration, target: String, fault: String) {
        self.faults.push(FaultRecord {
            index,
            at_ms: ms(now),
            target,
            fault,
            direction: None,
            until_ms: None,
            bit: None,
        });
    }

    async fn link_fault(&mut self, index: usize, name: &str, spec: &FaultSpec, now: Duration) {
        let mut bit = None;
        if let Some(l) = self.rig.links.iter().find(|l| l.name() == name) {
            if spec.fault.instantaneous() {
                // A strand bites only the connections open at this instant (on a Kafka-aware
                // link, on any of its broker links).
                bit = Some(l.family_status().connections_open > 0);
            }
            l.apply_spec_settled(*spec).await;
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
        let what = describe(spec);
        say(&format!(
            "  {:>4}s  fault: link {name} {what} {}",
            now.as_secs(),
            spec.direction.name()
        ));
        self.faults.push(FaultRecord {
            index,
            at_ms: ms(now),
            target: format!("link {name}"),
            fault: what,
            direction: Some(spec.direction.name().to_string()),
            until_ms: spec.fault.instantaneous().then_some(ms(now)),
            bit,
        });
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
        self.record(index, now, "link proxy".into(), "restart".into());
    }

    async fn heal(&mut self, index: Option<usize>, name: &str, now: Duration) {
        for l in self
            .rig
            .links
            .iter()
            .filter(|l| name == "proxy" || l.name() == name)
        {
            l.apply_settled(Fault::Heal, Direction::Both).await;
        }
        if !self.rig.links.iter().any(|l| l.name() == name) {
            self.rig
                .link
                .apply_member(name, FaultSpec::new(Fault::Heal, Direction::Both))
                .await;
        }
        say(&format!("  {:>4}s  heal: link {name}", now.as_secs()));
        let target = format!("link {name}");
        let open = self.faults.iter_mut().rev().find(|f| {
            f.until_ms.is_none() && f.target == target && index.is_none_or(|i| f.index == i)
        });
        if let Some(f) = open {
            f.until_ms = Some(ms(now));
        }
    }

    async fn engine_fault(
        &mut self,
        index: usize,
        action: ProcessAction,
        wipe_data: bool,
        now: Duration,
    ) -> Result<(), RunError> {
        let mut what = match action {
            ProcessAction::Kill => {
                self.system.kill().await;
                self.crashes.push(now);
                "kill (SIGKILL)".to_string()
            }
            ProcessAction::Pause => {
                self.system.pause(true)?;
                self.engine_paused = true;
                "pause (SIGSTOP)".to_string()
            }
            ProcessAction::Stop | ProcessAction::Restart => {
                self.system.stop(Duration::from_secs(10)).await;
                self.crashes.push(now);
                "stop (SIGTERM)".to_string()
            }
            ProcessAction::PowerCut => {
                // The engine dies first: a process holding a file open across the cut would
                // keep writing at the size the kernel remembers.
                self.system.kill().await;
                self.crashes.push(now);
                self.power_cuts.push(now);
                let cut = self.disk.map(PowerFs::power_cut).unwrap_or_default();
                format!(
                    "power cut (SIGKILL; {} unsynced writes, {} bytes in {} files thrown away)",
                    cut.writes, cut.bytes, cut.files
                )
            }
            ProcessAction::FillDisk => {
                if let Some(disk) = self.disk {
                    disk.fill();
                }
                "disk full (data directory)".to_string()
            }
        };
        if wipe_data {
            empty_dir(self.system.data_dir())?;
            what.push_str(", data directory emptied");
        }
        say(&format!("  {:>4}s  fault: engine {what}", now.as_secs()));
        let target = match action {
            ProcessAction::FillDisk => "engine disk",
            _ => "engine",
        };
        self.record(index, now, target.into(), what);
        Ok(())
    }

    /// `restart_after` of an engine fault: resumed if paused, else started again.
    async fn engine_back(&mut self, now: Duration) -> Result<(), RunError> {
        if std::mem::take(&mut self.engine_paused) {
            self.system.pause(false)?;
            self.system.note("resumed by the drill").await;
            say(&format!(
                "  {:>4}s  engine resumed (SIGCONT)",
                now.as_secs()
            ));
        } else {
            self.system.start().await?;
            self.system.note("restarted by the drill").await;
            say(&format!("  {:>4}s  engine restarted", now.as_secs()));
        }
        self.close_fault("engine");
        Ok(())
    }

    fn disk_back(&mut self, now: Duration) {
        if let Some(disk) = self.disk {
            disk.release();
        }
        say(&format!(
            "  {:>4}s  engine disk: space is back",
            now.as_secs()
        ));
        self.close_fault("engine disk");
    }

    /// One broker in a container: kill (SIGKILL), stop or pause it; its `restart_after`
    /// starts or resumes it, and the link follows its new host port.
    async fn container_fault(&mut self, index: usize, action: ProcessAction, now: Duration) {
        let c = &mut self.rig.containers[0];
        let what = match action {
            ProcessAction::Kill => {
                c.kill().await;
                "kill (SIGKILL)"
            }
            ProcessAction::Pause => {
                c.pause().await;
                "pause"
            }
            _ => {
                c.stop().await;
                "stop (SIGTERM)"
            }
        };
        self.killed_node = Some(0);
        self.paused = action == ProcessAction::Pause;
        say(&format!(
            "  {:>4}s  fault: broker container {what}",
            now.as_secs()
        ));
        self.record(index, now, "broker container".into(), what.into());
    }

    async fn container_back(&mut self, now: Duration) -> Result<(), RunError> {
        if self.killed_node.take().is_none() {
            return Ok(());
        }
        if std::mem::take(&mut self.paused) {
            self.rig.containers[0].resume().await;
            say(&format!(
                "  {:>4}s  broker container resumed",
                now.as_secs()
            ));
        } else {
            let addr = self.rig.containers[0].restart().await?;
            for l in &self.rig.links {
                l.set_upstream(addr);
            }
            say(&format!(
                "  {:>4}s  broker container restarted on {addr}",
                now.as_secs()
            ));
        }
        self.close_fault("broker container");
        Ok(())
    }

    /// A NATS cluster node (by number, or where the stream's leader is now): kill or stop.
    async fn node_fault(
        &mut self,
        index: usize,
        node: BrokerNode,
        action: ProcessAction,
        now: Duration,
    ) {
        let at = match node {
            BrokerNode::Number(n) => Some(n - 1),
            BrokerNode::Leader => self.rig.stream_leader_node().await,
        };
        let kill = action == ProcessAction::Kill;
        let what = if kill {
            "kill (SIGKILL)"
        } else {
            "stop (SIGTERM)"
        };
        match at.and_then(|i| self.rig.cluster.get_mut(i).map(|n| (i, n))) {
            Some((i, node)) => {
                node.halt(kill).await;
                self.killed_node = Some(i);
                let name = node.name.clone();
                say(&format!(
                    "  {:>4}s  fault: broker {name} {what}",
                    now.as_secs()
                ));
                self.record(index, now, format!("broker {name}"), what.into());
            }
            None => {
                let why = "broker fault skipped: no such node, or no stream leader could be found"
                    .to_string();
                say(&format!("  {:>4}s  {why}", now.as_secs()));
                self.notes.push(why);
            }
        }
    }

    async fn node_back(&mut self, now: Duration) -> Result<(), RunError> {
        if let Some(i) = self.killed_node.take()
            && let Some(node) = self.rig.cluster.get_mut(i)
        {
            node.restart().await?;
            let name = node.name.clone();
            say(&format!("  {:>4}s  broker {name} restarted", now.as_secs()));
            self.close_fault(&format!("broker {name}"));
        }
        Ok(())
    }
}

/// Plays the workload and the timeline until both are done (or the drill is cancelled).
pub async fn play(
    drill: &mut Drill<'_>,
    steps: &[(Duration, Step)],
    mut workload: tokio::task::JoinHandle<()>,
    sent: &Arc<Mutex<Sent>>,
    reader: &ReadBack,
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
    loop {
        if next >= steps.len() && workload_done {
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
                drill.apply(step).await?;
            }
            _ = alive.tick() => {
                // An engine that ends on its own is an infrastructure failure, not a verdict.
                if let Some(why) = drill.system.exited() {
                    return Err(RunError::Engine(crate::sut::SutError::Exited(why)));
                }
            }
            _ = progress.tick() => {
                let accepted = sent.lock().map(|s| s.accepted().count()).unwrap_or(0);
                let link = &drill.rig.link;
                let status = link.status();
                let read_back = reader.count().await.map_or("-".to_string(), |n| n.to_string());
                let state = format!(
                    "link {}: {}{}",
                    link.name(),
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

/// A step in a few words, for the progress bar's countdown.
fn describe_step(step: &Step) -> String {
    match step {
        Step::Link { link, spec, .. } => format!("link {link} {}", describe(spec)),
        Step::ProxyDown { .. } => "proxy restart".to_string(),
        Step::Heal { link, .. } => format!("heal link {link}"),
        Step::Engine { action, .. } => format!("engine {}", action.name()),
        Step::RestartEngine => "engine back".to_string(),
        Step::DiskBack => "disk space back".to_string(),
        Step::Broker { action, .. } => format!("broker {}", action.name()),
        Step::RestartBroker => "broker back".to_string(),
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
