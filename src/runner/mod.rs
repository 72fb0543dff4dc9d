//! One drill, start to finish: provision the broker and the proxy link, start the reader and
//! the system under test, play the workload and the fault timeline, drain, read back, judge.
//!
//! The runner owns the clock of a drill (`t0`) and every child it starts; when [`run`] returns —
//! normally, with an error, or because the caller's token was cancelled — the engine process,
//! the broker and the proxy are stopped. It never judges: it collects facts and hands them to
//! [`verdict`](crate::report::judge).

mod drain;
mod play;
mod provision;
mod timeline;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::brokers;
use crate::engine::{EngineConfig, OutputConfig, OutputKind};
use crate::proxy::{Direction, Fault, Link};
use crate::report::{self, Facts};
use crate::scenario::{DestinationKind, Plan, RuntimeChoice};
use crate::sut::{EngineProcess, System};
use crate::verify::{self, ReadBack, Reader};
use play::{Drill, Played};
use provision::Rig;

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

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn say(line: &str) {
    println!("{line}");
}

/// Runs one drill, phase by phase: provision → start the system → start the reader → play the
/// workload and the timeline → drain → read back → facts. Whatever happens, everything the
/// drill started is stopped before this returns. The caller judges and writes the report.
pub async fn run(
    plan: &Plan,
    options: &Options,
    cancel: CancellationToken,
) -> Result<Facts, RunError> {
    let seed = options.seed.unwrap_or(plan.seed);
    let runtime = options.runtime.unwrap_or(plan.destination.runtime);
    let work = fresh_work_dir(&options.out.join(&plan.name))?;
    let run_id = format!("{}-{seed}", plan.name);
    say(&format!(
        "drill {}: {}",
        plan.name,
        plan.about.as_deref().unwrap_or("")
    ));
    let mut rig = Rig::provision(plan, runtime, &work, &run_id, seed, &cancel).await?;
    let outcome = match start_system(plan, options, &rig, &work).await {
        Ok(mut system) => {
            let outcome = drive(plan, &mut rig, &mut system, &run_id, seed, &cancel).await;
            system.kill().await;
            outcome
        }
        Err(e) => Err(e),
    };
    rig.teardown().await;
    outcome
}

/// `DIR/work`, emptied.
fn fresh_work_dir(dir: &Path) -> Result<PathBuf, RunError> {
    let work = dir.join("work");
    let io = |source| RunError::Io {
        path: work.clone(),
        source,
    };
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(io)?;
    }
    std::fs::create_dir_all(&work).map_err(io)?;
    Ok(work)
}

/// Starts the system under test, forwarding to the rig's link(s), and waits until it is ready.
async fn start_system(
    plan: &Plan,
    options: &Options,
    rig: &Rig,
    work: &Path,
) -> Result<System, RunError> {
    let engine_port = brokers::free_port().map_err(|source| RunError::Io {
        path: work.to_path_buf(),
        source,
    })?;
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
            more_addresses: rig.links.iter().skip(1).map(Link::listen_addr).collect(),
            ..OutputConfig::mqtt(
                plan.destination.link_name(),
                rig.link.listen_addr(),
                &plan.destination.topic,
            )
        }],
        disk: Default::default(),
    };
    let system = System::Builtin(EngineProcess::start(&options.engine_exe, config, work).await?);
    say(&format!("  engine: {}", system.describe()));
    Ok(system)
}

/// The reader, subscribed (or ready to read) before the first record is sent. It reads from
/// the broker directly, never through the proxy — except Kafka's, see [`ReadBack::Topic`].
async fn start_reader(
    plan: &Plan,
    rig: &Rig,
    t0: Instant,
    t0_wall: std::time::SystemTime,
    cancel: CancellationToken,
) -> Result<ReadBack, RunError> {
    Ok(match plan.destination.kind {
        DestinationKind::Nats => ReadBack::stream(rig.broker_addrs(), STREAM, t0_wall)
            .await
            .map_err(RunError::Verifier)?,
        DestinationKind::Kafka => ReadBack::Topic {
            bootstrap: rig.link.listen_addr(),
            topic: plan.destination.topic.clone(),
            t0: t0_wall,
        },
        DestinationKind::Mqtt => ReadBack::Mqtt(
            Reader::start(rig.broker.addr, &plan.destination.topic, t0, cancel).await?,
        ),
    })
}

/// Everything after provisioning and start-up: reader, play, drain, read back, facts.
async fn drive(
    plan: &Plan,
    rig: &mut Rig,
    system: &mut System,
    run_id: &str,
    seed: u64,
    cancel: &CancellationToken,
) -> Result<Facts, RunError> {
    let t0 = Instant::now();
    let t0_wall = std::time::SystemTime::now();
    let reader_cancel = cancel.child_token();
    let mut reader = start_reader(plan, rig, t0, t0_wall, reader_cancel.clone()).await?;
    let sent = Arc::new(Mutex::new(Sent::default()));
    let workload_cancel = cancel.child_token();
    let workload = tokio::spawn(workload::drive(
        plan.workload.clone(),
        run_id.to_string(),
        seed,
        system.ingest_addr(),
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

    let steps = timeline::timeline(plan);
    let mut drill = Drill::new(rig, system, t0);
    let played = play::play(&mut drill, &steps, workload, &sent, &reader, cancel).await;
    workload_cancel.cancel();
    let Drill {
        rig,
        system,
        faults,
        crashes,
        notes: mut drill_notes,
        ..
    } = drill;
    // An interrupted drill never gets a verdict.
    if matches!(played?, Played::Interrupted) || cancel.is_cancelled() {
        return Err(RunError::Interrupted);
    }
    let mut notes = std::mem::take(&mut rig.notes);
    notes.append(&mut drill_notes);
    // A link left faulted by the scenario stays so: a drill may test a permanent outage.
    if !system.is_running() {
        notes.push(
            "the engine was down at the end of the timeline; drill restarted it to drain"
                .to_string(),
        );
        system.start().await?;
    }

    say(&format!(
        "  {:>4}s  workload done; draining (up to {:?})",
        t0.elapsed().as_secs(),
        plan.drain_timeout
    ));
    let final_stats = drain::drain(system, &reader, plan.drain_timeout, &mut notes, cancel).await?;
    let possibly_sent_keys = system.possibly_sent_keys();
    system.stop(Duration::from_secs(10)).await;
    if matches!(reader, ReadBack::Topic { .. }) && rig.link.status().fault != "pass" {
        // The Kafka reader goes where the broker's metadata points: the proxy. The engine is
        // stopped now, so healing the link changes no delivery, only lets the reader in.
        rig.link.apply_settled(Fault::Heal, Direction::Both).await;
        notes.push("the link was still faulted at the end; drill healed it (after stopping the engine) to read the topic back".to_string());
    }
    if let Some(c) = rig.containers.first() {
        reader.point_at(vec![c.addr]);
    }
    let received = reader.stop().await;
    reader_cancel.cancel();
    let link_status = rig.link.status();

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
    let crash_keys: HashSet<String> = match crashes.last() {
        Some(last) => sent
            .accepted()
            .filter(|(_, _, at)| at <= last)
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

    let broker = &rig.broker;
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
