//! The JetStream read-back: the stream read whole, straight from a server (never through the
//! proxy), once the drill has drained; while it runs, the stream's own message count for the
//! progress line. Each arrival is stamped with the server's own time of storing it. A read that
//! falls short of the stream's count is a *verifier* fault, never engine loss.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use crate::dest::ReadBack;
use crate::verify::{Access, Decoder, Received, WriteKeyPlace};

/// The header that carries a JetStream message id (`Nats-Msg-Id`), where the built-in engine
/// puts the write key.
pub const MSG_ID: &str = "Nats-Msg-Id";

/// A JetStream stream being written to: counted as it fills, read whole at the end.
pub struct StreamReader {
    /// Every node (a cluster's read-back goes to whichever answers).
    servers: Vec<SocketAddr>,
    stream: String,
    js: async_nats::jetstream::Context,
    t0: std::time::SystemTime,
    decoder: Decoder,
    access: Access,
}

impl StreamReader {
    /// Watches a stream (it must exist); `t0` is the drill's start as wall time.
    pub async fn open(
        servers: Vec<SocketAddr>,
        stream: &str,
        t0: std::time::SystemTime,
        decoder: Decoder,
        access: Access,
    ) -> Result<StreamReader, String> {
        let addrs: Vec<async_nats::ServerAddr> = servers
            .iter()
            .filter_map(|a| format!("nats://{a}").parse().ok())
            .collect();
        let client = super::options_for(&access)?
            .name("drill-verifier-count")
            .ignore_discovered_servers()
            .connect(addrs)
            .await
            .map_err(|e| format!("verifier cannot connect to {servers:?}: {e}"))?;
        Ok(StreamReader {
            servers,
            stream: stream.to_string(),
            js: async_nats::jetstream::new(client),
            t0,
            decoder,
            access,
        })
    }
}

impl ReadBack for StreamReader {
    fn count(&self) -> BoxFuture<'_, Option<usize>> {
        async move {
            let ask = async {
                let mut s = self.js.get_stream(&self.stream).await.ok()?;
                s.info().await.ok().map(|i| i.state.messages as usize)
            };
            tokio::time::timeout(Duration::from_millis(500), ask)
                .await
                .ok()
                .flatten()
        }
        .boxed()
    }

    fn finish(self: Box<Self>, addrs: Vec<SocketAddr>) -> BoxFuture<'static, Received> {
        async move {
            let servers = if addrs.is_empty() {
                self.servers
            } else {
                addrs
            };
            let mut last = Received::default();
            for server in servers {
                let read = read_stream_with(
                    server,
                    &self.stream,
                    Duration::from_secs(120),
                    Some(self.t0),
                    &self.decoder,
                    &self.access,
                )
                .await;
                match read {
                    Ok(r) if r.verifier_fault.is_none() => return r,
                    Ok(r) => last = r,
                    Err(e) => last.verifier_fault = Some(e),
                }
            }
            last
        }
        .boxed()
    }
}

/// Reads a whole JetStream stream straight from the server (never through the proxy): every
/// message from the first sequence to the last, with its `Nats-Msg-Id` as the write key. The
/// count read is checked against the stream's own message count; a shortfall is a *verifier*
/// fault, never engine loss.
///
/// With `t0` (the drill's start as wall time), each arrival is stamped with the server's own
/// time of storing it, relative to `t0`; otherwise with the time it was read.
pub async fn read_stream(
    server: SocketAddr,
    stream: &str,
    limit: Duration,
    t0: Option<std::time::SystemTime>,
) -> Result<Received, String> {
    read_stream_with(
        server,
        stream,
        limit,
        t0,
        &Decoder::builtin(WriteKeyPlace::Meta(MSG_ID.to_string())),
        &Access::default(),
    )
    .await
}

/// [`read_stream`], finding ids and write keys with `decoder`.
pub async fn read_stream_with(
    server: SocketAddr,
    stream: &str,
    limit: Duration,
    t0: Option<std::time::SystemTime>,
    decoder: &Decoder,
    access: &Access,
) -> Result<Received, String> {
    use async_nats::jetstream::{self, consumer};
    let client = crate::dest::nats::options_for(access)?
        .name("drill-verifier")
        .ignore_discovered_servers()
        .connect(server.to_string())
        .await
        .map_err(|e| format!("verifier cannot connect to {server}: {e}"))?;
    let js = jetstream::new(client);
    let mut handle = js
        .get_stream(stream)
        .await
        .map_err(|e| format!("verifier: stream {stream}: {e}"))?;
    let state = handle
        .info()
        .await
        .map_err(|e| format!("verifier: stream {stream} info: {e}"))?
        .state
        .clone();
    // Reading from the drill's first sequence: what the stream holds from there on.
    let (expected, deliver_policy) = match access.first_sequence {
        Some(first) if first > 1 => (
            (state.last_sequence + 1).saturating_sub(first.max(state.first_sequence)),
            consumer::DeliverPolicy::ByStartSequence {
                start_sequence: first,
            },
        ),
        _ => (state.messages, consumer::DeliverPolicy::All),
    };
    let reader: consumer::PullConsumer = handle
        .create_consumer(consumer::pull::Config {
            deliver_policy,
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("verifier: consumer on {stream}: {e}"))?;
    let mut messages = reader
        .messages()
        .await
        .map_err(|e| format!("verifier: reading {stream}: {e}"))?;
    let mut received = Received::default();
    let mut read = 0u64;
    let started = Instant::now();
    while read < expected {
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, messages.next()).await {
            Ok(Some(Ok(m))) => {
                read += 1;
                let stored = t0.and_then(|t0| {
                    let at = m.info().ok()?.published.unix_timestamp_nanos();
                    let t0 = t0.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i128;
                    Some(Duration::from_nanos(u64::try_from(at - t0).unwrap_or(0)))
                });
                let meta = |name: &str| {
                    m.headers
                        .as_ref()
                        .and_then(|h| h.get(name))
                        .map(|v| v.as_str().to_string())
                };
                decoder.add(
                    &m.payload,
                    meta,
                    stored.unwrap_or_else(|| started.elapsed()),
                    &mut received,
                );
            }
            Ok(Some(Err(e))) => {
                received.verifier_fault = Some(format!("verifier: reading {stream}: {e}"));
                break;
            }
            Ok(None) | Err(_) => {
                received.verifier_fault = Some(format!(
                    "verifier read {read} of the {expected} messages in stream {stream} within {limit:?}"
                ));
                break;
            }
        }
    }
    Ok(received)
}
