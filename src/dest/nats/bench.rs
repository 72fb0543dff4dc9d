//! The JetStream side of `drill bench engine`: nats-server as a local process advertising the
//! bench's link, a stream per run, and async-nats publishes with acks as the raw client.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

use crate::credentials::Secrets;
use crate::dest::bench::{on_own_runtime, raw_key};
use crate::dest::{BenchAt, BenchBroker, BenchKind, BenchRun, DestError, Done, RawRun};

/// The kind's bench side.
pub struct NatsBench;

fn stream_name(who: &str, round: usize) -> String {
    format!("{}{round}", who.to_uppercase())
}

impl BenchKind for NatsBench {
    fn start<'a>(&'a self, at: BenchAt<'a>) -> BoxFuture<'a, Result<BenchBroker, DestError>> {
        let started = super::broker::start_nats(at.dir, Some(at.port), Some(at.advertise), None);
        async move { Ok(started.await?.into()) }.boxed()
    }

    fn fresh<'a>(&'a self, run: BenchRun<'a>) -> BoxFuture<'a, Result<String, String>> {
        let BenchRun {
            broker, who, round, ..
        } = run;
        async move {
            let subject = format!("bench.{who}.{round}");
            let window = Duration::from_secs(120);
            let name = stream_name(who, round);
            super::stream::create_stream(broker, &name, &subject, window, None, 1, None)
                .await
                .map_err(|e| e.to_string())?;
            Ok(subject)
        }
        .boxed()
    }

    fn done_with<'a>(&'a self, run: BenchRun<'a>, _topic: &'a str) -> BoxFuture<'a, Done> {
        let BenchRun {
            broker, who, round, ..
        } = run;
        async move {
            let name = stream_name(who, round);
            super::stream::delete(broker, &name, &Secrets::default(), None).await
        }
        .boxed()
    }

    fn raw_client(&self, run: RawRun) -> BoxFuture<'static, Result<Duration, String>> {
        on_own_runtime(raw_nats(run))
    }
}

/// async-nats JetStream publishes with `Nats-Msg-Id`, `window` acks awaited at once.
async fn raw_nats(run: RawRun) -> Result<Duration, String> {
    let (addr, subject, records, window) = (run.addr, run.topic.as_str(), run.records, run.window);
    let (record_bytes, record_line) = (run.bytes, run.line);
    use async_nats::jetstream::{self, message::PublishMessage};
    let client = async_nats::ConnectOptions::new()
        .ignore_discovered_servers()
        .connect(format!("nats://{addr}"))
        .await
        .map_err(|e| e.to_string())?;
    let js = jetstream::new(client);
    let started = Instant::now();
    let mut acks = FuturesUnordered::new();
    let mut sent = 0u64;
    let mut acked = 0u64;
    while acked < records {
        while acks.len() < window && sent < records {
            let publish = PublishMessage::build()
                .payload(bytes::Bytes::from(
                    record_line(sent, record_bytes).into_bytes(),
                ))
                .message_id(raw_key(sent));
            let ack = js
                .send_publish(subject.to_string(), publish)
                .await
                .map_err(|e| e.to_string())?;
            acks.push(ack.into_future());
            sent += 1;
        }
        match acks.next().await {
            Some(Ok(_)) => acked += 1,
            Some(Err(e)) => return Err(e.to_string()),
            None => break,
        }
    }
    Ok(started.elapsed())
}
