//! The Toxiproxy HTTP API shape, mapped onto drill's links and faults, so client code written
//! for Toxiproxy can point at `drill proxy` unchanged.
//!
//! | Toxiproxy | drill |
//! |---|---|
//! | proxy `enabled: false` | `refuse` (nothing listens, existing connections reset) |
//! | `latency {latency, jitter}` (ms) | `delay` in the toxic's `stream` |
//! | `bandwidth {rate}` (KB/s, 1 KB = 1000 bytes) | `throttle` at `rate × 1000` bytes/s |
//! | `timeout {timeout: 0}` | `swallow` in the toxic's `stream` (data dropped, connection open) |
//! | `timeout {timeout: T}` | `swallow`, then after T ms `reset` until the toxic is removed |
//! | `reset_peer {timeout: T}` | `reset` (after T ms when T > 0) |
//! | `limit_data {bytes}` | reset each connection once `bytes` have passed in the toxic's stream |
//! | `slicer {average_size, size_variation, delay}` (µs) | each piece written on its own, `delay` apart |
//! | `slow_close {delay}` (ms) | the end of the stream passed on `delay` late |
//!
//! Toxics stack as in Toxiproxy: any number of `latency`, `bandwidth`, `slicer`, `slow_close`
//! and `limit_data` toxics
//! on one proxy, each in its own stream (delays add up, the slowest rate and the smallest
//! budget hold), beside at most one cut (`timeout` or `reset_peer`): a second cut is refused
//! with 409 (remove the first). A datagram link takes one toxic at a time.
//!
//! `toxicity` below 1 holds a condition on that share of the connections, drawn once per
//! connection from the link's seed (the same connections for the same seed and order); a cut
//! (`timeout`, `reset_peer`) with a toxicity below 1 is refused with 400.
//!
//! Differences, on purpose: removing a `timeout` toxic that swallowed bytes resets the connections
//! that lost bytes — their byte stream has a hole (docs/src/design.md#3-fault-vocabulary) — where
//! Toxiproxy would let them carry on with data missing. On a datagram (UDP) link, made by
//! `drill proxy --link NAME=udp:…`, a toxic that needs a stream (`bandwidth`, `reset_peer`,
//! `limit_data`, a `timeout` with a reset after it) is refused with 400; `POST /proxies` makes TCP
//! links only. drill's datagram faults `loss` and `blackhole` have no toxic: they are set through
//! drill's own API (`PUT /links/NAME/fault`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Direction, Fault, FaultSpec, Link, Proxy};

/// A toxic as Toxiproxy shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Toxic {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub stream: String,
    pub toxicity: f64,
    pub attributes: BTreeMap<String, Value>,
}

/// What drill keeps per Toxiproxy proxy beside the link itself.
#[derive(Debug, Clone, Default)]
struct Entry {
    enabled: bool,
    /// In the order they were added.
    toxics: Vec<Toxic>,
    /// Bumped on every change, so a delayed step (timeout, reset_peer) knows it is stale.
    generation: u64,
}

#[derive(Clone)]
struct Shared {
    proxy: Proxy,
    entries: Arc<Mutex<BTreeMap<String, Entry>>>,
}

impl Shared {
    fn entry(&self, name: &str) -> Entry {
        self.entries
            .lock()
            .ok()
            .and_then(|e| e.get(name).cloned())
            .unwrap_or(Entry {
                enabled: true,
                ..Entry::default()
            })
    }

    fn store(&self, name: &str, entry: Entry) -> u64 {
        let mut generation = 0;
        if let Ok(mut entries) = self.entries.lock() {
            let e = entries.entry(name.to_string()).or_default();
            generation = e.generation + 1;
            *e = Entry {
                generation,
                ..entry
            };
        }
        generation
    }
}

/// An error answer in Toxiproxy's shape: `{"error": ..., "status": ...}`.
struct Problem(StatusCode, String);

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let Problem(status, message) = self;
        (
            status,
            Json(serde_json::json!({ "error": message, "status": status.as_u16() })),
        )
            .into_response()
    }
}

/// What a handler answers: a response, or a problem in Toxiproxy's error shape.
type Answer = Result<Response, Problem>;

fn problem(status: StatusCode, message: impl Into<String>) -> Response {
    Problem(status, message.into()).into_response()
}

fn proxy_json(link: &Link, entry: &Entry) -> Value {
    serde_json::json!({
        "name": link.name(),
        "listen": link.listen_addr().to_string(),
        "upstream": link.upstream_addr().to_string(),
        "enabled": entry.enabled,
        "toxics": entry.toxics,
    })
}

fn attribute(t: &Toxic, key: &str) -> u64 {
    t.attributes
        .get(key)
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
        .max(0.0) as u64
}

/// What a toxic does on a drill link: the fault now, and optionally a later one.
struct Plan {
    now: FaultSpec,
    later: Option<(Duration, FaultSpec)>,
}

impl Plan {
    /// A cut (`timeout`, `reset_peer`): a link holds at most one; every other toxic shapes.
    fn cuts(&self) -> bool {
        !self.now.fault.shapes()
    }
}

fn plan(t: &Toxic) -> Result<Plan, String> {
    let direction = match t.stream.as_str() {
        "upstream" => Direction::Upstream,
        "downstream" => Direction::Downstream,
        other => return Err(format!("stream `{other}`: use upstream or downstream")),
    };
    let ms = |key| Duration::from_millis(attribute(t, key));
    let reset = FaultSpec::new(Fault::Reset, Direction::Both);
    let plan = match t.kind.as_str() {
        "latency" => Plan {
            now: FaultSpec::delay(direction, ms("latency"), ms("jitter")),
            later: None,
        },
        "bandwidth" => Plan {
            now: FaultSpec::throttle(direction, attribute(t, "rate").saturating_mul(1000)),
            later: None,
        },
        "timeout" => Plan {
            now: FaultSpec::new(Fault::Swallow, direction),
            later: (attribute(t, "timeout") > 0).then(|| (ms("timeout"), reset)),
        },
        "reset_peer" if attribute(t, "timeout") > 0 => Plan {
            now: FaultSpec::new(Fault::Heal, Direction::Both),
            later: Some((ms("timeout"), reset)),
        },
        "reset_peer" => Plan {
            now: reset,
            later: None,
        },
        "limit_data" => Plan {
            now: FaultSpec::limit(direction, attribute(t, "bytes")),
            later: None,
        },
        "slicer" => Plan {
            now: FaultSpec::slicer(
                direction,
                attribute(t, "average_size"),
                attribute(t, "size_variation"),
                Duration::from_micros(attribute(t, "delay")),
            ),
            later: None,
        },
        "slow_close" => Plan {
            now: FaultSpec::slow_close(direction, ms("delay")),
            later: None,
        },
        other => {
            return Err(format!(
                "toxic type `{other}` has no drill fault; supported: latency, bandwidth, slicer, slow_close, limit_data, timeout, reset_peer"
            ));
        }
    };
    // The chance the toxic holds on a connection, drawn per connection (seeded; the toxic's
    // name keeps its draws apart from another's).
    let mut plan = plan;
    plan.now.toxicity = t.toxicity;
    plan.now.salt = t.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    plan.now.validate()?;
    Ok(plan)
}

/// Whether `toxic` has a drill fault that `link` can carry out (now and later).
fn fits(link: &Link, toxic: &Toxic) -> Result<(), Problem> {
    let plan = plan(toxic).map_err(|m| Problem(StatusCode::BAD_REQUEST, m))?;
    let later = plan.later.map(|(_, spec)| spec);
    for spec in std::iter::once(plan.now).chain(later) {
        link.check(&spec)
            .map_err(|e| Problem(StatusCode::BAD_REQUEST, e.to_string()))?;
    }
    Ok(())
}

/// Puts the link into the condition its Toxiproxy state describes: `enabled: false` refuses;
/// otherwise the cut toxic, if any, and every shaping toxic stacked beside it.
async fn sync(shared: &Shared, link: &Link, generation: u64) {
    let entry = shared.entry(link.name());
    let mut cut = (!entry.enabled).then(|| FaultSpec::new(Fault::Refuse, Direction::Both));
    let mut stacked = Vec::new();
    let mut later = None;
    for plan in entry.toxics.iter().filter_map(|t| plan(t).ok()) {
        if plan.now.fault.shapes() {
            stacked.push(plan.now);
        } else if plan.now.fault != Fault::Heal {
            cut = cut.or(Some(plan.now));
        }
        later = later.or(plan.later);
    }
    let applied = if link.stacks() {
        link.set_stack(cut, stacked.clone()).await
    } else {
        // One condition at a time (create_toxic refuses a second).
        let one = cut.or(stacked.first().copied());
        let heal = FaultSpec::new(Fault::Heal, Direction::Both);
        link.try_apply_spec_settled(one.unwrap_or(heal)).await
    };
    if let Err(e) = applied {
        eprintln!("drill: {e}");
        return;
    }
    if let Some((after, spec)) = later.filter(|_| entry.enabled) {
        let (shared, link) = (shared.clone(), link.clone());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if shared.entry(link.name()).generation != generation {
                return;
            }
            let applied = if link.stacks() {
                link.set_stack(Some(spec), stacked).await
            } else {
                link.try_apply_spec_settled(spec).await
            };
            if let Err(e) = applied {
                eprintln!("drill: {e}");
            }
        });
    }
}

#[derive(Debug, Deserialize)]
struct CreateProxy {
    name: String,
    listen: String,
    upstream: String,
    #[serde(default = "yes")]
    enabled: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
struct UpdateProxy {
    #[serde(default)]
    enabled: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct CreateToxic {
    #[serde(default)]
    name: Option<String>,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    toxicity: Option<f64>,
    #[serde(default)]
    attributes: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
struct UpdateToxic {
    #[serde(default)]
    toxicity: Option<f64>,
    #[serde(default)]
    attributes: BTreeMap<String, Value>,
}

async fn version() -> Json<Value> {
    Json(serde_json::json!({ "version": format!("drill {}", env!("CARGO_PKG_VERSION")) }))
}

async fn list_proxies(State(shared): State<Shared>) -> Json<Value> {
    let mut all = serde_json::Map::new();
    for link in shared.proxy.links() {
        all.insert(
            link.name().to_string(),
            proxy_json(&link, &shared.entry(link.name())),
        );
    }
    Json(Value::Object(all))
}

async fn resolve(addr: &str) -> Result<SocketAddr, String> {
    let addr = addr.replace("localhost", "127.0.0.1");
    tokio::net::lookup_host(&addr)
        .await
        .map_err(|e| format!("`{addr}`: {e}"))?
        .next()
        .ok_or_else(|| format!("`{addr}` resolves to nothing"))
}

async fn create_proxy(State(shared): State<Shared>, body: axum::body::Bytes) -> Response {
    let request: CreateProxy = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!("{e}; send {{\"name\",\"listen\",\"upstream\"}}"),
            );
        }
    };
    match create(&shared, request).await {
        Ok(json) => (StatusCode::CREATED, Json(json)).into_response(),
        Err(p) => p.into_response(),
    }
}

async fn create(shared: &Shared, request: CreateProxy) -> Result<Value, Problem> {
    if shared.proxy.link(&request.name).is_some() {
        return Err(Problem(StatusCode::CONFLICT, "proxy already exists".into()));
    }
    let listen = resolve(&request.listen)
        .await
        .map_err(|e| Problem(StatusCode::BAD_REQUEST, e))?;
    let upstream = resolve(&request.upstream)
        .await
        .map_err(|e| Problem(StatusCode::BAD_REQUEST, e))?;
    let link = shared
        .proxy
        .start_link(&request.name, listen, upstream)
        .await
        .map_err(|e| Problem(StatusCode::BAD_REQUEST, e.to_string()))?;
    let generation = shared.store(
        &request.name,
        Entry {
            enabled: request.enabled,
            ..Entry::default()
        },
    );
    sync(shared, &link, generation).await;
    Ok(proxy_json(&link, &shared.entry(&request.name)))
}

async fn populate(State(shared): State<Shared>, body: axum::body::Bytes) -> Response {
    let requests: Vec<CreateProxy> = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let mut created = Vec::new();
    for request in requests {
        if let Some(link) = shared.proxy.link(&request.name) {
            created.push(proxy_json(&link, &shared.entry(&request.name)));
            continue;
        }
        match create(&shared, request).await {
            Ok(json) => created.push(json),
            Err(p) => return p.into_response(),
        }
    }
    (
        StatusCode::CREATED,
        Json(serde_json::json!({ "proxies": created })),
    )
        .into_response()
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(body).map_err(|e| Problem(StatusCode::BAD_REQUEST, e.to_string()))
}

fn find(shared: &Shared, name: &str) -> Result<Link, Problem> {
    shared
        .proxy
        .link(name)
        .ok_or_else(|| Problem(StatusCode::NOT_FOUND, "proxy not found".into()))
}

async fn get_proxy(State(shared): State<Shared>, Path(name): Path<String>) -> Response {
    match find(&shared, &name) {
        Ok(link) => Json(proxy_json(&link, &shared.entry(&name))).into_response(),
        Err(p) => p.into_response(),
    }
}

async fn update_proxy(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Answer {
    let link = find(&shared, &name)?;
    let request: UpdateProxy = parse(&body)?;
    let mut entry = shared.entry(&name);
    if let Some(enabled) = request.enabled {
        entry.enabled = enabled;
    }
    let generation = shared.store(&name, entry);
    sync(&shared, &link, generation).await;
    Ok(Json(proxy_json(&link, &shared.entry(&name))).into_response())
}

async fn delete_proxy(State(shared): State<Shared>, Path(name): Path<String>) -> Response {
    match shared.proxy.remove(&name) {
        Some(link) => {
            link.shutdown().await;
            if let Ok(mut e) = shared.entries.lock() {
                e.remove(&name);
            }
            StatusCode::NO_CONTENT.into_response()
        }
        None => problem(StatusCode::NOT_FOUND, "proxy not found"),
    }
}

async fn list_toxics(State(shared): State<Shared>, Path(name): Path<String>) -> Response {
    match find(&shared, &name) {
        Ok(_) => Json(shared.entry(&name).toxics).into_response(),
        Err(p) => p.into_response(),
    }
}

async fn create_toxic(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Answer {
    let link = find(&shared, &name)?;
    let request: CreateToxic = parse(&body)?;
    let stream = request.stream.unwrap_or_else(|| "downstream".to_string());
    let toxic = Toxic {
        name: request
            .name
            .unwrap_or_else(|| format!("{}_{stream}", request.kind)),
        kind: request.kind,
        stream,
        toxicity: request.toxicity.unwrap_or(1.0),
        attributes: request.attributes,
    };
    let mut entry = shared.entry(&name);
    if let Some(message) = conflict(&link, &entry.toxics, &toxic) {
        return Err(Problem(StatusCode::CONFLICT, message));
    }
    fits(&link, &toxic)?;
    entry.toxics.push(toxic.clone());
    let generation = shared.store(&name, entry);
    sync(&shared, &link, generation).await;
    Ok(Json(toxic).into_response())
}

/// Why `toxic` cannot join `toxics` on `link`, if it cannot: its name is taken, it is a second
/// cut, or the link takes one condition at a time.
fn conflict(link: &Link, toxics: &[Toxic], toxic: &Toxic) -> Option<String> {
    if toxics.iter().any(|t| t.name == toxic.name) {
        return Some("toxic already exists".to_string());
    }
    if let Some(first) = toxics.first().filter(|_| !link.stacks()) {
        return Some(format!(
            "this link ({}) takes one condition at a time and `{}` is in force; remove it first",
            if link.carries_datagrams() {
                "datagrams"
            } else {
                "Kafka-aware"
            },
            first.name
        ));
    }
    let cuts = |t: &Toxic| plan(t).is_ok_and(|p| p.cuts());
    if cuts(toxic)
        && let Some(other) = toxics.iter().find(|t| cuts(t))
    {
        return Some(format!(
            "a drill link holds at most one cut (timeout, reset_peer) and `{}` is in force; remove it first (latency, bandwidth, slicer, slow_close and limit_data stack)",
            other.name
        ));
    }
    None
}

async fn get_toxic(
    State(shared): State<Shared>,
    Path((name, toxic)): Path<(String, String)>,
) -> Answer {
    find(&shared, &name)?;
    match shared
        .entry(&name)
        .toxics
        .into_iter()
        .find(|t| t.name == toxic)
    {
        Some(t) => Ok(Json(t).into_response()),
        None => Err(Problem(StatusCode::NOT_FOUND, "toxic not found".into())),
    }
}

async fn update_toxic(
    State(shared): State<Shared>,
    Path((name, toxic)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Answer {
    let link = find(&shared, &name)?;
    let request: UpdateToxic = parse(&body)?;
    let mut entry = shared.entry(&name);
    let Some(slot) = entry.toxics.iter().position(|t| t.name == toxic) else {
        return Err(Problem(StatusCode::NOT_FOUND, "toxic not found".into()));
    };
    let mut current = entry.toxics[slot].clone();
    current.attributes.extend(request.attributes);
    if let Some(t) = request.toxicity {
        current.toxicity = t;
    }
    fits(&link, &current)?;
    entry.toxics[slot] = current.clone();
    let generation = shared.store(&name, entry);
    sync(&shared, &link, generation).await;
    Ok(Json(current).into_response())
}

async fn delete_toxic(
    State(shared): State<Shared>,
    Path((name, toxic)): Path<(String, String)>,
) -> Answer {
    let link = find(&shared, &name)?;
    let mut entry = shared.entry(&name);
    let Some(slot) = entry.toxics.iter().position(|t| t.name == toxic) else {
        return Err(Problem(StatusCode::NOT_FOUND, "toxic not found".into()));
    };
    entry.toxics.remove(slot);
    let generation = shared.store(&name, entry);
    sync(&shared, &link, generation).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /reset`: every proxy enabled, every toxic removed.
async fn reset(State(shared): State<Shared>) -> Response {
    for link in shared.proxy.links() {
        let generation = shared.store(
            link.name(),
            Entry {
                enabled: true,
                ..Entry::default()
            },
        );
        sync(&shared, &link, generation).await;
    }
    StatusCode::NO_CONTENT.into_response()
}

pub fn router(proxy: Proxy) -> Router {
    let shared = Shared {
        proxy,
        entries: Arc::default(),
    };
    Router::new()
        .route("/version", get(version))
        .route("/reset", post(reset))
        .route("/populate", post(populate))
        .route("/proxies", get(list_proxies).post(create_proxy))
        .route(
            "/proxies/{name}",
            get(get_proxy).post(update_proxy).delete(delete_proxy),
        )
        .route(
            "/proxies/{name}/toxics",
            get(list_toxics).post(create_toxic),
        )
        .route(
            "/proxies/{name}/toxics/{toxic}",
            get(get_toxic).post(update_toxic).delete(delete_toxic),
        )
        .with_state(shared)
}
