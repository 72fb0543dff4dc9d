//! One drill, start to finish: provision the broker and the proxy link, start the reader and
//! the system under test, play the workload and the fault timeline, drain, read back, judge.
//!
//! The runner owns the clock of a drill (`t0`) and every child it starts; when [`run`] returns —
//! normally, with an error, or because the caller's token was cancelled — the engine process,
//! the broker and the proxy are stopped. It never judges: it collects [`Facts`] (the fault log
//! typed in [`events`]) and the caller hands them to `report::judge`.

mod drain;
pub mod events;
mod facts;
mod play;
pub mod progress;
mod provision;
mod stack;
mod system;
mod timeline;

pub use facts::{Facts, Sample, Tapped};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::dest::{self, ReadBack, ReaderSpec, Runtime};
use crate::powerfs::PowerFs;
use crate::scenario::Plan;
use crate::source::{FileSource, KafkaSource, OutboxSource, Source};
use crate::sut::{Ingest, System};
use crate::verify::{Decoder, Received};
use crate::workload::{self, Ingested, Sent};
use events::{FaultRecord, FaultTarget};
use play::{Drill, Played};
use provision::Rig;

/// Why a drill could not be carried out (exit code 3): not a verdict on the engine.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("broker: {0}")]
    Broker(#[from] dest::DestError),
    #[error("proxy: {0}")]
    Proxy(#[from] crate::proxy::ProxyError),
    #[error("engine: {0}")]
    Engine(#[from] crate::sut::SutError),
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
    /// A clock fault's clock could not be set up (libfaketime missing).
    #[error("{0}")]
    Clock(String),
    #[error("interrupted")]
    Interrupted,
}

/// How to run a plan.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where `<scenario name>/` with the reports goes.
    pub out: PathBuf,
    /// Overrides the scenario's runtime.
    pub runtime: Option<Runtime>,
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
    if plan.destination.external.is_some() && !matches!(runtime, Runtime::Auto | Runtime::External)
    {
        say(&format!(
            "  --runtime {runtime:?} does not apply: this scenario drills external brokers"
        ));
    }
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
    let source = match open_source(plan, &mut rig, &work, &cancel).await {
        Ok(s) => s,
        Err(e) => {
            rig.teardown().await;
            if let Some(fs) = disk {
                fs.unmount();
            }
            return Err(e);
        }
    };
    let outcome = match system::start_system(plan, options, &rig, &work, &run_id).await {
        Ok(mut system) => {
            let outcome = drive(
                plan,
                &mut rig,
                Under {
                    system: &mut system,
                    disk: disk.as_ref(),
                    source: source.as_ref(),
                },
                &run_id,
                seed,
                &cancel,
            )
            .await;
            system.kill().await;
            system.release().await;
            outcome
        }
        Err(e) => Err(e),
    };
    if let Some(fs) = disk {
        fs.unmount();
    }
    rig.teardown().await;
    if let Some(s) = &source {
        s.stop().await;
    }
    outcome
}

/// With a `power_cut` or `fill_disk` fault, the engine's data directory (`work/engine-data`)
/// is drill's power-cut filesystem over `work/engine-data.disk`. Without FUSE that is an
/// infrastructure failure (exit 3), never a drill that silently cuts nothing.
fn mount_data_dir(plan: &Plan, work: &Path) -> Result<Option<PowerFs>, RunError> {
    // An engine on an agent's host has its data directory there, on the agent's filesystem.
    if !plan.needs_powerfs() || plan.agent.is_some() {
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
    if let Some(model) = plan.dirents() {
        fs.track_dirents(model).map_err(RunError::Disk)?;
    }
    say(&format!(
        "  engine data: {} (power-cut filesystem over {})",
        data.display(),
        backing.display()
    ));
    Ok(Some(fs))
}

/// `DIR/work`, emptied, as an absolute path: brokers and engines run with folders of their
/// own as their working directory (rsyslog refused a relative one, error -3000, under
/// `drill run --out reports/x`).
fn fresh_work_dir(dir: &Path) -> Result<PathBuf, RunError> {
    let work = std::path::absolute(dir.join("work")).unwrap_or_else(|_| dir.join("work"));
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

/// The reader, subscribed (or ready to read) before the first record is sent. It reads from
/// the broker directly, never through the proxy.
async fn start_reader(
    plan: &Plan,
    rig: &Rig,
    run_id: &str,
    t0: Instant,
    t0_wall: SystemTime,
    cancel: CancellationToken,
) -> Result<Box<dyn ReadBack>, RunError> {
    // Where the write key is: drill's engine puts it in the protocol's place; a user's
    // engine where its scenario says, or nowhere.
    let write_key = match &plan.command {
        Some(spec) => spec.write_key.clone(),
        None => Some(plan.destination.imp.builtin_write_key()),
    };
    let spec = ReaderSpec {
        topic: plan.destination.topic.clone(),
        decoder: Decoder::new(run_id, write_key),
        t0,
        t0_wall,
        cancel,
    };
    Ok(rig.running.reader(spec).await?)
}

/// The source the engine reads from, made before the engine starts: the file drill writes, the
/// Kafka topic or the outbox table (its server, and the link `source` the rig keeps with its
/// own).
async fn open_source(
    plan: &Plan,
    rig: &mut Rig,
    work: &Path,
    cancel: &CancellationToken,
) -> Result<Option<Source>, RunError> {
    if let Some(spec) = plan.file_source() {
        let file = FileSource::create(work, spec).map_err(|source| RunError::Io {
            path: work.join(crate::scenario::source::SOURCE_DIR),
            source,
        })?;
        return Ok(Some(Source::File(file)));
    }
    let (source, link) = if let Some(spec) = plan.kafka_source() {
        let (s, link) = KafkaSource::start(work, spec, cancel.child_token()).await?;
        say(&format!("  {}", s.describe()));
        (Source::Kafka(s), link)
    } else if let Some(spec) = plan.outbox_source() {
        let (s, link) = OutboxSource::start(spec, cancel.child_token()).await?;
        say(&format!("  {}", s.describe()));
        (Source::Outbox(s), link)
    } else {
        return Ok(None);
    };
    say(&format!(
        "  proxy link {}: {} -> {}",
        link.name(),
        link.listen_addr(),
        link.upstream_addr()
    ));
    rig.source_link = Some(link);
    Ok(Some(source))
}

/// What the drill acts on besides the rig: the system under test, its data directory's
/// filesystem when drill cuts its power, the file it tails when it tails one.
struct Under<'a> {
    system: &'a mut System,
    disk: Option<&'a PowerFs>,
    source: Option<&'a Source>,
}

/// Everything after provisioning and start-up: reader, play, drain, read back, facts.
async fn drive(
    plan: &Plan,
    rig: &mut Rig,
    under: Under<'_>,
    run_id: &str,
    seed: u64,
    cancel: &CancellationToken,
) -> Result<Facts, RunError> {
    let Under {
        system,
        disk,
        source,
    } = under;
    let t0 = Instant::now();
    let reader_cancel = cancel.child_token();
    let reader = start_reader(
        plan,
        rig,
        run_id,
        t0,
        SystemTime::now(),
        reader_cancel.clone(),
    );
    let reader = reader.await?;
    let clock = Clock { t0, seed, run_id };
    let played = play_timeline(
        plan,
        rig,
        Under {
            system: &mut *system,
            disk,
            source,
        },
        &*reader,
        clock,
        cancel,
    )
    .await?;
    let facts = finish(plan, rig, system, reader, played, clock, cancel).await;
    reader_cancel.cancel();
    facts
}

/// The drill's clock and identity.
#[derive(Clone, Copy)]
struct Clock<'a> {
    t0: Instant,
    seed: u64,
    run_id: &'a str,
}

/// What playing the workload and the timeline left behind.
struct Timeline {
    sent: Arc<Mutex<Sent>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    sampler: tokio::task::JoinHandle<()>,
    /// What the user's ingest kind means for what counts as held, when it has no answer.
    ingest_meaning: Option<&'static str>,
    /// The ingest counts a record held once a socket took it (`tcp_lines`): one taken just
    /// before a crash may never have been read.
    unanswered_socket: bool,
    faults: Vec<FaultRecord>,
    crashes: Vec<Duration>,
    power_cuts: Vec<Duration>,
    notes: Vec<String>,
    /// The source the engine reads from, when it reads from one.
    source: Option<Source>,
}

/// Plays the workload into the system and the fault timeline against it, side by side, with
/// a sample of the engine's backlog every second.
async fn play_timeline(
    plan: &Plan,
    rig: &mut Rig,
    under: Under<'_>,
    reader: &dyn ReadBack,
    clock: Clock<'_>,
    cancel: &CancellationToken,
) -> Result<Timeline, RunError> {
    let Under {
        system,
        disk,
        source: read_from,
    } = under;
    let Clock { t0, seed, run_id } = clock;
    let sent = Arc::new(Mutex::new(Sent::default()));
    let workload_cancel = cancel.child_token();
    let ingest = match read_from {
        Some(Source::File(s)) => Ingest::File(s.clone()),
        Some(Source::Kafka(s)) => Ingest::Kafka(s.clone()),
        Some(Source::Outbox(s)) => Ingest::Outbox(s.clone()),
        None => system
            .ingest(plan.command.as_ref().map(|c| &c.ingest), run_id)
            .map_err(RunError::Verifier)?,
    };
    let ingest_meaning = ingest.meaning();
    let unanswered_socket = ingest.held_by_the_socket();
    let workload = tokio::spawn(workload::drive(
        plan.workload.clone(),
        run_id.to_string(),
        seed,
        ingest,
        t0,
        sent.clone(),
        workload_cancel.clone(),
    ));
    let w = &plan.workload;
    say(&format!(
        "  workload: {} records at {}/s over {:?}, {} keys, seed {seed}",
        w.total_records(),
        w.rate_per_s,
        w.duration,
        w.keys
    ));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let account = system.account_source();
    let sampler = tokio::spawn(sample(
        account,
        read_from.cloned(),
        sent.clone(),
        t0,
        samples.clone(),
    ));
    let steps = timeline::timeline(plan);
    progress::start(w.total_records());
    let mut drill = Drill::new(rig, system, disk, t0);
    drill.source = read_from.and_then(Source::file).cloned();
    let played = play::play(&mut drill, &steps, workload, &sent, reader, cancel).await;
    drill.account_disk_errors();
    if played.is_err() || cancel.is_cancelled() {
        progress::finish();
    }
    workload_cancel.cancel();
    #[cfg(feature = "test-hooks")]
    if std::env::var_os("DRILL_TEST_PANIC_AFTER_PLAY").is_some() {
        panic!("DRILL_TEST_PANIC_AFTER_PLAY: a panic inside the runner, on purpose");
    }
    // An interrupted drill never gets a verdict.
    if matches!(played?, Played::Interrupted) || cancel.is_cancelled() {
        return Err(RunError::Interrupted);
    }
    Ok(Timeline {
        sent,
        samples,
        sampler,
        ingest_meaning,
        unanswered_socket,
        faults: drill.faults,
        crashes: drill.crashes,
        power_cuts: drill.power_cuts,
        notes: drill.notes,
        source: read_from.cloned(),
    })
}

/// Drains, stops the system, reads back, and gathers the facts.
async fn finish(
    plan: &Plan,
    rig: &mut Rig,
    system: &mut System,
    reader: Box<dyn ReadBack>,
    played: Timeline,
    clock: Clock<'_>,
    cancel: &CancellationToken,
) -> Result<Facts, RunError> {
    let t0 = clock.t0;
    let mut notes = std::mem::take(&mut rig.notes);
    notes.extend(played.notes);
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
    let final_stats = drain::drain(
        system,
        &*reader,
        plan.drain_timeout,
        &mut notes,
        played.source.as_ref(),
        cancel,
    )
    .await?;
    let drain_end_ms = ms(t0.elapsed());
    let drain_ms = drain_end_ms.saturating_sub(ms(drain_started));
    played.sampler.abort();
    let _ = played.sampler.await;
    progress::finish();
    let journal = system.journal();
    let gives_account = system.gives_account();
    notes.extend(account_notes(gives_account, system.sees_attempts()));
    let checkpoint_stats = checkpoint_stats(plan, system).await;
    let failed_ids = failed_ids(system, clock.run_id).await;
    system.stop(Duration::from_secs(10)).await;
    let engine_log = system.log_tail();
    let received = reader.finish(rig.running.addrs.clone()).await;
    let mut sent = take_sent(played.sent);
    notes.extend(played.ingest_meaning.map(str::to_string));
    if played.unanswered_socket {
        let moved = unacknowledged_before_crashes(&mut sent, &played.crashes);
        if moved > 0 {
            notes.push(format!("{moved} records written to the engine's socket within a second of it being killed or stopped count as ingests with a lost answer (the protocol cannot tell whether the engine read them)"));
        }
    }
    let end_ms = ms(t0.elapsed());
    if let Some(r) = &rig.remote {
        // Anything still in force is healed now; the counters read after it are the link's last.
        r.close().await;
        let _ = r.refresh().await;
        notes.push(r.summary());
    }
    let running = &rig.running;
    let versions = versions(running);
    let idle_links = idle_links(&played.faults, rig);
    let tapped = rig.tapped(t0);
    let source = match &played.source {
        Some(s) => Some(s.facts(plan, system.data_dir(), checkpoint_stats).await),
        None => None,
    };
    if let Some(s) = &source {
        sent.destroyed = s.account.destroyed.iter().cloned().collect();
    }
    let mut received = received;
    if received.overlapping_keys.is_none() {
        received.overlapping_keys = tapped_overlaps(tapped.as_ref(), &sent);
    }
    Ok(Facts {
        plan: plan.clone(),
        seed: clock.seed,
        runtime: running.runtime.to_string(),
        sent,
        received,
        journal_attempts: journal.as_ref().map(|j| j.attempts),
        sent_unconfirmed_keys: journal.as_ref().map(|j| j.sent_unconfirmed_keys.clone()),
        possibly_sent_keys: journal.map(|j| j.possibly_sent_keys),
        crashes: played.crashes,
        power_cuts: played.power_cuts,
        faults: played.faults,
        samples: played.samples.lock().map(|s| s.clone()).unwrap_or_default(),
        tapped,
        idle_links,
        // Bypass is judged where arrival times are the destination's own and where one link
        // is the only way to the broker.
        bypass_is_judged: plan.destination.imp.arrivals_timed_by_destination()
            && rig.link_count() == 1,
        drain_ms,
        drain_end_ms,
        engine: final_stats,
        failed_ids,
        gives_account,
        system: system.describe(),
        engine_log,
        link: rig.link_status(),
        versions,
        notes,
        end_ms,
        source,
        duration_ms: ms(t0.elapsed()),
    })
}

/// The ids of the records the engine lists as failed once the drain is over (drill's engine:
/// `GET /failed`), read before drill stops it; `None` where it lists none or did not answer.
async fn failed_ids(system: &System, run_id: &str) -> Option<Vec<String>> {
    let data = system.account_source().failed_data().await?;
    let decoder = Decoder::new(run_id, None);
    let mut found = Received::default();
    for line in &data {
        decoder.add(line.as_bytes(), |_| None, Duration::ZERO, &mut found);
    }
    Some(found.arrivals.into_iter().filter_map(|a| a.id).collect())
}

/// The engine's stats as they are once the drain is over, where the file source's checkpoint
/// is read from them (`checkpoint: { from: stats }`): read before drill stops the engine.
async fn checkpoint_stats(
    plan: &Plan,
    system: &System,
) -> Option<Result<serde_json::Value, String>> {
    let spec = plan.file_source()?.checkpoint.as_ref()?;
    if !spec.from_stats() {
        return None;
    }
    Some(system.account_source().json().await)
}

/// What the report must say of a system that gives no account or whose attempts drill cannot
/// see.
/// Where the links' tap pairs statements with their answers (PostgreSQL), it judges one open
/// attempt per write key: the ids it saw sent again while open, by the keys they were sent
/// with. `None` where no tap judges it.
fn tapped_overlaps(tapped: Option<&Tapped>, sent: &Sent) -> Option<Vec<String>> {
    let t = tapped.filter(|t| t.pairs_answers)?;
    let keys: std::collections::HashMap<&str, &str> = sent
        .accepted()
        .filter_map(|(r, key, _)| Some((r.id.as_str(), key?)))
        .collect();
    Some(
        t.overlapping
            .iter()
            .filter_map(|id| keys.get(id.as_str()).map(|k| k.to_string()))
            .collect(),
    )
}

/// The broker links faults were put on that nothing crossed in the whole drill.
fn idle_links(faults: &[FaultRecord], rig: &Rig) -> Vec<String> {
    let mut idle: Vec<String> = faults
        .iter()
        .filter_map(|f| match &f.target {
            FaultTarget::Link(name) if rig.carried_nothing(name) => Some(name.clone()),
            _ => None,
        })
        .collect();
    idle.dedup();
    idle
}

fn account_notes(gives_account: bool, sees_attempts: bool) -> Vec<String> {
    let mut notes = Vec::new();
    if !gives_account {
        notes.push("the engine gives no account (no `stats` in the scenario): waiting and failed are unknown; everything held and not delivered after the drain counts as lost".to_string());
    }
    if !sees_attempts {
        notes.push("drill sees no attempts of a user's engine: an extra copy is within at_least_once when it carries the original's write key and its record was accepted before a fault ended (a link, broker or engine fault)".to_string());
    }
    notes
}

/// drill's build, the broker's version and the runtime it ran on, for the report.
fn versions(running: &dest::Running) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("drill".to_string(), env!("DRILL_BUILD").to_string()),
        ("broker".to_string(), running.version.clone()),
        ("runtime".to_string(), running.runtime.to_string()),
    ])
}

/// The workload's record of what it sent, once nothing else holds it.
fn take_sent(sent: Arc<Mutex<Sent>>) -> Sent {
    match Arc::try_unwrap(sent) {
        Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
        Err(shared) => {
            let s = shared.lock().map(|s| Sent {
                destroyed: Default::default(),
                order: s.order.clone(),
            });
            s.unwrap_or_default()
        }
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

/// Once a second from the drill's start: records accepted so far and the engine's backlog.
/// Runs beside the timeline, so a slow or frozen engine never delays a fault.
async fn sample(
    source: crate::sut::AccountSource,
    read_from: Option<Source>,
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
        let unread = match &read_from {
            Some(s) => tokio::time::timeout(Duration::from_millis(900), s.unread())
                .await
                .ok()
                .flatten(),
            None => None,
        };
        let accepted = sent
            .lock()
            .map(|s| s.accepted().count() as u64)
            .unwrap_or(0);
        if let Ok(mut v) = into.lock() {
            v.push(Sample {
                at_ms,
                accepted,
                waiting,
                unread,
            });
        }
    }
}
