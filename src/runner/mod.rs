//! One drill, start to finish: provision the broker and the proxy link, start the reader and
//! the system under test, play the workload and the fault timeline, drain, read back, judge.
//!
//! The runner owns the clock of a drill (`t0`) and every child it starts; when [`run`] returns —
//! normally, with an error, or because the caller's token was cancelled — the engine process,
//! the broker and the proxy are stopped. It never judges: it collects facts and hands them to
//! [`verdict`](crate::report::judge).

mod drain;
mod external;
mod play;
pub mod progress;
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
use crate::powerfs::PowerFs;
use crate::proxy::Link;
use crate::report::{self, Facts};
use crate::scenario::WriteKeyPlace;
use crate::scenario::{DestinationKind, Plan, RuntimeChoice};
use crate::sut::command::Placement;
use crate::sut::{CommandEngine, EngineProcess, System};
use crate::verify::{self, Decoder, ReadBack, Reader};
use crate::workload::Ingested;
use play::{Drill, Played};
use provision::Rig;

/// The JetStream stream a NATS drill writes to.
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
    /// The engine's data directory could not be put on drill's power-cut filesystem.
    #[error("{0}")]
    Disk(String),
    /// An external broker could not be reached or used as the scenario says.
    #[error("external broker: {0}")]
    External(String),
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
    progress::say(line);
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
    let disk = mount_data_dir(plan, &work)?;
    let mut rig = match Rig::provision(plan, runtime, &work, &run_id, seed, &cancel).await {
        Ok(rig) => rig,
        Err(e) => {
            if let Some(fs) = disk {
                fs.unmount();
            }
            return Err(e);
        }
    };
    let outcome = match start_system(plan, options, &rig, &work, &run_id).await {
        Ok(mut system) => {
            let outcome = drive(
                plan,
                &mut rig,
                &mut system,
                disk.as_ref(),
                &run_id,
                seed,
                &cancel,
            )
            .await;
            system.kill().await;
            outcome
        }
        Err(e) => Err(e),
    };
    if let Some(fs) = disk {
        fs.unmount();
    }
    rig.teardown().await;
    outcome
}

/// With a `power_cut` or `fill_disk` fault, the engine's data directory (`work/engine-data`)
/// is drill's power-cut filesystem over `work/engine-data.disk`. Without FUSE that is an
/// infrastructure failure (exit 3), never a drill that silently cuts nothing.
fn mount_data_dir(plan: &Plan, work: &Path) -> Result<Option<PowerFs>, RunError> {
    if !plan.needs_powerfs() {
        return Ok(None);
    }
    let (backing, data) = (work.join("engine-data.disk"), work.join("engine-data"));
    for dir in [&backing, &data] {
        std::fs::create_dir_all(dir).map_err(|source| RunError::Io {
            path: dir.clone(),
            source,
        })?;
    }
    #[cfg(feature = "test-hooks")]
    if std::env::var_os("DRILL_TEST_NO_FUSE").is_some() {
        return Err(RunError::Disk(
            "a power_cut or fill_disk fault needs the engine's data directory on drill's power-cut filesystem (FUSE), and it could not be mounted: /dev/fuse is missing (DRILL_TEST_NO_FUSE)".to_string(),
        ));
    }
    let fs = PowerFs::mount(&backing, &data).map_err(|why| {
        RunError::Disk(format!(
            "a power_cut or fill_disk fault needs the engine's data directory on drill's power-cut filesystem (FUSE), and it could not be mounted: {why}"
        ))
    })?;
    say(&format!(
        "  engine data: {} (power-cut filesystem over {})",
        data.display(),
        backing.display()
    ));
    Ok(Some(fs))
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
    run_id: &str,
) -> Result<System, RunError> {
    let io = |source| RunError::Io {
        path: work.to_path_buf(),
        source,
    };
    let engine_port = brokers::free_port().map_err(io)?;
    if let Some(spec) = &plan.command {
        let ingest = SocketAddr::from(([127, 0, 0, 1], engine_port));
        let data_dir = work.join("engine-data");
        std::fs::create_dir_all(&data_dir).map_err(io)?;
        let mut ports = BTreeMap::new();
        let mut taken = HashSet::from([engine_port]);
        for name in &spec.ports {
            let mut port = brokers::free_port().map_err(io)?;
            while !taken.insert(port) {
                port = brokers::free_port().map_err(io)?;
            }
            ports.insert(name.clone(), port);
        }
        let mut values: BTreeMap<String, String> = BTreeMap::new();
        let mut set = |k: &str, v: String| {
            values.insert(k.to_string(), v);
        };
        set("ingest", ingest.to_string());
        set("ingest.host", ingest.ip().to_string());
        set("ingest.port", ingest.port().to_string());
        set("topic", plan.destination.topic.clone());
        set("data_dir", data_dir.display().to_string());
        set("work_dir", work.display().to_string());
        set(
            "scenario_dir",
            crate::scenario::command::scenario_dir(&plan.source)
                .display()
                .to_string(),
        );
        set("run", run_id.to_string());
        for l in &rig.links {
            let a = l.listen_addr();
            set(&format!("link.{}", l.name()), a.to_string());
            set(&format!("link.{}.host", l.name()), a.ip().to_string());
            set(&format!("link.{}.port", l.name()), a.port().to_string());
        }
        for (name, port) in &ports {
            set(&format!("port.{name}"), port.to_string());
        }
        let log_path = work.parent().unwrap_or(work).join("engine.log");
        let _ = std::fs::remove_file(&log_path);
        let engine = CommandEngine::start(
            spec,
            Placement {
                values: &values,
                ports: &ports,
                ingest,
                work_dir: work,
                data_dir: &data_dir,
                log_path,
                drill_exe: &options.engine_exe,
            },
        )
        .await?;
        let system = System::Command(Box::new(engine));
        say(&format!("  engine: {}", system.describe()));
        return Ok(system);
    }
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
            credentials: plan
                .destination
                .external
                .as_ref()
                .map(|e| e.credentials.clone())
                .unwrap_or_default(),
            ..OutputConfig::mqtt(
                plan.destination.link_name(),
                rig.link.listen_addr(),
                &plan.destination.topic,
            )
        }],
        disk: Default::default(),
    };
    let system = System::Builtin(Box::new(
        EngineProcess::start(&options.engine_exe, config, work).await?,
    ));
    say(&format!("  engine: {}", system.describe()));
    Ok(system)
}

/// The reader, subscribed (or ready to read) before the first record is sent. It reads from
/// the broker directly, never through the proxy.
async fn start_reader(
    plan: &Plan,
    rig: &Rig,
    run_id: &str,
    t0: Instant,
    t0_wall: std::time::SystemTime,
    cancel: CancellationToken,
) -> Result<ReadBack, RunError> {
    // Where the write key is: drill's engine puts it in the protocol's place; a user's
    // engine where its scenario says, or nowhere.
    let write_key = match &plan.command {
        Some(spec) => spec.write_key.clone(),
        None => Some(match plan.destination.kind {
            DestinationKind::Nats => WriteKeyPlace::NatsMsgId,
            DestinationKind::Kafka => WriteKeyPlace::KafkaHeader("write-key".to_string()),
            DestinationKind::Mqtt => {
                WriteKeyPlace::MqttUserProperty(crate::mqtt::WRITE_KEY_PROPERTY.to_string())
            }
        }),
    };
    let decoder = Decoder::new(run_id, write_key);
    // An external broker: its credentials, and where this drill's records begin.
    let access = rig
        .external
        .as_ref()
        .map(|e| e.access.clone())
        .unwrap_or_default();
    Ok(match plan.destination.kind {
        DestinationKind::Nats => ReadBack::stream(
            rig.broker_addrs(),
            &plan.destination.stream,
            t0_wall,
            decoder,
            access,
        )
        .await
        .map_err(RunError::Verifier)?,
        DestinationKind::Kafka => ReadBack::Topic {
            bootstrap: rig.broker_addrs()[0],
            topic: plan.destination.topic.clone(),
            t0: t0_wall,
            decoder,
            access,
        },
        DestinationKind::Mqtt => ReadBack::Mqtt(
            Reader::start_as(
                rig.broker.addr,
                &plan.destination.topic,
                decoder,
                t0,
                cancel,
                crate::brokers::mqtt_login(&access.secrets),
            )
            .await?,
        ),
    })
}

/// Everything after provisioning and start-up: reader, play, drain, read back, facts.
async fn drive(
    plan: &Plan,
    rig: &mut Rig,
    system: &mut System,
    disk: Option<&PowerFs>,
    run_id: &str,
    seed: u64,
    cancel: &CancellationToken,
) -> Result<Facts, RunError> {
    let t0 = Instant::now();
    let t0_wall = std::time::SystemTime::now();
    let reader_cancel = cancel.child_token();
    let mut reader = start_reader(plan, rig, run_id, t0, t0_wall, reader_cancel.clone()).await?;
    let sent = Arc::new(Mutex::new(Sent::default()));
    let workload_cancel = cancel.child_token();
    let ingest = system
        .ingest(plan.command.as_ref().map(|c| &c.ingest), run_id)
        .map_err(RunError::Verifier)?;
    let ingest_meaning = ingest.meaning();
    let workload = tokio::spawn(workload::drive(
        plan.workload.clone(),
        run_id.to_string(),
        seed,
        ingest,
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

    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = tokio::spawn(sample(
        system.account_source(),
        sent.clone(),
        t0,
        samples.clone(),
    ));

    let steps = timeline::timeline(plan);
    progress::start(plan.workload.total_records());
    let mut drill = Drill::new(rig, system, disk, t0);
    let played = play::play(&mut drill, &steps, workload, &sent, &reader, cancel).await;
    if played.is_err() || cancel.is_cancelled() {
        progress::finish();
    }
    workload_cancel.cancel();
    let Drill {
        rig,
        system,
        faults,
        crashes,
        power_cuts,
        notes: mut drill_notes,
        ..
    } = drill;
    #[cfg(feature = "test-hooks")]
    if std::env::var_os("DRILL_TEST_PANIC_AFTER_PLAY").is_some() {
        panic!("DRILL_TEST_PANIC_AFTER_PLAY: a panic inside the runner, on purpose");
    }
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
    let drain_started = t0.elapsed();
    let final_stats = drain::drain(system, &reader, plan.drain_timeout, &mut notes, cancel).await?;
    let drain_ms = ms(t0.elapsed().saturating_sub(drain_started));
    sampler.abort();
    let _ = sampler.await;
    progress::finish();
    let possibly_sent_keys = system.possibly_sent_keys();
    let gives_account = system.gives_account();
    if !gives_account {
        notes.push("the engine gives no account (no `stats` in the scenario): waiting and failed are unknown; everything held and not delivered after the drain counts as lost".to_string());
    }
    if !system.sees_attempts() {
        notes.push("drill sees no attempts of a user's engine: an extra copy is within at_least_once when it carries the original's write key and its record was accepted before a fault ended (a link, broker or engine fault)".to_string());
    }
    system.stop(Duration::from_secs(10)).await;
    if let Some(c) = rig.containers.first() {
        reader.point_at(vec![c.addr]);
    }
    let received = reader.stop().await;
    reader_cancel.cancel();
    let link_status = rig.link.family_status();

    let mut sent = match Arc::try_unwrap(sent) {
        Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
        Err(shared) => {
            let s = shared.lock().map(|s| Sent {
                order: s.order.clone(),
            });
            s.unwrap_or_default()
        }
    };
    if let Some(meaning) = ingest_meaning {
        notes.push(meaning.to_string());
        let moved = unacknowledged_before_crashes(&mut sent, &crashes);
        if moved > 0 {
            notes.push(format!("{moved} records written to the engine's socket within a second of it being killed or stopped count as ingests with a lost answer (the protocol cannot tell whether the engine read them)"));
        }
    }
    let reconciliation = verify::reconcile(&sent, &received);
    let series = series(
        &samples.lock().map(|s| s.clone()).unwrap_or_default(),
        &received,
    );
    let excuses = excuses(
        &sent,
        &received,
        possibly_sent_keys.as_ref(),
        Crashes {
            all: &crashes,
            power_cuts: &power_cuts,
        },
        &faults,
    );
    let allowance = report::oracle::allowance(plan.engine.promise, &sent, &received, &excuses);
    let end_ms = ms(t0.elapsed());
    let mut inconclusive = report::oracle::unbitten(&faults, &sent, &received, end_ms);
    // Bypass is judged where arrival times are the destination's own (Kafka's are the
    // producer's) and where one link is the only way to the broker.
    if plan.destination.kind != DestinationKind::Kafka && rig.links.len() == 1 {
        inconclusive.extend(report::oracle::bypassed(&faults, &received, end_ms));
    }
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
        allowance,
        inconclusive,
        drain_ms,
        engine: final_stats,
        gives_account,
        system: system.describe(),
        unexpected_examples: received.unexpected_examples.clone(),
        series,
        faults,
        recovery,
        link: link_status,
        versions,
        notes,
        verifier_fault: received.verifier_fault.is_some(),
        duration_ms: ms(t0.elapsed()),
    })
}

/// Records the promise may excuse (ids): writes with a `possibly_sent` attempt (from the
/// built-in engine's journal; for a user's engine, whose attempts drill cannot see, records
/// accepted before the end of a link or broker fault stand in), and records accepted before an
/// engine crash.
fn excuses<'a>(
    sent: &'a Sent,
    received: &verify::Received,
    possibly_sent: Option<&HashSet<String>>,
    crashes: Crashes<'_>,
    faults: &[report::FaultRecord],
) -> report::oracle::Excuses<'a> {
    let last_fault_end = match possibly_sent {
        Some(_) => None,
        None => faults
            .iter()
            .filter(|f| f.target.starts_with("link") || f.target.starts_with("broker"))
            .map(|f| Duration::from_millis(f.until_ms.unwrap_or(u64::MAX)))
            .max(),
    };
    let mut first: std::collections::HashMap<&str, Duration> = std::collections::HashMap::new();
    for a in &received.arrivals {
        if let Some(id) = a.id.as_deref() {
            first.entry(id).or_insert(a.at);
        }
    }
    let mut e = report::oracle::Excuses::default();
    for (r, key, at) in sent.accepted() {
        if last_fault_end.is_some_and(|end| at <= end)
            || possibly_sent
                .zip(key)
                .is_some_and(|(keys, k)| keys.contains(k))
        {
            e.possibly_sent.insert(r.id.as_str());
        }
        let arrived = first.get(r.id.as_str()).copied();
        if crashes.excuse(at, arrived) {
            e.crashed.insert(r.id.as_str());
        }
    }
    e
}

/// How long before a SIGKILL or SIGTERM the destination's confirmation of a record must have
/// come for the engine to be expected to have noted it: a record first delivered earlier than
/// this before a kill, sent again after it, is a duplicate the crash does not excuse (an
/// engine that forgets its delivery marks on restart). A power cut excuses every record
/// accepted before it: unsynced marks are lost with it.
const NOTED_WITHIN: Duration = Duration::from_secs(5);

/// The drill's engine crashes (kill, stop, power cut), and which were power cuts.
#[derive(Clone, Copy)]
struct Crashes<'a> {
    all: &'a [Duration],
    power_cuts: &'a [Duration],
}

impl Crashes<'_> {
    /// Whether a crash excuses a second copy of a record accepted at `at` and first delivered
    /// at `arrived`: it was accepted before the crash, and the crash could have left its
    /// delivery unnoted.
    fn excuse(&self, at: Duration, arrived: Option<Duration>) -> bool {
        self.all.iter().any(|c| {
            at <= *c
                && (self.power_cuts.contains(c) || arrived.is_none_or(|d| d + NOTED_WITHIN > *c))
        })
    }
}

/// `tcp_lines` has no acknowledgement: records written in the second before an engine was
/// killed or stopped may still have been in its socket buffer, and those written while it was
/// dying (the signal is sent at the fault's instant; the socket closes a little later) may
/// have landed in a socket nobody reads: their fate is unknown.
fn unacknowledged_before_crashes(sent: &mut Sent, crashes: &[Duration]) -> u64 {
    let mut moved = 0;
    for (_, ingested) in sent.order.iter_mut() {
        if let Ingested::Accepted { at, .. } = ingested {
            let at = *at;
            if crashes
                .iter()
                .any(|c| at + Duration::from_secs(1) > *c && at < *c + Duration::from_secs(1))
            {
                *ingested = Ingested::Unknown { at };
                moved += 1;
            }
        }
    }
    moved
}

/// One sample: (ms since the start, records accepted so far, the engine's backlog).
type Sample = (u64, u64, Option<u64>);

/// Once a second from the drill's start: records accepted so far and the engine's backlog.
/// Runs beside the timeline, so a slow or frozen engine never delays a fault.
async fn sample(
    source: crate::sut::AccountSource,
    sent: Arc<Mutex<Sent>>,
    t0: Instant,
    into: Arc<Mutex<Vec<Sample>>>,
) {
    let http = reqwest::Client::new();
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::from_std(t0), Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let at = tick.tick().await;
        let at_ms = ms(at.into_std().saturating_duration_since(t0));
        let waiting = tokio::time::timeout(Duration::from_millis(900), source.fetch(&http))
            .await
            .ok()
            .flatten()
            .map(|a| a.waiting);
        let accepted = sent
            .lock()
            .map(|s| s.accepted().count() as u64)
            .unwrap_or(0);
        if let Ok(mut v) = into.lock() {
            v.push((at_ms, accepted, waiting));
        }
    }
}

/// The chart's points: each sample, with the first copies that arrived in its second.
fn series(samples: &[Sample], received: &verify::Received) -> Vec<report::SeriesPoint> {
    let mut first: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for a in &received.arrivals {
        if let Some(id) = a.id.as_deref() {
            first.entry(id).or_insert(ms(a.at));
        }
    }
    let mut per_second: BTreeMap<u64, u64> = BTreeMap::new();
    for at in first.values() {
        *per_second.entry(at / 1000).or_default() += 1;
    }
    samples
        .iter()
        .map(|&(at_ms, accepted, waiting)| report::SeriesPoint {
            at_ms,
            accepted,
            delivered: per_second.get(&(at_ms / 1000)).copied().unwrap_or(0),
            waiting,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_excuses_copies_of_what_it_could_have_left_unnoted_a_power_cut_everything_before_it() {
        let s = Duration::from_secs;
        let kill = Crashes {
            all: &[s(20)],
            power_cuts: &[],
        };
        // Accepted after the crash: nothing to excuse.
        assert!(!kill.excuse(s(21), None));
        // Never delivered before it, or confirmed within 5 s of it: the crash may have lost
        // the answer or the mark.
        assert!(kill.excuse(s(10), None));
        assert!(kill.excuse(s(10), Some(s(16))));
        // Confirmed 10 s before a SIGKILL: sending it again is forgetting, not crashing.
        assert!(!kill.excuse(s(5), Some(s(10))));
        let cut = Crashes {
            all: &[s(20)],
            power_cuts: &[s(20)],
        };
        assert!(cut.excuse(s(5), Some(s(10))));
    }
}
