//! The AMQP read-back: a consumer on the drill's quorum queue from before the first record,
//! straight from the node (never through the proxy). Each message is timed by its receipt
//! (the queue hands a message on as it stores it) and its write key is its `message_id`
//! property (or the header a user's engine names). At the end the reader reads on until the
//! queue holds nothing more; a queue left unread is a *verifier* fault, never engine loss.
//!
//! The reader acknowledges each message after recording it, so a message in flight when the
//! node goes down (a broker fault) is handed out again, marked `redelivered`, rather than lost
//! to the reader; such a redelivery of a message the reader already recorded (the same
//! `message_id` and body) is not counted again. The one copy this can hide is a second copy
//! whose own first delivery was cut off by the same restart.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use tokio_util::sync::CancellationToken;

use crate::dest::ReadBack;
use crate::verify::{Decoder, Received};

/// The property that carries the write key, as the built-in engine sets it.
pub const MESSAGE_ID: &str = "message_id";

/// How long the end of the read may wait for the queue to be empty.
const FINISH_LIMIT: Duration = Duration::from_secs(60);

/// What the consumer has read so far.
#[derive(Default)]
struct Read {
    received: Received,
    /// `(message_id, a hash of the body)` of every message recorded: a redelivery of one is not
    /// counted. A hash, not the body: an hour's soak at 200/s would hold every body twice.
    seen: HashSet<(Option<String>, u64)>,
    /// Redeliveries of recorded messages, not counted again.
    redelivered: u64,
}

/// A consumer on the drill's queue, reconnecting while the node is down.
pub struct QueueReader {
    addr: SocketAddr,
    queue: String,
    read: Arc<Mutex<Read>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl QueueReader {
    /// Starts consuming `queue` (it must exist) at `addr`; `t0` is the drill's start.
    pub fn start(
        addr: SocketAddr,
        queue: &str,
        decoder: Decoder,
        t0: Instant,
        cancel: CancellationToken,
    ) -> QueueReader {
        let read = Arc::new(Mutex::new(Read::default()));
        let stop = cancel.child_token();
        let task = tokio::spawn(consume(
            addr,
            queue.to_string(),
            decoder,
            t0,
            read.clone(),
            stop.clone(),
        ));
        QueueReader {
            addr,
            queue: queue.to_string(),
            read,
            stop,
            task,
        }
    }

    fn count_now(&self) -> usize {
        self.read
            .lock()
            .map(|r| r.received.arrivals.len())
            .unwrap_or(0)
    }
}

impl ReadBack for QueueReader {
    fn count(&self) -> BoxFuture<'_, Option<usize>> {
        let n = self.count_now();
        async move { Some(n) }.boxed()
    }

    fn finish(self: Box<Self>, addrs: Vec<SocketAddr>) -> BoxFuture<'static, Received> {
        async move {
            let addr = addrs.first().copied().unwrap_or(self.addr);
            let left = drained(addr, &self.queue).await;
            self.stop.cancel();
            let _ = self.task.await;
            let mut read = self
                .read
                .lock()
                .map(|mut r| std::mem::take(&mut *r))
                .unwrap_or_default();
            if let Err(why) = left {
                read.received.verifier_fault.get_or_insert(why);
            }
            read.received
        }
        .boxed()
    }
}

/// Waits until the queue holds no message the reader has not taken, and the reader has had a
/// moment to record what it took; `Err` says what was left.
async fn drained(addr: SocketAddr, queue: &str) -> Result<(), String> {
    let started = Instant::now();
    let mut last = String::from("no answer from the node");
    while started.elapsed() < FINISH_LIMIT {
        match super::queue::connect(addr).await {
            Ok(connection) => {
                let count = super::queue::count(&connection, queue).await;
                let _ = connection.close(200, "drill: counted".into()).await;
                match count {
                    Ok(0) => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        return Ok(());
                    }
                    Ok(n) => last = format!("{n} messages still in the queue"),
                    Err(e) => last = e,
                }
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "verifier: queue {queue} not read to its end within {} s: {last}",
        FINISH_LIMIT.as_secs()
    ))
}

/// Consumes until stopped, connecting again (every 250 ms) whenever the node is gone.
async fn consume(
    addr: SocketAddr,
    queue: String,
    decoder: Decoder,
    t0: Instant,
    read: Arc<Mutex<Read>>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let session = consume_once(addr, &queue, &decoder, t0, &read, &stop);
        if let Err(why) = session.await
            && let Ok(mut r) = read.lock()
        {
            // Remembered until a later session reads on: a reader that never came back says so.
            r.received.verifier_fault = Some(format!("verifier: queue {queue}: {why}"));
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// One connection's consumer: records and acknowledges each message until the connection ends
/// (`Err`) or the reader stops (`Ok`).
async fn consume_once(
    addr: SocketAddr,
    queue: &str,
    decoder: &Decoder,
    t0: Instant,
    read: &Mutex<Read>,
    stop: &CancellationToken,
) -> Result<(), String> {
    let connection = super::queue::connect(addr).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    channel
        .basic_qos(1000, BasicQosOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "drill-verifier".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("consuming: {e}"))?;
    if let Ok(mut r) = read.lock() {
        r.received.verifier_fault = None;
    }
    loop {
        let delivery = tokio::select! {
            _ = stop.cancelled() => {
                let _ = connection.close(200, "drill: read".into()).await;
                return Ok(());
            }
            d = consumer.next() => d,
        };
        let delivery = match delivery {
            Some(Ok(d)) => d,
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("the consumer ended".to_string()),
        };
        let at = t0.elapsed();
        let properties = &delivery.properties;
        if let Ok(mut r) = read.lock() {
            let key = (
                properties.message_id().as_ref().map(|m| m.to_string()),
                body_hash(&delivery.data),
            );
            let again = delivery.redelivered && r.seen.contains(&key);
            if again {
                r.redelivered += 1;
            } else {
                r.seen.insert(key);
                decoder.add(
                    &delivery.data,
                    |name| meta_of(properties, name),
                    at,
                    &mut r.received,
                );
            }
        }
        delivery
            .ack(BasicAckOptions::default())
            .await
            .map_err(|e| format!("ack: {e}"))?;
    }
}

/// A 64-bit hash of a message body (FxHash: fast, and a collision would need the same
/// `message_id` as well).
fn body_hash(body: &[u8]) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = rustc_hash::FxBuildHasher.build_hasher();
    h.write(body);
    h.finish()
}

/// A value of a message's metadata by name: `message_id`, else a header (text or bytes).
fn meta_of(properties: &lapin::BasicProperties, name: &str) -> Option<String> {
    if name == MESSAGE_ID {
        return properties.message_id().as_ref().map(|m| m.to_string());
    }
    let headers: &FieldTable = properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        AMQPValue::ByteArray(b) => Some(String::from_utf8_lossy(b.as_slice()).into_owned()),
        other => Some(format!("{other:?}")),
    }
}
