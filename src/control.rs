//! Control planes are not an open door: `drill proxy --api` and the engine's HTTP API bind
//! loopback by default, and bound anywhere else they require a bearer token on every request
//! (`--token` or `DRILL_TOKEN`; 401 otherwise, compared in constant time).
//!
//! A leaf: no other drill module is used here.

use std::net::SocketAddr;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The token a control plane on `addr` must require: `given` (flag or config), else
/// `DRILL_TOKEN`; none needed on loopback. Binding elsewhere without one is an error that
/// says what to do.
pub fn token_for(addr: SocketAddr, given: Option<String>) -> Result<Option<String>, String> {
    let token = given
        .or_else(|| std::env::var("DRILL_TOKEN").ok())
        .filter(|t| !t.is_empty());
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(format!(
            "{addr} is not a loopback address: a control API reachable from elsewhere needs a bearer token; give --token (or set DRILL_TOKEN), or bind 127.0.0.1"
        ));
    }
    Ok(token)
}

/// Equal in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

/// Axum middleware: 401 unless `Authorization: Bearer <token>` matches.
pub async fn require(State(token): State<String>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if same(given.as_bytes(), token.as_bytes()) {
        next.run(request).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token (Authorization: Bearer <token>)\n",
        )
            .into_response()
    }
}

/// `router` with the token required on every route, when there is one.
pub fn guard<S: Clone + Send + Sync + 'static>(
    router: axum::Router<S>,
    token: Option<String>,
) -> axum::Router<S> {
    match token {
        Some(t) => router.layer(axum::middleware::from_fn_with_state(t, require)),
        None => router,
    }
}

/// Both ends of a control connection: who called (`peer`) and the address they reached
/// (`local`), as axum's connect info. `drill agent` publishes an engine's ports on `local` for
/// `peer` only.
#[derive(Debug, Clone, Copy)]
pub struct Ends {
    pub local: SocketAddr,
    pub peer: SocketAddr,
}

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>>
    for Ends
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Ends {
        let peer = *stream.remote_addr();
        Ends {
            local: stream.io().local_addr().unwrap_or(peer),
            peer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_needs_no_token_elsewhere_does() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap();
        assert_eq!(
            token_for(lo, None).unwrap(),
            std::env::var("DRILL_TOKEN").ok()
        );
        if std::env::var_os("DRILL_TOKEN").is_none() {
            assert!(token_for(any, None).unwrap_err().contains("--token"));
        }
        assert_eq!(
            token_for(any, Some("t".into())).unwrap().as_deref(),
            Some("t")
        );
    }

    #[test]
    fn comparison_is_exact() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
        assert!(!same(b"", b"x"));
    }
}
