//! `drill agent`: a `drill proxy` that also runs one engine on its host for a drill elsewhere
//! (docs/src/design.md#2-parts, "past one machine"). It owns the engine's side of `sut::remote`:
//! the slot one drill holds under a lease, the engine's folders on this host, the power-cut
//! filesystem under its data directory, and the relays that publish the engine's loopback ports to
//! that drill.
//!
//! API beside the proxy's, behind the same token: `PUT /engine` (an [`EngineOrder`]: start it
//! and answer once ready), `POST /engine/act` (an [`EngineAct`]), `POST /engine/lease`,
//! `GET /engine` (an [`EngineState`]), `GET /engine/log`, `DELETE /engine` (stop it and give the
//! slot back). One engine at a time: an order while another drill holds the slot is a 409. The
//! order's answer names a lease; every later call carries it ([`LEASE_HEADER`]), so a drill
//! whose lease ran out can never act on the next drill's engine. Once renewals stop, the agent
//! SIGKILLs the engine's process group, gives back the disk space, unmounts the power-cut
//! filesystem and removes the run's folder: nothing a drill started outlives it.

mod relay;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::control::Ends;
use crate::powerfs::PowerFs;
use crate::process::{free_port, free_ports};
use crate::scenario::{CommandSpec, IngestSpec};
use crate::sut::command::{Placement, host_values};
use crate::sut::remote::{ActDone, EngineAct, EngineOrder, EngineSlot, EngineState, LEASE_HEADER};
use crate::sut::{CommandEngine, SutError};

/// How often the agent looks for a lease that ran out and an engine that ended by itself.
const WATCH: Duration = Duration::from_millis(100);

/// The longest lease an engine may be held under.
const LEASE_MAX: Duration = Duration::from_secs(3600);

/// The engine a drill holds here.
struct Slot {
    run: String,
    /// The lease its order was given: every call about it must carry this.
    lease: String,
    engine: CommandEngine,
    /// The power-cut filesystem under the data directory, when the order asked for one.
    disk: Option<PowerFs>,
    /// This run's folder (`engine.log`, `work/`, `engine-data/`).
    folder: PathBuf,
    /// Ends the relays when the slot goes, however it goes.
    _relays: DropGuard,
}

impl Slot {
    /// Stops the engine (SIGTERM, SIGKILL after `grace`; SIGKILL at once for zero), gives the
    /// disk space back, unmounts, removes the folder and ends the relays.
    async fn end(mut self, grace: Duration) {
        if grace.is_zero() {
            self.engine.kill().await;
        } else {
            self.engine.stop(grace).await;
        }
        let (disk, folder) = (self.disk.take(), self.folder.clone());
        // Unmounting waits for the kernel, removing walks the disk: off the control thread.
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(disk) = disk {
                disk.release();
                disk.unmount();
            }
            if let Err(e) = std::fs::remove_dir_all(&folder) {
                eprintln!("drill agent: cannot remove {}: {e}", folder.display());
            }
        })
        .await;
    }
}

/// The agent's engine side, shared by its handlers and its watcher.
#[derive(Clone)]
pub struct Agent {
    slot: Arc<tokio::sync::Mutex<Option<Slot>>>,
    /// What `GET /engine` answers, kept apart from the slot so a long start never blocks it.
    state: Arc<Mutex<EngineState>>,
    /// The lease (its name, how long it lasts, when it runs out); `None` while no drill holds
    /// the slot or while the order is being started.
    lease: Arc<Mutex<Option<Lease>>>,
    /// Where each run's folder goes.
    work: PathBuf,
    /// drill's own executable, for `argv[0] == "drill"`.
    exe: PathBuf,
    /// The runtime the relays run on (the data path's, not the control plane's).
    data: tokio::runtime::Handle,
}

/// A drill's hold on the engine.
struct Lease {
    name: String,
    length: Duration,
    until: Instant,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why an order was not carried out: the status and one line.
type Refusal = (StatusCode, String);

fn problem(status: StatusCode, message: String) -> Response {
    (status, format!("{message}\n")).into_response()
}

impl Agent {
    /// An agent keeping its runs' folders under `work`, relaying on `data`.
    pub fn new(work: PathBuf, data: tokio::runtime::Handle) -> Result<Agent, String> {
        std::fs::create_dir_all(&work)
            .map_err(|e| format!("drill agent: cannot make --work {}: {e}", work.display()))?;
        let exe = std::env::current_exe()
            .map_err(|e| format!("drill agent: cannot find its own executable: {e}"))?;
        Ok(Agent {
            slot: Arc::default(),
            state: Arc::default(),
            lease: Arc::default(),
            work,
            exe,
            data,
        })
    }

    /// The engine routes, to merge with the proxy's before the token guard.
    pub fn router(self) -> Router {
        Router::new()
            .route("/engine", put(order).get(state).delete(end))
            .route("/engine/act", post(act))
            .route("/engine/lease", post(renew))
            .route("/engine/log", get(log))
            .with_state(self)
    }

    /// Ends an engine whose lease ran out, and notes one that ended by itself, until `cancel`.
    pub async fn watch(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(WATCH) => {}
            }
            let lapsed = lock(&self.lease)
                .as_ref()
                .is_some_and(|l| l.until <= Instant::now());
            if lapsed {
                let mut slot = self.slot.lock().await;
                // Renewed meanwhile (a call that waited for the slot): keep it.
                if lock(&self.lease)
                    .as_ref()
                    .is_some_and(|l| l.until > Instant::now())
                {
                    continue;
                }
                if let Some(s) = slot.take() {
                    eprintln!(
                        "drill agent: the lease on run {}'s engine ran out (its drill stopped renewing it): SIGKILLed, its folder removed",
                        s.run
                    );
                    s.end(Duration::ZERO).await;
                }
                *lock(&self.lease) = None;
                *lock(&self.state) = EngineState::default();
                continue;
            }
            if let Ok(mut slot) = self.slot.try_lock()
                && let Some(s) = slot.as_mut()
                && let Some(why) = s.engine.exited()
            {
                let mut state = lock(&self.state);
                state.running = false;
                state.exited = Some(why);
            }
        }
        if let Some(s) = self.slot.lock().await.take() {
            s.end(Duration::from_secs(5)).await;
        }
    }

    /// A fresh folder for `run` under the work folder, named after the run and its lease (so
    /// two orders never share one, and no run id reaches outside the work folder).
    fn folder(&self, run: &str, lease: &str) -> Result<PathBuf, String> {
        let name: String = run
            .chars()
            .take(100)
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let folder = self
            .work
            .join(format!("{}-{lease}", name.trim_start_matches('.')));
        for dir in ["work", "engine-data", "engine-data.disk"] {
            std::fs::create_dir_all(folder.join(dir))
                .map_err(|e| format!("cannot make {}: {e}", folder.join(dir).display()))?;
        }
        Ok(folder)
    }

    /// Starts what `o` orders, for the drill at `ends.peer`, in a fresh folder; a start that
    /// fails or is abandoned leaves no folder (and, by drop, no engine, mount or relay).
    async fn start(&self, o: &EngineOrder, ends: Ends) -> Result<(Slot, EngineSlot), Refusal> {
        if let Some((name, _)) = o.files.iter().find(|(name, _)| !plain_file_name(name)) {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("file name `{name}` is not a plain file name (no folders, no `..`)"),
            ));
        }
        let lease = lease_name();
        let folder = self.folder(&o.run, &lease).map_err(failed)?;
        // Also when this future is dropped (the drill hung up while the engine got ready).
        let mut unless_started = RemoveOnDrop(Some(folder.clone()));
        let started = self.launch(o, ends, lease, folder).await;
        if started.is_ok() {
            unless_started.0 = None;
        }
        started
    }

    /// The engine of `o` started in `folder` (its data directory on the power-cut filesystem
    /// when asked), its ports published.
    async fn launch(
        &self,
        o: &EngineOrder,
        ends: Ends,
        lease: String,
        folder: PathBuf,
    ) -> Result<(Slot, EngineSlot), Refusal> {
        let (work, data) = (folder.join("work"), folder.join("engine-data"));
        let disk = match o.power {
            true => Some(PowerFs::mount(&folder.join("engine-data.disk"), &data).map_err(failed)?),
            false => None,
        };
        let io = |e: std::io::Error| failed(format!("no free port: {e}"));
        let ingest = SocketAddr::from(([127, 0, 0, 1], free_port().map_err(io)?));
        let ports = free_ports(&o.ports, HashSet::from([ingest.port()])).map_err(io)?;
        let mut values = o.values.clone();
        values.extend(host_values(ingest, &work, &data, &ports));
        let spec = CommandSpec {
            argv: o.argv.clone(),
            env: o.env.clone(),
            files: o.files.clone(),
            ingest: IngestSpec::TcpLines,
            ready: o.ready.clone(),
            ready_within: Duration::from_millis(o.ready_within_ms),
            stats: None,
            write_key: None,
            ports: o.ports.iter().cloned().collect::<BTreeSet<_>>(),
            stop_grace: Duration::from_millis(o.stop_grace_ms),
        };
        let placement = Placement {
            values: &values,
            ports: &ports,
            ingest,
            work_dir: &work,
            data_dir: &data,
            log_path: folder.join("engine.log"),
            drill_exe: &self.exe,
            clock: None,
        };
        let engine = CommandEngine::start(&spec, placement)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (published, relays) = self.publish(ingest.port(), &ports, ends)?;
        let answer = EngineSlot {
            lease: lease.clone(),
            ingest: published.ingest,
            ports: published.ports,
            data_dir: data,
            describe: format!(
                "{}; published for this drill on {}",
                engine.describe(),
                published.ingest
            ),
        };
        let slot = Slot {
            run: o.run.clone(),
            lease,
            engine,
            disk,
            folder,
            _relays: relays,
        };
        Ok((slot, answer))
    }

    /// Relays for the engine's ingest port and each named port, listening where the drill
    /// reached the agent and taking the drill's address only; they end when the guard drops.
    fn publish(
        &self,
        ingest: u16,
        ports: &BTreeMap<String, u16>,
        ends: Ends,
    ) -> Result<(Published, DropGuard), Refusal> {
        let (host, peer) = (ends.local.ip().to_canonical(), ends.peer.ip());
        let relays = CancellationToken::new();
        let guard = relays.clone().drop_guard();
        let relay = |to: u16| {
            relay::start(
                &self.data,
                SocketAddr::new(host, 0),
                SocketAddr::from(([127, 0, 0, 1], to)),
                peer,
                relays.clone(),
            )
            .map_err(|e| failed(format!("cannot publish port {to} on {host}: {e}")))
        };
        let published = Published {
            ingest: relay(ingest)?,
            ports: ports
                .iter()
                .map(|(n, p)| Ok((n.clone(), relay(*p)?)))
                .collect::<Result<_, Refusal>>()?,
        };
        Ok((published, guard))
    }
}

/// Removes a folder when dropped, unless disarmed (`.0 = None`).
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(folder) = self.0.take() {
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}

/// Where the engine's ports are published.
struct Published {
    ingest: SocketAddr,
    ports: BTreeMap<String, SocketAddr>,
}

/// An order the agent could not carry out (the engine did not start, no port, no mount).
fn failed(why: String) -> Refusal {
    (StatusCode::UNPROCESSABLE_ENTITY, why)
}

/// A name for a new lease: unique on this agent (time, a count and the process's random
/// hash keys), not a secret (the token guards the API).
fn lease_name() -> String {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let hash = std::collections::hash_map::RandomState::new().hash_one((at, n));
    format!("{:08x}", hash as u32)
}

fn plain_file_name(name: &str) -> bool {
    let path = Path::new(name);
    matches!(
        path.components().collect::<Vec<_>>().as_slice(),
        [std::path::Component::Normal(_)]
    )
}

/// The lease a call says it holds.
fn lease_of(headers: &HeaderMap) -> Option<&str> {
    headers.get(LEASE_HEADER).and_then(|v| v.to_str().ok())
}

/// 404 when no engine is held, 409 when the call's lease is not the one that holds it.
fn check_held(slot: &Option<Slot>, headers: &HeaderMap) -> Result<(), Refusal> {
    match slot {
        None => Err((
            StatusCode::NOT_FOUND,
            "no engine runs here (its lease ran out, or none was ordered)".to_string(),
        )),
        Some(s) if lease_of(headers) != Some(s.lease.as_str()) => Err((
            StatusCode::CONFLICT,
            format!(
                "the engine here is held under another lease (run {}); give the `{LEASE_HEADER}` header its order was answered with",
                s.run
            ),
        )),
        Some(_) => Ok(()),
    }
}

async fn order(
    State(a): State<Agent>,
    ConnectInfo(ends): ConnectInfo<Ends>,
    Json(o): Json<EngineOrder>,
) -> Response {
    let lease = Duration::from_millis(o.lease_ms);
    if lease.is_zero() || lease > LEASE_MAX {
        return problem(
            StatusCode::BAD_REQUEST,
            format!("lease_ms must be 1..={}", LEASE_MAX.as_millis()),
        );
    }
    let mut slot = a.slot.lock().await;
    if let Some(held) = slot.as_ref() {
        return problem(
            StatusCode::CONFLICT,
            format!(
                "this agent runs the engine of drill run {} (its lease ends it once that drill stops renewing)",
                held.run
            ),
        );
    }
    match a.start(&o, ends).await {
        Ok((started, answer)) => {
            eprintln!(
                "drill agent: run {}: {} (for {})",
                o.run,
                answer.describe,
                ends.peer.ip()
            );
            *lock(&a.lease) = Some(Lease {
                name: started.lease.clone(),
                length: lease,
                until: Instant::now() + lease,
            });
            *slot = Some(started);
            *lock(&a.state) = EngineState {
                run: Some(o.run.clone()),
                running: true,
                exited: None,
                starts: 1,
            };
            Json(answer).into_response()
        }
        Err((status, why)) => problem(status, why),
    }
}

async fn act(State(a): State<Agent>, headers: HeaderMap, Json(act): Json<EngineAct>) -> Response {
    let mut guard = a.slot.lock().await;
    if let Err((status, why)) = check_held(&guard, &headers) {
        return problem(status, why);
    }
    let Some(slot) = guard.as_mut() else {
        return problem(StatusCode::NOT_FOUND, "no engine runs here".to_string());
    };
    match carry_out(slot, act, &a.state).await {
        Ok(done) => Json(done).into_response(),
        Err(e) => problem(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
    }
}

/// One control of the engine in `slot`; `state` follows.
async fn carry_out(
    slot: &mut Slot,
    act: EngineAct,
    state: &Mutex<EngineState>,
) -> Result<ActDone, SutError> {
    let no_disk = || {
        SutError::Start(
            "the engine's data directory is not on the power-cut filesystem here (the order asked for none)"
                .to_string(),
        )
    };
    let mut done = ActDone::default();
    let running = match act {
        EngineAct::Start => {
            slot.engine.spawn().await?;
            let mut s = lock(state);
            s.starts += 1;
            s.exited = None;
            true
        }
        EngineAct::Kill => {
            slot.engine.kill().await;
            false
        }
        EngineAct::Stop { grace_ms } => {
            slot.engine.stop(Duration::from_millis(grace_ms)).await;
            false
        }
        EngineAct::Pause | EngineAct::Resume => {
            slot.engine.pause(matches!(act, EngineAct::Pause));
            slot.engine.is_running()
        }
        EngineAct::PowerCut { torn } => {
            let disk = slot.disk.as_ref().ok_or_else(no_disk)?;
            // The engine dies first: a process holding a file open across the cut would keep
            // writing at the size the kernel remembers.
            slot.engine.kill().await;
            done.cut = Some(disk.power_cut(torn, None));
            false
        }
        EngineAct::FillDisk | EngineAct::DiskBack => {
            let disk = slot.disk.as_ref().ok_or_else(no_disk)?;
            if matches!(act, EngineAct::FillDisk) {
                disk.fill();
            } else {
                disk.release();
            }
            slot.engine.is_running()
        }
        EngineAct::Wipe => {
            empty(slot.engine.data_dir()).map_err(|e| SutError::Start(e.to_string()))?;
            slot.engine.is_running()
        }
        EngineAct::Note { line } => {
            slot.engine.note(&line);
            slot.engine.is_running()
        }
    };
    let mut s = lock(state);
    s.running = running;
    done.starts = s.starts;
    Ok(done)
}

/// Removes everything inside `dir`.
fn empty(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

async fn renew(State(a): State<Agent>, headers: HeaderMap) -> Response {
    let mut lease = lock(&a.lease);
    match lease.as_mut() {
        Some(l) if lease_of(&headers) == Some(l.name.as_str()) => {
            l.until = Instant::now() + l.length;
            StatusCode::NO_CONTENT.into_response()
        }
        Some(_) => problem(
            StatusCode::CONFLICT,
            "the engine here is held under another lease".to_string(),
        ),
        None => problem(
            StatusCode::NOT_FOUND,
            "no engine is held here under a lease (it ran out, or none was ordered)".to_string(),
        ),
    }
}

/// The engine's state; to a caller whose lease is not the one that holds it (a drill whose
/// lease ran out), the state of no engine.
async fn state(State(a): State<Agent>, headers: HeaderMap) -> Json<EngineState> {
    let held = lock(&a.lease).as_ref().map(|l| l.name.clone());
    match lease_of(&headers) {
        Some(asked) if held.as_deref() != Some(asked) => Json(EngineState::default()),
        _ => Json(lock(&a.state).clone()),
    }
}

async fn log(State(a): State<Agent>, headers: HeaderMap) -> Response {
    let slot = a.slot.lock().await;
    if let Err((status, why)) = check_held(&slot, &headers) {
        return problem(status, why);
    }
    let Some(s) = slot.as_ref() else {
        return problem(StatusCode::NOT_FOUND, "no engine runs here".to_string());
    };
    match std::fs::read(s.engine.log_path()) {
        Ok(bytes) => bytes.into_response(),
        Err(e) => problem(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Stops the engine and gives the slot back once it is stopped and its folder removed (an
/// order waiting for the slot starts after that, never beside it).
async fn end(State(a): State<Agent>, headers: HeaderMap) -> Response {
    let mut slot = a.slot.lock().await;
    if let Err((status, why)) = check_held(&slot, &headers) {
        return problem(status, why);
    }
    let Some(s) = slot.take() else {
        return StatusCode::NO_CONTENT.into_response();
    };
    *lock(&a.lease) = None;
    *lock(&a.state) = EngineState::default();
    let grace = s.engine.stop_grace();
    s.end(grace).await;
    drop(slot);
    StatusCode::NO_CONTENT.into_response()
}
