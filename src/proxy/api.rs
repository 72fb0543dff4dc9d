//! The proxy's HTTP control API (docs/src/design.md#6-interfaces), served by `drill proxy`.
//!
//! `GET /links` lists every link with its condition and counters; `PUT /links/NAME/fault` puts a
//! fault in force (`{"fault":"swallow","direction":"downstream"}`, direction defaults to `both`);
//! `DELETE /links/NAME/fault` heals. A handler only publishes a new condition and waits for the
//! listener to follow (bounded): it never waits on data flow. A datagram (UDP) link takes
//! `loss` (`{"fault":"loss","loss":0.3,"direction":"upstream"}`) and `blackhole`, and refuses
//! with 400 what needs a stream (`reset`, `hang`, `throttle`, `strand`); a TCP link refuses
//! `loss` and `blackhole`.
//!
//! **Leases.** A fault put with `"lease_ms": N` holds only while its driver renews it: `POST
//! /links/NAME/lease` within every N ms, or the proxy heals the link by itself. A drill on
//! another host that crashes, is killed or loses its network mid-fault leaves no fault behind.
//! A later `PUT` or `DELETE` on the link replaces or ends the lease.

use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Direction, Fault, FaultSpec, LinkStatus, Proxy};

/// How often the proxy looks for leases that ran out.
const LEASE_CHECK: Duration = Duration::from_millis(50);

/// The longest lease a fault may be put under.
const LEASE_MAX: Duration = Duration::from_secs(3600);

/// The faults held under a lease, by link: how long each lease lasts and when it runs out.
#[derive(Clone, Default)]
struct Leases(Arc<Mutex<HashMap<String, (Duration, Instant)>>>);

impl Leases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Duration, Instant)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The links whose lease ran out, taken out of the map.
    fn expired(&self, now: Instant) -> Vec<String> {
        let mut map = self.lock();
        let gone: Vec<String> = map
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            map.remove(name);
        }
        gone
    }
}

/// What the handlers share: the proxy and the leases on its faults.
#[derive(Clone)]
struct Control {
    proxy: Proxy,
    leases: Leases,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultRequest {
    fault: Fault,
    #[serde(default)]
    direction: Direction,
    #[serde(default)]
    latency_ms: u64,
    #[serde(default)]
    jitter_ms: u64,
    #[serde(default)]
    bytes_per_s: u64,
    #[serde(default)]
    loss: f64,
    /// Heal the link unless `POST /links/NAME/lease` renews this within every `lease_ms`.
    #[serde(default)]
    lease_ms: Option<u64>,
}

impl FaultRequest {
    fn spec(&self) -> FaultSpec {
        FaultSpec {
            fault: self.fault,
            direction: self.direction,
            latency: Duration::from_millis(self.latency_ms),
            jitter: Duration::from_millis(self.jitter_ms),
            bytes_per_s: self.bytes_per_s,
            loss: self.loss,
            ..FaultSpec::new(self.fault, self.direction)
        }
    }
}

fn problem(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

async fn list(State(c): State<Control>) -> Json<Vec<LinkStatus>> {
    Json(c.proxy.links().iter().map(|l| l.status()).collect())
}

async fn put_fault(
    State(c): State<Control>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let Some(link) = c.proxy.link(&name) else {
        return problem(StatusCode::NOT_FOUND, format!("no link named `{name}`"));
    };
    let request: FaultRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!(
                    "{e}; send e.g. {{\"fault\":\"swallow\",\"direction\":\"downstream\"}} (faults: refuse, reset, swallow, hang, delay with latency_ms/jitter_ms, throttle with bytes_per_s, heal; on a UDP link refuse, swallow, delay, loss with loss (0..1), blackhole, heal; directions: upstream, downstream, both; lease_ms: heal unless renewed)"
                ),
            );
        }
    };
    if let Some(ms) = request.lease_ms
        && (ms == 0 || Duration::from_millis(ms) > LEASE_MAX)
    {
        return problem(
            StatusCode::BAD_REQUEST,
            format!(
                "lease_ms: {ms}: give the lease in milliseconds, from 1 to {} (e.g. 5000)",
                LEASE_MAX.as_millis()
            ),
        );
    }
    let spec = request.spec();
    if let Err(message) = spec.validate() {
        return problem(StatusCode::BAD_REQUEST, message);
    }
    if let Err(e) = link.try_apply_spec_settled(spec).await {
        return problem(StatusCode::BAD_REQUEST, e.to_string());
    }
    match request.lease_ms.map(Duration::from_millis) {
        Some(lease) if spec.fault != Fault::Heal => {
            c.leases
                .lock()
                .insert(name, (lease, Instant::now() + lease));
        }
        _ => {
            c.leases.lock().remove(&name);
        }
    }
    Json(link.status()).into_response()
}

async fn heal(State(c): State<Control>, Path(name): Path<String>) -> Response {
    let Some(link) = c.proxy.link(&name) else {
        return problem(StatusCode::NOT_FOUND, format!("no link named `{name}`"));
    };
    c.leases.lock().remove(&name);
    link.apply_settled(Fault::Heal, Direction::Both).await;
    Json(link.status()).into_response()
}

/// Renews the lease on the link's fault for as long again; 404 when it holds none (it ran out
/// and the link was healed, or the fault was put without one).
async fn renew(State(c): State<Control>, Path(name): Path<String>) -> Response {
    let mut leases = c.leases.lock();
    match leases.get_mut(&name) {
        Some((lease, until)) => {
            *until = Instant::now() + *lease;
            Json(serde_json::json!({ "link": name, "lease_ms": lease.as_millis() as u64 }))
                .into_response()
        }
        None => problem(
            StatusCode::NOT_FOUND,
            format!(
                "link `{name}` holds no leased fault (it ran out and was healed, or none was put)"
            ),
        ),
    }
}

/// Heals each link whose lease ran out, until `cancel` fires.
async fn end_expired(c: Control, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(LEASE_CHECK) => {}
        }
        for name in c.leases.expired(Instant::now()) {
            // A fault put again meanwhile holds a new lease of its own: leave it.
            if c.leases.lock().contains_key(&name) {
                continue;
            }
            if let Some(link) = c.proxy.link(&name) {
                link.apply_settled(Fault::Heal, Direction::Both).await;
                eprintln!(
                    "drill proxy: the lease on link {name}'s fault ran out (its driver stopped renewing it): healed"
                );
            }
        }
    }
}

/// drill's own API, and the Toxiproxy-shaped one beside it on the same port.
pub fn router(proxy: Proxy) -> Router {
    router_with(Control {
        proxy,
        leases: Leases::default(),
    })
}

fn router_with(c: Control) -> Router {
    let proxy = c.proxy.clone();
    Router::new()
        .route("/links", get(list))
        .route("/links/{name}/fault", put(put_fault).delete(heal))
        .route("/links/{name}/lease", axum::routing::post(renew))
        .with_state(c)
        .merge(super::toxiproxy::router(proxy))
}

/// Serves the control API on `addr` until `cancel` fires, with `more` routes beside the
/// links' (`drill agent`'s engine), behind the same token. Returns the bound address.
pub async fn serve(
    proxy: Proxy,
    addr: SocketAddr,
    token: Option<String>,
    more: Option<Router>,
    cancel: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let control = Control {
        proxy,
        leases: Leases::default(),
    };
    tokio::spawn(end_expired(control.clone(), cancel.clone()));
    let routes = match more {
        Some(more) => router_with(control).merge(more),
        None => router_with(control),
    };
    let app = crate::control::guard(routes, token);
    let handle = tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<crate::control::Ends>(),
        )
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
    });
    Ok((bound, handle))
}
