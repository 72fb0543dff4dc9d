//! [`Running`]: a destination's receiving side while a drill runs — a local process, the
//! embedded broker, a container, a cluster of local nodes, or the user's own brokers — with
//! what a broker fault does to it ([`Running::halt`], [`Running::back`]) and its teardown.
//!
//! What is the same for every kind lives here; the kind made it (`<kind>/broker.rs`) and
//! reads from it (`<kind>/read.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::BoxFuture;

use super::{DestError, Destination, ReadBack, ReaderSpec};
use crate::container::ContainerBroker;
use crate::process::{LocalProcess, Signals};
use crate::verify::Access;

/// What a broker fault does to a broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    /// SIGKILL.
    Kill,
    /// SIGTERM (SIGKILL after a grace).
    Stop,
    /// Frozen (a container's `docker pause`) until resumed.
    Pause,
    /// The broker's own way to crash: SIGKILL for most; PostgreSQL's immediate shutdown
    /// (`pg_ctl stop -m immediate`: no checkpoint, crash recovery at the next start).
    Crash,
}

/// Which broker node a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// The node that leads the drill's data at that instant (a stream's leader).
    Leader,
    /// Node `n` (from 1).
    Number(usize),
}

/// One node of a cluster of local processes: killable and startable again on the same ports
/// and store.
pub struct LocalNode {
    pub name: String,
    pub addr: SocketAddr,
    /// Starts the node (again): the same program, arguments and log.
    pub spawn: Box<dyn Fn() -> BoxFuture<'static, Result<LocalProcess, DestError>> + Send + Sync>,
    pub process: Option<LocalProcess>,
    /// How each halt reaches it.
    pub halts: Halts,
}

impl LocalNode {
    /// A server drill runs as a local process (`process`, listening at `addr`) that broker
    /// faults halt and `run(port)` starts again on the same port and data; `what` names it in
    /// an error (`PostgreSQL (/usr/lib/postgresql/15/bin)`).
    pub fn restartable(
        name: &str,
        addr: SocketAddr,
        process: Option<LocalProcess>,
        halts: Halts,
        what: String,
        run: impl Fn(u16) -> BoxFuture<'static, Result<LocalProcess, String>> + Send + Sync + 'static,
    ) -> LocalNode {
        let run = std::sync::Arc::new(run);
        LocalNode {
            name: name.to_string(),
            addr,
            spawn: Box::new(move || {
                let (run, what) = (run.clone(), what.clone());
                Box::pin(async move {
                    run(addr.port()).await.map_err(|why| {
                        DestError::Start(crate::process::StartError {
                            what: format!("{what} again"),
                            why,
                        })
                    })
                })
            }),
            process,
            halts,
        }
    }
}

/// `why`, with the last line `who` wrote to its log at `log` when there is one: what a server
/// that failed to start said of it.
pub fn with_last_line(why: String, log: &std::path::Path, who: &str) -> String {
    let said = std::fs::read_to_string(log).unwrap_or_default();
    match said.lines().rfind(|l| !l.trim().is_empty()) {
        Some(line) => format!("{why} ({who} said: {})", line.trim()),
        None => why,
    }
}

/// The signals a node's kill, stop and crash send, and how long each may take before SIGKILL.
#[derive(Debug, Clone, Copy)]
pub struct Halts {
    pub kill: Signals,
    pub stop: Signals,
    pub crash: Signals,
}

impl Default for Halts {
    /// SIGKILL, SIGTERM, and a crash that is a SIGKILL.
    fn default() -> Halts {
        Halts {
            kill: Signals::KILL,
            stop: Signals::TERM,
            crash: Signals::KILL,
        }
    }
}

/// Removes what drill created on the user's brokers (a topic, a stream).
pub type Remove = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// Where the receiving side runs.
pub enum Place {
    /// A local process (`None`: nothing to stop).
    Local(Option<LocalProcess>),
    /// A broker running inside drill; dropping the value stops it.
    InProcess(Box<dyn std::any::Any + Send + Sync>),
    Container(Box<ContainerBroker>),
    /// A cluster of local processes.
    Nodes(Vec<LocalNode>),
    /// The user's brokers: drill removes only what it created (`made`), at the end.
    External {
        made: Option<Remove>,
    },
}

/// A destination's receiving side while a drill runs.
pub struct Running {
    /// The kind, with its settings: readers and leaders are its to find.
    pub dest: Arc<dyn Destination>,
    /// Where the verifier reads: the broker itself, never through the proxy.
    pub addrs: Vec<SocketAddr>,
    /// `process`, `embedded`, `container` or `external`.
    pub runtime: &'static str,
    /// What ran, e.g. `mosquitto 2.0.11`.
    pub version: String,
    /// An external broker's credentials and where the drill's records begin.
    pub access: Access,
    pub place: Place,
    /// A destination drill hosts: how it is told to answer (`target: destination` faults).
    pub answers: Option<Arc<dyn super::AnswerControl>>,
    /// The node halted by the last broker fault, until it is back; and whether that was a
    /// pause.
    halted: Option<(usize, Halt)>,
}

impl Running {
    pub fn new(
        dest: Arc<dyn Destination>,
        addrs: Vec<SocketAddr>,
        runtime: &'static str,
        version: String,
        place: Place,
    ) -> Running {
        Running {
            dest,
            addrs,
            runtime,
            version,
            access: Access::default(),
            place,
            answers: None,
            halted: None,
        }
    }

    /// The reader, subscribed (or ready to read) before the first record.
    pub async fn reader(&self, r: ReaderSpec) -> Result<Box<dyn ReadBack>, DestError> {
        self.dest.clone().reader(self, r).await
    }

    /// Halts one broker node: kill, stop or pause. `Ok` names what was hit (`n2`,
    /// `container`); `Err` says why nothing was (no such node, no leader found).
    pub async fn halt(&mut self, node: super::Node, how: Halt) -> Result<String, String> {
        let index = match node {
            Node::Number(n) => n.saturating_sub(1),
            Node::Leader => self
                .dest
                .clone()
                .leader(self)
                .await
                .ok_or("no node leads the drill's stream now (no leader could be found)")?,
        };
        let hit = match &mut self.place {
            Place::Container(c) => {
                match how {
                    Halt::Kill | Halt::Crash => c.kill().await,
                    Halt::Pause => c.pause().await,
                    Halt::Stop => c.stop().await,
                }
                "container".to_string()
            }
            Place::Nodes(nodes) => {
                let size = nodes.len();
                let n = nodes
                    .get_mut(index)
                    .ok_or_else(|| format!("no node {} in a cluster of {size}", index + 1))?;
                let signals = match how {
                    Halt::Kill => n.halts.kill,
                    Halt::Crash => n.halts.crash,
                    Halt::Stop | Halt::Pause => n.halts.stop,
                };
                if let Some(mut p) = n.process.take() {
                    p.signal(signals, std::time::Duration::from_secs(10)).await;
                }
                n.name.clone()
            }
            Place::Local(_) | Place::InProcess(_) | Place::External { .. } => {
                return Err(
                    "this broker cannot be halted on its own (a container or a cluster node can)"
                        .to_string(),
                );
            }
        };
        self.halted = Some((index, how));
        Ok(hit)
    }

    /// Brings back what the last fault halted: resumed if paused, else started again. `Some`
    /// names it and, for a container that came back on another host port, its new address
    /// (the links follow it).
    pub async fn back(&mut self) -> Result<Option<(String, Option<SocketAddr>)>, DestError> {
        let Some((index, how)) = self.halted.take() else {
            return Ok(None);
        };
        match &mut self.place {
            Place::Container(c) if how == Halt::Pause => {
                c.resume().await;
                Ok(Some(("container".to_string(), None)))
            }
            Place::Container(c) => {
                let addr = c.restart().await?;
                self.addrs = vec![addr];
                Ok(Some(("container".to_string(), Some(addr))))
            }
            Place::Nodes(nodes) => {
                let Some(n) = nodes.get_mut(index) else {
                    return Ok(None);
                };
                n.process = Some((n.spawn)().await?);
                Ok(Some((n.name.clone(), None)))
            }
            Place::Local(_) | Place::InProcess(_) | Place::External { .. } => Ok(None),
        }
    }

    /// Stops what drill started (process, container, nodes) and removes what it created on
    /// the user's brokers; says how that went, when there was something to remove.
    pub async fn stop(&mut self) -> Option<String> {
        match &mut self.place {
            Place::Local(Some(p)) => p.stop(false).await,
            Place::Local(None) => {}
            Place::InProcess(broker) => drop(std::mem::replace(broker, Box::new(()))),
            Place::Container(c) => c.remove().await,
            Place::Nodes(nodes) => {
                for n in nodes.iter_mut() {
                    if let Some(mut p) = n.process.take() {
                        p.signal(n.halts.stop, std::time::Duration::from_secs(5))
                            .await;
                    }
                }
            }
            Place::External { made } => {
                let remove = made.take()?;
                return Some(match remove().await {
                    Ok(()) => "removed what drill created on the external broker".to_string(),
                    Err(e) => {
                        format!("could not remove what drill created on the external broker: {e}")
                    }
                });
            }
        }
        None
    }
}
