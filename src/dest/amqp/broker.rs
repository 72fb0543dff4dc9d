//! The receiving side of an amqp destination: Debian's RabbitMQ as a local process.
//!
//! Each drill's node is a world of its own: its own node name (`drill-<pid>-<n>@localhost`),
//! Erlang cookie, data folder, AMQP and distribution ports on 127.0.0.1, and its own `epmd` on a
//! per-drill `ERL_EPMD_PORT`, started by drill as its child (an `epmd` the node started itself
//! would daemonise and outlive drill). The node leads a process group of its own: a kill
//! SIGKILLs the whole Erlang VM; the node restarts on the same ports and data folder (the
//! quorum queue and what it holds come back). The folder is removed when the node is.
//!
//! The binaries are found in `DRILL_RABBITMQ_BIN` (a folder with `rabbitmq-server` and
//! `rabbitmqctl`), `/usr/lib/rabbitmq/bin` (Debian), or on PATH.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use nix::sys::signal::Signal;
use tokio::process::Command;

use super::Amqp;
use crate::dest::running::{Halts, LocalNode, Place};
use crate::dest::{DestError, Destination, Provision, Provisioned, Running, Runtime};
use crate::process::{LocalProcess, Signals, StartError, dies_with_drill, free_port};
use crate::proxy::Link;

/// What to install when RabbitMQ is not found.
pub const MISSING: &str = "RabbitMQ is not installed (looked at DRILL_RABBITMQ_BIN, /usr/lib/rabbitmq/bin and PATH); install it (Debian: apt-get install rabbitmq-server, or run ci/setup.sh)";

/// How long a node may take to answer an AMQP connection (a restart replays its quorum logs).
const STARTUP: Duration = Duration::from_secs(90);

/// The folder with `rabbitmq-server` and `rabbitmqctl`.
pub fn find_bin() -> Option<PathBuf> {
    let given = std::env::var_os("DRILL_RABBITMQ_BIN").map(PathBuf::from);
    let debian = Some(PathBuf::from("/usr/lib/rabbitmq/bin"));
    let on_path = crate::process::find_binary("rabbitmq-server", &[])
        .and_then(|p| p.parent().map(Path::to_path_buf));
    [given, debian, on_path]
        .into_iter()
        .flatten()
        .find(|dir| dir.join("rabbitmq-server").is_file() && dir.join("rabbitmqctl").is_file())
}

/// A node's folder, ports and epmd; dropping the last handle kills the epmd and removes the
/// folder.
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    /// `drill-<pid>-<n>@localhost`.
    pub node: String,
    epmd_port: u16,
    dist_port: u16,
    epmd: std::sync::Mutex<Option<std::process::Child>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Ok(mut epmd) = self.epmd.lock()
            && let Some(mut child) = epmd.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    /// The environment every RabbitMQ command of this node runs in.
    fn env(&self, command: &mut Command) {
        let d = &self.dir;
        command
            .env("HOME", d.join("home"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("RABBITMQ_CONF_ENV_FILE", d.join("rabbitmq-env.conf.none"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_CTL_ERL_ARGS", "-start_epmd false")
            .env(
                "RABBITMQ_CTL_DIST_PORT_MIN",
                (self.dist_port + 1).to_string(),
            )
            .env(
                "RABBITMQ_CTL_DIST_PORT_MAX",
                (self.dist_port + 10).to_string(),
            );
    }

    /// `rabbitmqctl -n <node> <args>`: what it printed, or why it failed.
    pub async fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let mut c = Command::new(self.bin.join("rabbitmqctl"));
        self.env(&mut c);
        c.arg("-n").arg(&self.node).args(args);
        let out = tokio::time::timeout(Duration::from_secs(30), c.output())
            .await
            .map_err(|_| format!("rabbitmqctl {} gave no answer within 30 s", args.join(" ")))?
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "rabbitmqctl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// A running node; dropping it kills it (the whole VM) and, with the last handle on its
/// cluster, its epmd and folder.
pub struct Server {
    pub addr: SocketAddr,
    pub version: String,
    process: Option<LocalProcess>,
    pub cluster: Arc<Cluster>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(p) = &self.process {
            p.kill_group_now();
        }
    }
}

/// The signals each broker fault sends: a kill and a crash SIGKILL the VM with its children;
/// a stop is RabbitMQ's own shutdown (SIGTERM to the VM: it closes the connections and
/// flushes its queues).
pub const HALTS: Halts = Halts {
    kill: Signals {
        signal: Signal::SIGKILL,
        group: true,
    },
    stop: Signals {
        signal: Signal::SIGTERM,
        group: true,
    },
    crash: Signals {
        signal: Signal::SIGKILL,
        group: true,
    },
};

impl Server {
    /// The node as one broker faults can halt and start again: the same folder and ports.
    fn into_node(mut self) -> LocalNode {
        let cluster = self.cluster.clone();
        let what = format!("RabbitMQ ({})", cluster.bin.display());
        LocalNode::restartable(
            "rabbitmq",
            self.addr,
            self.process.take(),
            HALTS,
            what,
            move |port| {
                let cluster = cluster.clone();
                async move { run(&cluster, port).await.map(|(process, _)| process) }.boxed()
            },
        )
    }
}

/// Starts the node and puts the link in front of it; declares the drill's queue.
pub(super) async fn provision(
    dest: Arc<dyn Destination>,
    amqp: &Amqp,
    p: Provision<'_>,
) -> Result<Provisioned, DestError> {
    match p.runtime {
        Runtime::Container => {
            return Err(DestError::Unsupported(
                "`runtime: container` is not built for amqp yet; leave `runtime` out (drill runs RabbitMQ as a local process)".to_string(),
            ));
        }
        Runtime::Embedded | Runtime::External => {
            return Err(DestError::Unsupported(
                "amqp runs as a local process only for now; leave `runtime` out".to_string(),
            ));
        }
        Runtime::Auto | Runtime::Process => {}
    }
    if p.needs.pauses {
        return Err(DestError::Unsupported(
            "a local RabbitMQ cannot be paused; kill, stop or crash it".to_string(),
        ));
    }
    if p.tls.is_some() {
        return Err(DestError::Unsupported(
            "`destination.tls` is not built for amqp yet; leave it out".to_string(),
        ));
    }
    let server = start(p.needs.message_limit).await?;
    super::queue::declare(server.addr, &amqp.queue, amqp.queue_type)
        .await
        .map_err(|e| DestError::Reader(format!("declaring the queue {}: {e}", amqp.queue)))?;
    let (addr, version) = (server.addr, server.version.clone());
    let note = format!(
        "RabbitMQ node {} with its own epmd; durable {} queue `{}`{}",
        server.cluster.node,
        amqp.queue_type.name(),
        amqp.queue,
        p.needs
            .message_limit
            .map_or(String::new(), |l| format!(
                ", max_message_size {l} bytes (poison records are refused with a 406 channel close)"
            ))
    );
    let states = super::states::BrokerStates::start(server.cluster.clone(), addr, amqp.clone());
    let mut running = Running::new(
        dest,
        vec![addr],
        "process",
        version,
        Place::Nodes(vec![server.into_node()]),
    );
    running.answers = Some(Arc::new(states));
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let link = Link::start(&p.spec.link_name(), any, addr, p.links.clone()).await?;
    Ok(Provisioned {
        links: vec![link],
        running,
        notes: vec![note],
    })
}

/// A node of its own on free ports, its epmd first; returns once it answers an AMQP
/// connection. `message_limit`: the node's `max_message_size` (poison records).
pub async fn start(message_limit: Option<usize>) -> Result<Server, DestError> {
    let bin = find_bin().ok_or_else(|| DestError::Missing(MISSING.to_string()))?;
    let fail = |why: String| StartError {
        what: format!("RabbitMQ ({})", bin.display()),
        why,
    };
    let dir = folder(message_limit)?;
    let epmd_port = free_port()?;
    let epmd = std::process::Command::new(epmd_binary(&bin))
        .args(["-port", &epmd_port.to_string(), "-address", "127.0.0.1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| fail(format!("epmd: {e}")))?;
    let node = format!("drill-{}-{}@localhost", std::process::id(), dir_number(&dir));
    let cluster = Arc::new(Cluster {
        bin: bin.clone(),
        dir,
        node,
        epmd_port,
        dist_port: free_port()?,
        epmd: std::sync::Mutex::new(Some(epmd)),
    });
    let mut last = String::new();
    for _ in 0..3 {
        let port = free_port()?;
        match run(&cluster, port).await {
            Ok((process, version)) => {
                return Ok(Server {
                    addr: ([127, 0, 0, 1], port).into(),
                    version,
                    process: Some(process),
                    cluster,
                });
            }
            Err(e) => last = e,
        }
    }
    Err(fail(last).into())
}

/// `epmd` beside Erlang's runtime (`/usr/lib/erlang/bin/epmd`), else on PATH.
fn epmd_binary(_bin: &Path) -> PathBuf {
    ["/usr/lib/erlang/bin/epmd", "/usr/bin/epmd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("epmd"))
}

/// The number in a node folder's name (`drill-rabbitmq-<pid>-<n>`).
fn dir_number(dir: &Path) -> String {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.rsplit('-').next())
        .unwrap_or("0")
        .to_string()
}

/// A folder of its own: the cookie (0400), the config, an empty plugin list.
fn folder(message_limit: Option<usize>) -> Result<PathBuf, DestError> {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("drill-rabbitmq-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["home", "mnesia", "log"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let cookie = dir.join("home/.erlang.cookie");
    std::fs::write(&cookie, format!("DRILL{}X{n}", std::process::id()))?;
    std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400))?;
    std::fs::write(dir.join("enabled_plugins"), "[].\n")?;
    let mut conf = String::from(
        "# drill's node: guest may log in through drill's link (127.0.0.1 either way)\nloopback_users = none\n",
    );
    if let Some(limit) = message_limit {
        conf.push_str(&format!("max_message_size = {limit}\n"));
    }
    std::fs::write(dir.join("rabbitmq.conf"), conf)?;
    Ok(dir)
}

/// The node of `cluster` with its AMQP listener on `port`, in a process group of its own; once
/// it answers, with its version. Its output is `server.log` in the node's folder (appended to:
/// a kill and the restart after it are both there).
async fn run(cluster: &Cluster, port: u16) -> Result<(LocalProcess, String), String> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let log_path = cluster.dir.join("server.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| e.to_string())?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut c = Command::new(cluster.bin.join("rabbitmq-server"));
    cluster.env(&mut c);
    c.env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
        .env("RABBITMQ_NODE_PORT", port.to_string())
        .env("RABBITMQ_DIST_PORT", cluster.dist_port.to_string())
        // One scheduler, none spinning while idle: a drill's node shares the machine with the
        // engine, the proxy and other drills (RabbitMQ's own advice for shared hosts).
        .env(
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
            "-start_epmd false -kernel inet_dist_use_interface {127,0,0,1} +S 1:1 +sbwt none +sbwtdcpu none +sbwtdio none",
        )
        .current_dir(&cluster.dir);
    c.process_group(0);
    let child = dies_with_drill(&mut c)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut process = LocalProcess::new(child);
    match answers(addr, &mut process).await {
        Ok(()) => {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            Ok((process, super::queue::version_in(&log)))
        }
        Err(e) => {
            process.signal(HALTS.kill, Duration::ZERO).await;
            Err(crate::dest::running::with_last_line(e, &log_path, "rabbitmq-server"))
        }
    }
}

/// Waits (at most [`STARTUP`]) until the node answers an AMQP connection.
async fn answers(addr: SocketAddr, process: &mut LocalProcess) -> Result<(), String> {
    let deadline = Instant::now() + STARTUP;
    loop {
        match super::queue::connect(addr).await {
            Ok(connection) => {
                let _ = connection.close(200, "drill: started".into()).await;
                return Ok(());
            }
            Err(e) if Instant::now() > deadline => {
                return Err(format!("no answer after {} s: {e}", STARTUP.as_secs()));
            }
            Err(_) => {}
        }
        if let Some(status) = process.exited() {
            return Err(format!("rabbitmq-server exited with {status}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
