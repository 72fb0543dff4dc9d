//! The Kafka output: the I/O side of one [`Output`] whose destination is a Kafka topic, through
//! librdkafka (`rdkafka`).
//!
//! The producer is idempotent (`enable.idempotence=true`, so within one producer session the
//! broker drops a retried batch it already has) and has no age limit (`message.timeout.ms=0`:
//! an outage never expires a record). The write key travels in the `write-key` header. Many
//! deliveries are in flight at once (the output's window), each awaited as its own future.
//!
//! Outcomes: a delivery report without error is `delivered`; a broker error that refuses this
//! record while others succeed (message too large, invalid or corrupt record, policy violation),
//! or a record librdkafka will not send at all (too large for `message.max.bytes`: it never
//! left the machine), is a counted refusal; anything else (a purged or failed session, a
//! transport error surfacing as a delivery error) ends *every* open attempt `possibly_sent` and
//! starts a new producer session only after a data-free probe (a metadata request for the
//! topic) answers. During a cut nothing is resent by the engine: librdkafka keeps the open
//! attempts' batches and retries them under the same producer id and sequence numbers, which
//! an idempotent broker deduplicates. Declared promise: `at_least_once` (a new producer session
//! after a crash or a lost session may add a copy, carrying the same write key).

use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::config::OutputConfig;
use super::journal::{Journal, ToOutput};
use super::log::StoredRecord;
use super::output::{Answer, Output};
use super::session::OutputSide;
use super::stats::publish_stats;

#[cfg(feature = "mutants")]
use super::mutant::{self, Mutant};

/// The producer settings the rules above need (SASL from the environment when the output
/// names credentials; a variable that is not set leaves them out and the broker refuses).
fn producer_config(cfg: &OutputConfig, name: &str) -> ClientConfig {
    let secrets = cfg.credentials.read().unwrap_or_default();
    let mut config = crate::brokers::kafka_config(&cfg.address.to_string(), &secrets);
    config.set("client.id", name);
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "0");
    #[cfg(feature = "mutants")]
    if mutant::is(Mutant::ResendOnTimer) {
        // MUTANT: the broker no longer drops a batch librdkafka retries (and the timer's
        // resends, made by the state machine, are new messages anyway).
        config.set("enable.idempotence", "false");
    }
    config
        .set("socket.keepalive.enable", "true")
        .set(
            "socket.connection.setup.timeout.ms",
            cfg.answer_timeout.0.as_millis().max(1000).to_string(),
        )
        .set("reconnect.backoff.ms", "100")
        .set("reconnect.backoff.max.ms", "1000")
        .set("linger.ms", "5");
    config
}

/// Builds a producer and probes: a metadata request for the topic and its answer. Writes no
/// data.
pub(super) async fn connect_and_probe(
    cfg: &OutputConfig,
    name: &str,
) -> Result<FutureProducer, String> {
    let producer: FutureProducer = producer_config(cfg, name)
        .create()
        .map_err(|e| format!("cannot make a producer: {e}"))?;
    let probe = producer.clone();
    let topic = cfg.topic.clone();
    let limit = cfg.answer_timeout.0;
    let metadata =
        tokio::task::spawn_blocking(move || probe.client().fetch_metadata(Some(&topic), limit))
            .await
            .map_err(|e| format!("metadata probe: {e}"))?
            .map_err(|e| format!("metadata probe: {e}"))?;
    match metadata.topics().first() {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(producer),
        Some(t) => Err(format!(
            "topic {} not usable: {:?}, {} partitions",
            cfg.topic,
            t.error(),
            t.partitions().len()
        )),
        None => Err(format!("no metadata for topic {}", cfg.topic)),
    }
}

/// Answers handled in one go before the loop sends more.
const ANSWERS_AT_ONCE: usize = 4096;

/// What became of one produce.
enum Outcome {
    Answer(Answer),
    /// Nothing certain came back: the session is to be treated as lost.
    SessionLost(String),
}

/// One record as a Kafka produce: the write key as message key and `write-key` header.
fn produce<'a>(topic: &'a str, record: &'a StoredRecord) -> FutureRecord<'a, str, str> {
    let headers = OwnedHeaders::new().insert(Header {
        key: "write-key",
        value: Some(record.key.as_str()),
    });
    FutureRecord::to(topic)
        .payload(record.data.as_str())
        .key(record.key.as_str())
        .headers(headers)
}

/// Broker (or client) errors that refuse this one record while others go through.
fn refuses_the_record(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::PolicyViolation
            | RDKafkaErrorCode::InvalidRequiredAcks
    )
}

fn classify(error: &KafkaError) -> Outcome {
    match error.rdkafka_error_code() {
        Some(code) if refuses_the_record(code) => {
            Outcome::Answer(Answer::Refused(error.to_string()))
        }
        _ => Outcome::SessionLost(error.to_string()),
    }
}

/// The I/O side of one Kafka output. Runs until `cancel` fires or the ingest channel closes.
pub(super) async fn drive_kafka(
    mut out: Output,
    cfg: OutputConfig,
    index: usize,
    mut rx: mpsc::UnboundedReceiver<ToOutput>,
    mut journal: Journal,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let name = cfg
        .client_id
        .clone()
        .unwrap_or_else(|| format!("drill-engine-{}", cfg.name));
    let mut said_down = false;
    publish_stats(&shared, index, &out, false);
    loop {
        let mut side = OutputSide {
            out: &mut out,
            index,
            rx: &mut rx,
            journal: &mut journal,
            shared: &shared,
        };
        let Some(producer) = side
            .connect(&cfg.name, &mut said_down, &cancel, || {
                connect_and_probe(&cfg, &name)
            })
            .await
        else {
            break;
        };
        publish_stats(&shared, index, &out, true);
        let mut in_flight = FuturesUnordered::new();
        let mut sends = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let lost: String = 'session: loop {
            journal.refill(&mut out);
            out.next_attempts_into(std::time::Instant::now(), &mut sends);
            for (tag, record) in sends.drain(..) {
                match producer.send_result(produce(&cfg.topic, &record)) {
                    Ok(delivery) => in_flight.push(
                        async move {
                            let outcome = match delivery.await {
                                Ok(Ok(_)) => Outcome::Answer(Answer::Accepted),
                                Ok(Err((e, _))) => classify(&e),
                                Err(_) => {
                                    Outcome::SessionLost("delivery report dropped".to_string())
                                }
                            };
                            (tag, outcome)
                        }
                        .boxed(),
                    ),
                    Err((e, _)) => match classify(&e) {
                        Outcome::Answer(answer) => {
                            journal.record(out.on_answer(tag, answer, std::time::Instant::now()));
                        }
                        Outcome::SessionLost(why) => break 'session why,
                    },
                }
            }
            let due = out.next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break "engine stopping".to_string(),
                Some(first) = in_flight.next(), if !in_flight.is_empty() => {
                    // Every answer already in is handled now, and costs one write of delivery
                    // marks, not one per record.
                    let mut next = Some(first);
                    let mut gone = None;
                    let mut handled = 0;
                    while let Some((tag, outcome)) = next {
                        match outcome {
                            Outcome::Answer(answer) => {
                                journal.record(out.on_answer(tag, answer, std::time::Instant::now()));
                            }
                            Outcome::SessionLost(why) => {
                                gone = Some(why);
                                break;
                            }
                        }
                        handled += 1;
                        next = if handled < ANSWERS_AT_ONCE {
                            in_flight.next().now_or_never().flatten()
                        } else {
                            None
                        };
                    }
                    journal.write_marks();
                    if let Some(why) = gone {
                        break why;
                    }
                }
                m = rx.recv() => match m {
                    Some(m) => journal.take(&shared.data_dir, &mut out, m),
                    None => break "ingest closed".to_string(),
                },
                _ = async { if let Some(d) = due { tokio::time::sleep_until(d).await } }, if due.is_some() => {}
                _ = tick.tick() => {
                    journal.housekeeping(&out, &shared, index);
                }
            }
        };
        // Whatever is still in flight has no certain answer: possibly sent, held, and sent
        // again (same write key) only after the next probe, by a new producer session.
        drop(in_flight);
        journal.end_session(&mut out, &shared, index, &lost);
        drop(producer);
        if cancel.is_cancelled() {
            break;
        }
        eprintln!(
            "drill engine: output {}: producer session lost: {lost}",
            cfg.name
        );
        said_down = true;
    }
    journal.sync();
    publish_stats(&shared, index, &out, false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::OutputKind;

    /// The settings that keep DESIGN.md §1 with librdkafka, pinned: change one and this fails.
    #[test]
    fn the_producer_keeps_the_rules() {
        let cfg = OutputConfig {
            kind: OutputKind::Kafka,
            ..OutputConfig::mqtt("k", "127.0.0.1:19092".parse().unwrap(), "t")
        };
        let config = producer_config(&cfg, "drill-engine-k");
        let get = |key: &str| config.get(key);
        // §1.1: no age limit, not even in the client library.
        assert_eq!(get("message.timeout.ms"), Some("0"));
        // A retried batch is dropped by the broker, not stored twice; and it is stored only
        // once every in-sync replica has it.
        assert_eq!(get("enable.idempotence"), Some("true"));
        assert_eq!(get("acks"), Some("all"));
        // Only through the link in front of the broker.
        assert_eq!(get("bootstrap.servers"), Some("127.0.0.1:19092"));
        // Nothing that bounds retries or delivery time, or lets batches overtake each other,
        // under another name (librdkafka's aliases): its defaults under idempotence keep the
        // rules (unbounded retries, at most 5 requests in flight, in order).
        for key in [
            "delivery.timeout.ms",
            "request.required.acks",
            "retries",
            "message.send.max.retries",
            "max.in.flight",
            "max.in.flight.requests.per.connection",
        ] {
            assert_eq!(get(key), None, "{key} is set");
        }
    }
}
