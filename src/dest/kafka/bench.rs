//! The Kafka side of `drill bench engine`: tansu as a local process advertising the bench's
//! link, a topic per run, and rdkafka's FutureProducer with the engine's settings as the raw
//! client.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

use crate::credentials::Secrets;
use crate::dest::bench::{on_own_runtime, raw_key};
use crate::dest::{BenchAt, BenchBroker, BenchKind, BenchRun, DestError, Done, RawRun};

/// The kind's bench side.
pub struct KafkaBench;

impl BenchKind for KafkaBench {
    fn start<'a>(&'a self, at: BenchAt<'a>) -> BoxFuture<'a, Result<BenchBroker, DestError>> {
        let started = super::broker::start_kafka(at.dir, Some(at.port), Some(at.advertise));
        async move { Ok(started.await?.into()) }.boxed()
    }

    fn fresh<'a>(&'a self, run: BenchRun<'a>) -> BoxFuture<'a, Result<String, String>> {
        let BenchRun {
            via, who, round, ..
        } = run;
        async move {
            let topic = format!("bench-{who}-{round}");
            super::topic::create_topic(via, &topic, 1)
                .await
                .map_err(|e| e.to_string())?;
            Ok(topic)
        }
        .boxed()
    }

    fn done_with<'a>(&'a self, run: BenchRun<'a>, topic: &'a str) -> BoxFuture<'a, Done> {
        let BenchRun { via, .. } = run;
        async move { super::topic::delete(via, topic, &Secrets::default()).await }.boxed()
    }

    fn raw_client(&self, run: RawRun) -> BoxFuture<'static, Result<Duration, String>> {
        on_own_runtime(raw_kafka(run))
    }
}

/// rdkafka's FutureProducer with the engine's settings (idempotent, acks=all, no message
/// timeout, linger 5 ms), the write key as key and header, `window` deliveries in flight.
async fn raw_kafka(run: RawRun) -> Result<Duration, String> {
    let (addr, topic, records, window) = (run.addr, run.topic.as_str(), run.records, run.window);
    let (record_bytes, record_line) = (run.bytes, run.line);
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", addr.to_string())
        .set("client.id", "bench-raw")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "0")
        .set("linger.ms", "5")
        .create()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut deliveries = FuturesUnordered::new();
    let mut sent = 0u64;
    let mut acked = 0u64;
    while acked < records {
        while deliveries.len() < window && sent < records {
            let key = raw_key(sent);
            let data = record_line(sent, record_bytes);
            let headers = OwnedHeaders::new().insert(Header {
                key: "write-key",
                value: Some(key.as_str()),
            });
            let record = FutureRecord::to(topic)
                .payload(data.as_str())
                .key(key.as_str())
                .headers(headers);
            match producer.send_result(record) {
                Ok(delivery) => deliveries.push(delivery),
                Err((e, _)) => return Err(e.to_string()),
            }
            sent += 1;
        }
        match deliveries.next().await {
            Some(Ok(Ok(_))) => acked += 1,
            Some(Ok(Err((e, _)))) => return Err(e.to_string()),
            Some(Err(_)) => return Err("delivery report dropped".to_string()),
            None => break,
        }
    }
    Ok(started.elapsed())
}
