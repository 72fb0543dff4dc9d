//! The proxy's HTTP control API (DESIGN.md §6), served by `drill proxy`.
//!
//! `GET /links` lists every link with its condition and counters; `PUT /links/NAME/fault` puts a
//! fault in force (`{"fault":"swallow","direction":"downstream"}`, direction defaults to `both`);
//! `DELETE /links/NAME/fault` heals. A handler only publishes a new condition and waits for the
//! listener to follow (bounded): it never waits on data flow. A datagram (UDP) link takes
//! `loss` (`{"fault":"loss","loss":0.3,"direction":"upstream"}`) and `blackhole`, and refuses
//! with 400 what needs a stream (`reset`, `hang`, `throttle`, `strand`); a TCP link refuses
//! `loss` and `blackhole`.

use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use std::time::Duration;

use super::{Direction, Fault, FaultSpec, LinkStatus, Proxy};

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

async fn list(State(proxy): State<Proxy>) -> Json<Vec<LinkStatus>> {
    Json(proxy.links().iter().map(|l| l.status()).collect())
}

async fn put_fault(
    State(proxy): State<Proxy>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let Some(link) = proxy.link(&name) else {
        return problem(StatusCode::NOT_FOUND, format!("no link named `{name}`"));
    };
    let request: FaultRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!(
                    "{e}; send e.g. {{\"fault\":\"swallow\",\"direction\":\"downstream\"}} (faults: refuse, reset, swallow, hang, delay with latency_ms/jitter_ms, throttle with bytes_per_s, heal; on a UDP link refuse, swallow, delay, loss with loss (0..1), blackhole, heal; directions: upstream, downstream, both)"
                ),
            );
        }
    };
    let spec = request.spec();
    if let Err(message) = spec.validate() {
        return problem(StatusCode::BAD_REQUEST, message);
    }
    if let Err(e) = link.try_apply_spec_settled(spec).await {
        return problem(StatusCode::BAD_REQUEST, e.to_string());
    }
    Json(link.status()).into_response()
}

async fn heal(State(proxy): State<Proxy>, Path(name): Path<String>) -> Response {
    let Some(link) = proxy.link(&name) else {
        return problem(StatusCode::NOT_FOUND, format!("no link named `{name}`"));
    };
    link.apply_settled(Fault::Heal, Direction::Both).await;
    Json(link.status()).into_response()
}

/// drill's own API, and the Toxiproxy-shaped one beside it on the same port.
pub fn router(proxy: Proxy) -> Router {
    Router::new()
        .route("/links", get(list))
        .route("/links/{name}/fault", put(put_fault).delete(heal))
        .with_state(proxy.clone())
        .merge(super::toxiproxy::router(proxy))
}

/// Serves the control API on `addr` until `cancel` fires. Returns the bound address.
pub async fn serve(
    proxy: Proxy,
    addr: SocketAddr,
    token: Option<String>,
    cancel: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = crate::control::guard(router(proxy), token);
    let handle = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
    });
    Ok((bound, handle))
}
