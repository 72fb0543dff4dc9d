//! The MQTT side of `drill bench engine`: mosquitto as a local process, topics named per run,
//! and the crate's own MQTT 5 QoS 1 code as the raw client.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, SinkExt, StreamExt};

use crate::dest::bench::{on_own_runtime, raw_key};
use crate::dest::{BenchAt, BenchBroker, BenchKind, BenchRun, DestError, Done, RawRun, Runtime};

/// The kind's bench side.
pub struct MqttBench;

impl BenchKind for MqttBench {
    fn start<'a>(&'a self, at: BenchAt<'a>) -> BoxFuture<'a, Result<BenchBroker, DestError>> {
        let BenchAt { dir, .. } = at;
        let started = super::broker::start_mqtt(Runtime::Process, dir, Default::default());
        async move { Ok(started.await?.into()) }.boxed()
    }

    fn fresh<'a>(&'a self, run: BenchRun<'a>) -> BoxFuture<'a, Result<String, String>> {
        let BenchRun { who, round, .. } = run;
        async move { Ok(format!("bench/{who}/{round}")) }.boxed()
    }

    fn done_with<'a>(&'a self, _run: BenchRun<'a>, _topic: &'a str) -> BoxFuture<'a, Done> {
        async { Ok(()) }.boxed()
    }

    fn raw_client(&self, run: RawRun) -> BoxFuture<'static, Result<Duration, String>> {
        on_own_runtime(raw_mqtt(run))
    }
}

/// The crate's MQTT 5 QoS 1 code: `window` publishes in flight, each with its write key.
async fn raw_mqtt(run: RawRun) -> Result<Duration, String> {
    let (addr, topic, records, window) = (run.addr, run.topic.as_str(), run.records, run.window);
    let (record_bytes, record_line) = (run.bytes, run.line);
    use crate::wire::mqtt::{self, Inbound};
    let session = mqtt::connect(
        addr,
        "bench-raw",
        Duration::from_secs(30),
        Duration::from_secs(10),
    )
    .await
    .map_err(|e| e.to_string())?;
    let window = session
        .connack
        .properties
        .as_ref()
        .and_then(|p| p.receive_max)
        .map_or(window, |m| window.min(usize::from(m.max(1))));
    let (mut tx, rx) = session.framed.split();
    let mut rx = rx.ready_chunks(256);
    let started = Instant::now();
    let (mut sent, mut acked, mut open) = (0u64, 0u64, 0usize);
    while acked < records {
        while open < window && sent < records {
            let pkid = (sent % 65_535) as u16 + 1;
            let payload = bytes::Bytes::from(record_line(sent, record_bytes).into_bytes());
            tx.feed(mqtt::publish_with_key(topic, pkid, payload, &raw_key(sent)))
                .await
                .map_err(|e| e.to_string())?;
            sent += 1;
            open += 1;
        }
        tx.flush().await.map_err(|e| e.to_string())?;
        let Some(packets) = rx.next().await else {
            return Err("MQTT broker closed the connection".to_string());
        };
        for p in packets {
            if let Ok(Inbound::Ack(ack)) = p {
                if !ack.accepted() {
                    return Err(format!("MQTT broker refused: {}", ack.describe()));
                }
                acked += 1;
                open = open.saturating_sub(1);
            }
        }
    }
    Ok(started.elapsed())
}
