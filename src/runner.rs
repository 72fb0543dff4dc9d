//! One drill, start to finish: provision the broker and the proxy link, start the reader and
//! the system under test, play the workload and the fault timeline, drain, read back, judge.
//!
//! The runner owns the clock of a drill (`t0`) and every child it starts; when [`run`] returns —
//! normally, with an error, or because the caller's token was cancelled — the engine process,
//! the broker and the proxy are stopped. It never judges: it collects facts and hands them to
//! [`verdict`](crate::report::judge).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::brokers;
use crate::container;
use crate::engine::{EngineConfig, OutputConfig, OutputKind, Stats};
use crate::proxy::{Direction, Fault, FaultSpec, Link};
use crate::report::{self, Facts, FaultRecord};
use crate::scenario::{DestinationKind, FaultAction, Plan, ProcessAction, RuntimeChoice};
use crate::sut::EngineProcess;
use crate::verify::{self, ReadBack, Reader};

/// The JetStream stream a NATS drill writes to.
const STREAM: &str = "DRILL";
/// Partitions of a Kafka drill's topic: one, so that the order records arrive in is the
/// order they are read back in (reordering is only observable within a partition; the engine
/// keys records by write key, which would scatter a source's sequence across partitions). The
/// reader itself reads any number of partitions.
const KAFKA_PARTITIONS: i32 = 1;
use crate::workload::{self, Sent};

/// Why a drill could not be carried out (exit code 3): not a verdict on the engine.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("broker: {0}")]
    Broker(#[from] brokers::BrokerError),
    #[error("proxy: {0}")]
    Proxy(#[from] crate::proxy::ProxyError),
    #[error("engine: {0}")]
    Engine(#[from] crate::sut::SutError),
    #[error("reader: {0}")]
    Reader(#[from] crate::mqtt::MqttError),
    #[error("{0}")]
    Verifier(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("interrupted")]
    Interrupted,
}

/// How to run a plan.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where `<scenario name>/` with the reports goes.
    pub out: PathBuf,
    /// Overrides the scenario's runtime.
    pub runtime: Option<RuntimeChoice>,
    /// Overrides the scenario's seed.
    pub seed: Option<u64>,
    /// The `drill` binary that runs the engine (`drill engine --config`).
    pub engine_exe: PathBuf,
}

/// One scheduled step of the timeline.
#[derive(Debug, Clone)]
enum Step {
    Link {
        index: usize,
        link: String,
        spec: FaultSpec,
    },
    ProxyDown {
        index: usize,
    },
    Heal {
        index: Option<usize>,
        link: String,
    },
    Engine {
        index: usize,
        action: ProcessAction,
        wipe_data: bool,
    },
    RestartEngine,
    Broker {
        index: usize,
        node: crate::scenario::BrokerNode,
        action: ProcessAction,
    },
    RestartBroker,
}

fn timeline(plan: &Plan) -> Vec<(Duration, Step)> {
    let mut steps = Vec::new();
    for (index, f) in plan.faults.iter().enumerate() {
        match &f.what {
            FaultAction::Broker {
                node,
                action,
                restart_after,
            } => {
                steps.push((
                    f.at,
                    Step::Broker {
                        index,
                        node: *node,
                        action: *action,
                    },
                ));
                if let Some(d) = restart_after {
                    steps.push((f.at + *d, Step::RestartBroker));
                }
            }
            FaultAction::Link { link, spec, lasts } => {
                steps.push((
                    f.at,
                    Step::Link {
                        index,
                        link: link.clone(),
                        spec: *spec,
                    },
                ));
                if let Some(d) = lasts {
                    steps.push((
                        f.at + *d,
                        Step::Heal {
                            index: Some(index),
                            link: link.clone(),
                        },
                    ));
                }
            }
            FaultAction::ProxyRestart { down_for } => {
                steps.push((f.at, Step::ProxyDown { index }));
                steps.push((
                    f.at + *down_for,
                    Step::Heal {
                        index: Some(index),
                        link: "proxy".to_string(),
                    },
                ));
            }
            FaultAction::Heal { link } => steps.push((
                f.at,
                Step::Heal {
                    index: None,
                    link: link.clone(),
                },
            )),
            FaultAction::Engine {
                action,
                restart_after,
                wipe_data,
            } => {
                steps.push((
                    f.at,
                    Step::Engine {
                        index,
                        action: *action,
                        wipe_data: *wipe_data,
                    },
                ));
                if let Some(d) = restart_after {
                    steps.push((f.at + *d, Step::RestartEngine));
                }
            }
        }
    }
    steps.sort_by_key(|(at, _)| *at);
    steps
}

/// `swallow`, `delay 100ms±10ms`, `throttle 50000 B/s`.
fn describe(spec: &FaultSpec) -> String {
    match spec.fault {
        Fault::Delay => format!(
            "delay {}ms±{}ms",
            spec.latency.as_millis(),
            spec.jitter.as_millis()
        ),
        Fault::Throttle => format!("throttle {} B/s", spec.bytes_per_s),
        f => f.name().to_string(),
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn say(line: &str) {
    println!("{line}");
}

/// Runs one drill. Returns the facts for the report (the caller judges and writes).
pub async fn run(
    plan: &Plan,
    options: &Options,
    cancel: CancellationToken,
) -> Result<Facts, RunError> {
    let seed = options.seed.unwrap_or(plan.seed);
    let runtime = options.runtime.unwrap_or(plan.destination.runtime);
    let dir = options.out.join(&plan.name);
    let work = dir.join("work");
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RunError::Io { path, source }
    };
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(io(&work))?;
    }
    std::fs::create_dir_all(&work).map_err(io(&work))?;
    let run_id = format!("{}-{seed}", plan.name);
    let mut notes: Vec<String> = Vec::new();

    say(&format!(
        "drill {}: {}",
        plan.name,
        plan.about.as_deref().unwrap_or("")
    ));
    let limit = (!plan.workload.poison.is_empty()).then(|| plan.workload.message_limit());
    let link_cancel = cancel.child_token();
    let link_name = plan.destination.link_name();
    let mut cluster: Vec<brokers::NatsNode> = Vec::new();
    let mut containers: Vec<container::ContainerBroker> = Vec::new();
    let placement = place(plan.destination.kind, runtime, &mut notes).await?;
    let broker_faults = plan
        .faults
        .iter()
        .any(|f| matches!(f.what, FaultAction::Broker { .. }));
    let pauses = plan.faults.iter().any(|f| {
        matches!(
            f.what,
            FaultAction::Broker {
                action: ProcessAction::Pause,
                ..
            }
        )
    });
    if broker_faults && placement.is_none() && (plan.destination.nodes < 2 || pauses) {
        return Err(brokers::BrokerError::ContainerUnavailable(
            "broker faults need the container runtime (pause too) or a NATS cluster (kill, stop); use --runtime container".to_string(),
        )
        .into());
    }
    let mut links: Vec<Link> = Vec::new();
    let (mut broker, link) = match (plan.destination.kind, placement.clone()) {
        (DestinationKind::Nats, Some((docker, image, image_id))) => {
            if plan.destination.nodes > 1 {
                return Err(brokers::BrokerError::ContainerUnavailable(
                    "a NATS cluster runs as local processes so far; use --runtime process"
                        .to_string(),
                )
                .into());
            }
            let link = Link::start(
                link_name,
                SocketAddr::from(([127, 0, 0, 1], 0)),
                SocketAddr::from(([127, 0, 0, 1], 9)),
                link_cancel.clone(),
            )
            .await?;
            let c = container::start(
                docker,
                DestinationKind::Nats,
                &image,
                image_id,
                &run_id,
                link.listen_addr(),
                None,
            )
            .await?;
            link.set_upstream(c.addr);
            let window = plan
                .destination
                .duplicate_window
                .unwrap_or(Duration::from_secs(120));
            brokers::create_stream(c.addr, STREAM, &plan.destination.topic, window, limit, 1)
                .await?;
            notes.push(format!(
                "JetStream stream {STREAM} on subject `{}`: 1 replica, duplicate window {} s (at least the longest outage plus the longest backoff)",
                plan.destination.topic,
                window.as_secs()
            ));
            let broker = container_broker(&c);
            containers.push(c);
            links.push(link.clone());
            (broker, link)
        }
        (DestinationKind::Nats, None) => {
            // The proxies are bound first, so each server can advertise its own (never itself).
            let mut ports = Vec::new();
            for name in plan.destination.link_names() {
                let port = brokers::free_port().map_err(io(&work))?;
                let upstream = SocketAddr::from(([127, 0, 0, 1], port));
                links.push(
                    Link::start(
                        &name,
                        SocketAddr::from(([127, 0, 0, 1], 0)),
                        upstream,
                        link_cancel.clone(),
                    )
                    .await?,
                );
                ports.push(port);
            }
            let advertised: Vec<SocketAddr> = links.iter().map(Link::listen_addr).collect();
            let broker = if ports.len() == 1 {
                brokers::start_nats(&work, Some(ports[0]), Some(advertised[0])).await?
            } else {
                cluster = brokers::start_nats_cluster(&work, &ports, &advertised).await?;
                brokers::Broker::without_process(
                    cluster[0].addr,
                    "process",
                    format!("nats-server cluster of {} nodes", cluster.len()),
                )
            };
            let window = plan
                .destination
                .duplicate_window
                .unwrap_or(Duration::from_secs(120));
            let replicas = cluster.len().clamp(1, 3);
            brokers::create_stream(
                broker.addr,
                STREAM,
                &plan.destination.topic,
                window,
                limit,
                replicas,
            )
            .await?;
            notes.push(format!(
                "JetStream stream {STREAM} on subject `{}`: {replicas} replica(s), duplicate window {} s (at least the longest outage plus the longest backoff)",
                plan.destination.topic,
                window.as_secs()
            ));
            (broker, links[0].clone())
        }
        (DestinationKind::Kafka, Some((docker, image, image_id))) => {
            let link = Link::start(
                link_name,
                SocketAddr::from(([127, 0, 0, 1], 0)),
                SocketAddr::from(([127, 0, 0, 1], 9)),
                link_cancel.clone(),
            )
            .await?;
            let c = container::start(
                docker,
                DestinationKind::Kafka,
                &image,
                image_id,
                &run_id,
                link.listen_addr(),
                None,
            )
            .await?;
            link.set_upstream(c.addr);
            brokers::create_topic(
                link.listen_addr(),
                &plan.destination.topic,
                KAFKA_PARTITIONS,
            )
            .await?;
            notes.push(format!(
                "Kafka topic `{}`: {KAFKA_PARTITIONS} partitions; the broker advertises the proxy link",
                plan.destination.topic
            ));
            let broker = container_broker(&c);
            containers.push(c);
            links.push(link.clone());
            (broker, link)
        }
        (DestinationKind::Kafka, None) => {
            // The proxy is bound first, so the broker can advertise it (never itself).
            let port = brokers::free_port().map_err(io(&work))?;
            let upstream = SocketAddr::from(([127, 0, 0, 1], port));
            let link = Link::start(
                link_name,
                SocketAddr::from(([127, 0, 0, 1], 0)),
                upstream,
                link_cancel.clone(),
            )
            .await?;
            let broker = brokers::start_kafka(&work, Some(port), Some(link.listen_addr())).await?;
            brokers::create_topic(
                link.listen_addr(),
                &plan.destination.topic,
                KAFKA_PARTITIONS,
            )
            .await?;
            notes.push(format!(
                "Kafka topic `{}`: {KAFKA_PARTITIONS} partitions; the broker advertises the proxy link",
                plan.destination.topic
            ));
            links.push(link.clone());
            (broker, link)
        }
        (DestinationKind::Mqtt, Some((docker, image, image_id))) => {
            let c = container::start(
                docker,
                DestinationKind::Mqtt,
                &image,
                image_id,
                &run_id,
                SocketAddr::from(([127, 0, 0, 1], 0)),
                limit,
            )
            .await?;
            let link = Link::start(
                link_name,
                SocketAddr::from(([127, 0, 0, 1], 0)),
                c.addr,
                link_cancel.clone(),
            )
            .await?;
            let broker = container_broker(&c);
            containers.push(c);
            links.push(link.clone());
            (broker, link)
        }
        (DestinationKind::Mqtt, None) => {
            let runtime = if runtime == RuntimeChoice::Container {
                RuntimeChoice::Auto
            } else {
                runtime
            };
            let broker = brokers::start_mqtt(runtime, &work, limit).await?;
            let link = Link::start(
                link_name,
                SocketAddr::from(([127, 0, 0, 1], 0)),
                broker.addr,
                link_cancel.clone(),
            )
            .await?;
            links.push(link.clone());
            (broker, link)
        }
    };
    if let Some(note) = &broker.note {
        say(&format!("  {note}"));
    }
    say(&format!(
        "  broker: {} ({}) on {}",
        broker.version, broker.runtime, broker.addr
    ));
    for note in &notes {
        say(&format!("  {note}"));
    }
    for l in &links {
        l.seed(seed);
        say(&format!(
            "  proxy link {}: {} -> {}",
            l.name(),
            l.listen_addr(),
            l.upstream_addr()
        ));
    }

    let engine_port = brokers::free_port().map_err(io(&work))?;
    let config = EngineConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], engine_port)),
        data_dir: work.join("engine-data"),
        outputs: vec![OutputConfig {
            promise: plan.engine.promise,
            order: plan.engine.order,
            keepalive: crate::engine::DurText(plan.engine.keepalive),
            answer_timeout: crate::engine::DurText(plan.engine.answer_timeout),
            window: plan.engine.window,
            refusals: Some(crate::engine::RefusalConfig {
                max: plan.engine.refusals.0,
                backoff: [
                    crate::engine::DurText(plan.engine.refusals.1),
                    crate::engine::DurText(plan.engine.refusals.2),
                ],
            }),
            kind: match plan.destination.kind {
                DestinationKind::Nats => OutputKind::Nats,
                DestinationKind::Kafka => OutputKind::Kafka,
                DestinationKind::Mqtt => OutputKind::Mqtt,
            },
            more_addresses: links.iter().skip(1).map(Link::listen_addr).collect(),
            ..OutputConfig::mqtt(link_name, link.listen_addr(), &plan.destination.topic)
        }],
        disk: Default::default(),
    };
    let mut engine = EngineProcess::start(&options.engine_exe, config, &work).await?;
    say(&format!(
        "  engine: built-in, pid-managed, api http://{}",
        engine.addr()
    ));

    // The reader subscribes before the first record; then the workload and the timeline run
    // side by side on the drill's clock.
    let t0 = Instant::now();
    let t0_wall = std::time::SystemTime::now();
    let reader_cancel = cancel.child_token();
    let mut reader = match plan.destination.kind {
        DestinationKind::Nats => ReadBack::stream(
            if cluster.is_empty() {
                vec![broker.addr]
            } else {
                cluster.iter().map(|n| n.addr).collect()
            },
            STREAM,
            t0_wall,
        )
        .await
        .map_err(RunError::Verifier)?,
        DestinationKind::Kafka => ReadBack::Topic {
            bootstrap: link.listen_addr(),
            topic: plan.destination.topic.clone(),
            t0: t0_wall,
        },
        DestinationKind::Mqtt => ReadBack::Mqtt(
            Reader::start(
                broker.addr,
                &plan.destination.topic,
                t0,
                reader_cancel.clone(),
            )
            .await?,
        ),
    };
    let sent = Arc::new(Mutex::new(Sent::default()));
    let workload_cancel = cancel.child_token();
    let workload = tokio::spawn(workload::drive(
        plan.workload.clone(),
        run_id.clone(),
        seed,
        engine.addr(),
        t0,
        sent.clone(),
        workload_cancel.clone(),
    ));
    say(&format!(
        "  workload: {} records at {}/s over {:?}, {} keys, seed {seed}",
        plan.workload.total_records(),
        plan.workload.rate_per_s,
        plan.workload.duration,
        plan.workload.keys
    ));

    let mut faults: Vec<FaultRecord> = Vec::new();
    let mut crashes: Vec<Duration> = Vec::new();
    let mut killed_node: Option<usize> = None;
    let mut paused = false;
    let mut progress = tokio::time::interval(Duration::from_secs(5));
    progress.tick().await;
    let steps = timeline(plan);
    let mut next = 0;
    let mut workload = workload;
    let mut workload_done = false;
    let interrupted = loop {
        if next >= steps.len() && workload_done {
            break false;
        }
        let wake = steps
            .get(next)
            .map(|(at, _)| tokio::time::Instant::from_std(t0 + *at));
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break true,
            _ = &mut workload, if !workload_done => workload_done = true,
            _ = progress.tick() => {
                let accepted = sent.lock().map(|s| s.accepted().count()).unwrap_or(0);
                let status = link.status();
                say(&format!(
                    "  {:>4}s  accepted {accepted:>6}  read back {:>6}  link {}: {}{}",
                    t0.elapsed().as_secs(),
                    reader.count().await.map_or("-".to_string(), |n| n.to_string()),
                    link.name(),
                    status.fault,
                    status.direction.map(|d| format!(" {d}")).unwrap_or_default()
                ));
            }
            _ = async { if let Some(w) = wake { tokio::time::sleep_until(w).await } }, if wake.is_some() => {
                let (_, step) = &steps[next];
                next += 1;
                let now = t0.elapsed();
                match step {
                    Step::Link { index, link: name, spec } => {
                        if let Some(l) = links.iter().find(|l| l.name() == name.as_str()) {
                            l.apply_spec_settled(*spec).await;
                        }
                        let what = describe(spec);
                        say(&format!("  {:>4}s  fault: link {name} {what} {}", now.as_secs(), spec.direction.name()));
                        faults.push(FaultRecord {
                            index: *index,
                            at_ms: ms(now),
                            target: format!("link {name}"),
                            fault: what,
                            direction: Some(spec.direction.name().to_string()),
                            until_ms: None,
                        });
                    }
                    Step::ProxyDown { index } => {
                        // A proxy restart: every connection dropped, nothing listens.
                        for l in &links {
                            l.apply_settled(Fault::Refuse, Direction::Both).await;
                        }
                        say(&format!("  {:>4}s  fault: proxy restart (down)", now.as_secs()));
                        faults.push(FaultRecord {
                            index: *index,
                            at_ms: ms(now),
                            target: "link proxy".to_string(),
                            fault: "restart".to_string(),
                            direction: None,
                            until_ms: None,
                        });
                    }
                    Step::Heal { index, link: name } => {
                        for l in links.iter().filter(|l| name == "proxy" || l.name() == name.as_str()) {
                            l.apply_settled(Fault::Heal, Direction::Both).await;
                        }
                        say(&format!("  {:>4}s  heal: link {name}", now.as_secs()));
                        let open = faults.iter_mut().rev().find(|f| {
                            f.until_ms.is_none()
                                && f.target == format!("link {name}")
                                && index.is_none_or(|i| f.index == i)
                        });
                        if let Some(f) = open {
                            f.until_ms = Some(ms(now));
                        }
                    }
                    Step::Engine { index, action, wipe_data } => {
                        match action {
                            ProcessAction::Kill => engine.kill().await,
                            ProcessAction::Stop | ProcessAction::Restart | ProcessAction::Pause => engine.stop(Duration::from_secs(10)).await,
                        }
                        crashes.push(now);
                        let mut what = match action {
                            ProcessAction::Kill => "kill (SIGKILL)".to_string(),
                            ProcessAction::Stop | ProcessAction::Restart | ProcessAction::Pause => "stop (SIGTERM)".to_string(),
                        };
                        if *wipe_data {
                            let data = engine.data_dir().to_path_buf();
                            if data.exists() {
                                std::fs::remove_dir_all(&data).map_err(io(&data))?;
                            }
                            what.push_str(", data directory removed");
                        }
                        say(&format!("  {:>4}s  fault: engine {what}", now.as_secs()));
                        faults.push(FaultRecord {
                            index: *index,
                            at_ms: ms(now),
                            target: "engine".to_string(),
                            fault: what,
                            direction: None,
                            until_ms: None,
                        });
                    }
                    Step::Broker { index, action, .. } if !containers.is_empty() => {
                        // One broker in a container: kill (SIGKILL) or stop it; restart_after
                        // starts it again and the link follows its new host port.
                        let c = &mut containers[0];
                        let what = match action {
                            ProcessAction::Kill => { c.kill().await; "kill (SIGKILL)" }
                            ProcessAction::Pause => { c.pause().await; "pause" }
                            _ => { c.stop().await; "stop (SIGTERM)" }
                        };
                        killed_node = Some(0);
                        paused = *action == ProcessAction::Pause;
                        say(&format!("  {:>4}s  fault: broker container {what}", now.as_secs()));
                        faults.push(FaultRecord {
                            index: *index,
                            at_ms: ms(now),
                            target: "broker container".to_string(),
                            fault: what.to_string(),
                            direction: None,
                            until_ms: None,
                        });
                    }
                    Step::RestartBroker if !containers.is_empty() => {
                        if killed_node.take().is_some() {
                            if std::mem::take(&mut paused) {
                                containers[0].resume().await;
                                say(&format!("  {:>4}s  broker container resumed", now.as_secs()));
                            } else {
                                let addr = containers[0].restart().await?;
                                for l in &links {
                                    l.set_upstream(addr);
                                }
                                say(&format!("  {:>4}s  broker container restarted on {addr}", now.as_secs()));
                            }
                            if let Some(f) = faults.iter_mut().rev().find(|f| f.target == "broker container" && f.until_ms.is_none()) {
                                f.until_ms = Some(ms(t0.elapsed()));
                            }
                        }
                    }
                    Step::Broker { .. } if cluster.is_empty() => {
                        // Checked before the drill started; unreachable in practice.
                    }
                    Step::Broker { index, node, action } => {
                        let at = match node {
                            crate::scenario::BrokerNode::Number(n) => Some(n - 1),
                            crate::scenario::BrokerNode::Leader => stream_leader_node(&cluster).await,
                        };
                        let kill = *action == ProcessAction::Kill;
                        let what = if kill { "kill (SIGKILL)" } else { "stop (SIGTERM)" };
                        match at.and_then(|i| cluster.get_mut(i).map(|n| (i, n))) {
                            Some((i, node)) => {
                                node.halt(kill).await;
                                killed_node = Some(i);
                                say(&format!("  {:>4}s  fault: broker {} {what}", now.as_secs(), node.name));
                                faults.push(FaultRecord {
                                    index: *index,
                                    at_ms: ms(now),
                                    target: format!("broker {}", node.name),
                                    fault: what.to_string(),
                                    direction: None,
                                    until_ms: None,
                                });
                            }
                            None => {
                                let why = "broker fault skipped: no such node, or no stream leader could be found".to_string();
                                say(&format!("  {:>4}s  {why}", now.as_secs()));
                                notes.push(why);
                            }
                        }
                    }
                    Step::RestartBroker => {
                        if let Some(i) = killed_node.take()
                            && let Some(node) = cluster.get_mut(i)
                        {
                            node.restart().await?;
                            say(&format!("  {:>4}s  broker {} restarted", now.as_secs(), node.name));
                            let target = format!("broker {}", node.name);
                            if let Some(f) = faults.iter_mut().rev().find(|f| f.target == target && f.until_ms.is_none()) {
                                f.until_ms = Some(ms(t0.elapsed()));
                            }
                        }
                    }
                    Step::RestartEngine => {
                        engine.spawn().await?;
                        engine.note("restarted by the drill").await;
                        say(&format!("  {:>4}s  engine restarted", now.as_secs()));
                        if let Some(f) = faults.iter_mut().rev().find(|f| f.target == "engine" && f.until_ms.is_none()) {
                            f.until_ms = Some(ms(t0.elapsed()));
                        }
                    }
                }
            }
        }
    };
    // The workload also ends when cancelled; an interrupted drill never gets a verdict.
    if interrupted || cancel.is_cancelled() {
        workload_cancel.cancel();
        engine.kill().await;
        teardown(&mut broker, &mut cluster, &mut containers, &links).await;
        return Err(RunError::Interrupted);
    }
    // A link left faulted by the scenario stays so: a drill may test a permanent outage.
    if !engine.is_running() {
        notes.push(
            "the engine was down at the end of the timeline; drill restarted it to drain"
                .to_string(),
        );
        engine.spawn().await?;
    }

    // Drain: until the engine says nothing waits, or the drain timeout.
    let workload_done = t0.elapsed();
    say(&format!(
        "  {:>4}s  workload done; draining (up to {:?})",
        workload_done.as_secs(),
        plan.drain_timeout
    ));
    let drain_deadline = Instant::now() + plan.drain_timeout;
    let mut last_stats: Option<Stats> = None;
    loop {
        if let Ok(stats) = engine.stats().await {
            let idle = stats.waiting == 0 && stats.outputs.iter().all(|o| o.in_flight == 0);
            last_stats = Some(stats);
            if idle {
                break;
            }
        }
        if Instant::now() > drain_deadline {
            notes.push(format!("drain timed out after {:?}", plan.drain_timeout));
            break;
        }
        tokio::select! {
            _ = cancel.cancelled() => {
                engine.kill().await;
                teardown(&mut broker, &mut cluster, &mut containers, &links).await;
                return Err(RunError::Interrupted);
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    // Let the reader catch up: until its count has been still for 1.5 s (at most 20 s).
    let settle_deadline = Instant::now() + Duration::from_secs(20);
    let mut count = reader.count().await;
    let mut still_since = Instant::now();
    while count.is_some()
        && Instant::now() < settle_deadline
        && still_since.elapsed() < Duration::from_millis(1500)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = reader.count().await;
        if now != count {
            count = now;
            still_since = Instant::now();
        }
    }
    if cancel.is_cancelled() {
        engine.kill().await;
        teardown(&mut broker, &mut cluster, &mut containers, &links).await;
        return Err(RunError::Interrupted);
    }
    let final_stats = engine.stats().await.ok().or(last_stats);
    let attempts_log = engine.data_dir().join("attempts.jsonl");
    let possibly_sent_keys = possibly_sent_keys(&attempts_log);
    engine.stop(Duration::from_secs(10)).await;
    if matches!(reader, ReadBack::Topic { .. }) && link.status().fault != "pass" {
        // The Kafka reader goes where the broker's metadata points: the proxy. The engine is
        // stopped now, so healing the link changes no delivery, only lets the reader in.
        link.apply_settled(Fault::Heal, Direction::Both).await;
        notes.push("the link was still faulted at the end; drill healed it (after stopping the engine) to read the topic back".to_string());
    }
    if let Some(c) = containers.first() {
        reader.point_at(vec![c.addr]);
    }
    let received = reader.stop().await;
    reader_cancel.cancel();
    let link_status = link.status();
    teardown(&mut broker, &mut cluster, &mut containers, &links).await;

    let sent = match Arc::try_unwrap(sent) {
        Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
        Err(shared) => {
            let s = shared.lock().map(|s| Sent {
                order: s.order.clone(),
            });
            s.unwrap_or_default()
        }
    };
    let reconciliation = verify::reconcile(&sent, &received);
    let crash_keys: HashSet<String> = match crashes.first() {
        Some(first) => sent
            .accepted()
            .filter(|(_, _, at)| at <= crashes.last().unwrap_or(first))
            .map(|(_, k, _)| k.to_string())
            .collect(),
        None => HashSet::new(),
    };
    // `effectively_once` allows no extra copy at all; `at_least_once` one with the write key.
    let allowed = match plan.engine.promise {
        crate::scenario::Promise::EffectivelyOnce => 0,
        _ => report::allowed_duplicates(&sent, &received, &possibly_sent_keys, &crash_keys),
    };
    let recovery = report::recovery(&faults, &sent, &received);

    let mut versions = BTreeMap::new();
    versions.insert("drill".to_string(), env!("CARGO_PKG_VERSION").to_string());
    versions.insert("broker".to_string(), broker.version.clone());
    versions.insert("runtime".to_string(), broker.runtime.to_string());
    if let Some(note) = &broker.note {
        notes.push(note.clone());
    }
    if let Some(f) = &received.verifier_fault {
        notes.push(format!(
            "verifier fault: {f} — read-back counts may be low; this is not engine loss"
        ));
    }
    Ok(Facts {
        plan: plan.clone(),
        seed,
        runtime: broker.runtime.to_string(),
        reconciliation,
        allowed_duplicates: allowed,
        engine: final_stats,
        faults,
        recovery,
        link: link_status,
        versions,
        notes,
        verifier_fault: received.verifier_fault.is_some(),
        duration_ms: ms(t0.elapsed()),
    })
}

/// Where the broker runs: `Some((engine, image, image id))` for a container, `None` for a
/// local process (or the embedded MQTT broker). `auto` takes a container when a Docker engine
/// answers and the image is present or can be pulled, and says in one line why not otherwise.
async fn place(
    kind: DestinationKind,
    runtime: RuntimeChoice,
    notes: &mut Vec<String>,
) -> Result<Option<(container::Docker, String, String)>, RunError> {
    let local = match kind {
        DestinationKind::Mqtt => "local mosquitto (or the embedded broker)",
        DestinationKind::Nats => "local nats-server",
        DestinationKind::Kafka => "local tansu",
    };
    match runtime {
        RuntimeChoice::Process | RuntimeChoice::Embedded => Ok(None),
        RuntimeChoice::Container => {
            let docker = container::daemon().await.map_err(|why| {
                brokers::BrokerError::ContainerUnavailable(format!(
                    "{why}; start Docker (or set DOCKER_HOST), or use --runtime process"
                ))
            })?;
            let image = container::image_for(kind);
            let id = container::ensure_image(&docker, &image).await.map_err(|why| {
                brokers::BrokerError::ContainerUnavailable(format!(
                    "{why}; pull it, set DRILL_IMAGE_{} to an image you have, or use --runtime process",
                    kind.name().to_uppercase()
                ))
            })?;
            Ok(Some((docker, image, id)))
        }
        RuntimeChoice::Auto => {
            let why = match container::daemon().await {
                Ok(docker) => {
                    let image = container::image_for(kind);
                    match container::ensure_image(&docker, &image).await {
                        Ok(id) => return Ok(Some((docker, image, id))),
                        Err(why) => why,
                    }
                }
                Err(why) => why,
            };
            notes.push(format!("{why}: using {local}"));
            Ok(None)
        }
    }
}

/// The report's view of a broker in a container.
fn container_broker(c: &container::ContainerBroker) -> brokers::Broker {
    let short: String = c
        .image_id
        .trim_start_matches("sha256:")
        .chars()
        .take(12)
        .collect();
    brokers::Broker::without_process(c.addr, "container", format!("{} (image {short})", c.image))
}

/// Which node of `cluster` leads the drill's stream now (asked of every live node).
async fn stream_leader_node(cluster: &[brokers::NatsNode]) -> Option<usize> {
    for node in cluster {
        if let Some(leader) = brokers::stream_leader(node.addr, STREAM).await {
            return cluster.iter().position(|n| n.name == leader);
        }
    }
    None
}

/// Stops every broker process and proxy link a drill started.
async fn teardown(
    broker: &mut brokers::Broker,
    cluster: &mut [brokers::NatsNode],
    containers: &mut [container::ContainerBroker],
    links: &[Link],
) {
    for l in links {
        l.shutdown().await;
    }
    for c in containers.iter_mut() {
        c.remove().await;
    }
    for node in cluster.iter_mut() {
        node.halt(false).await;
    }
    broker.stop().await;
}

/// Write keys that had an attempt end `possibly_sent` (from the engine's attempt journal).
fn possibly_sent_keys(path: &Path) -> HashSet<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("outcome").and_then(|o| o.as_str()) == Some("possibly_sent"))
        .filter_map(|v| v.get("key").and_then(|k| k.as_str()).map(str::to_string))
        .collect()
}
