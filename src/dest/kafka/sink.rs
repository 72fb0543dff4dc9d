//! The engine's Kafka sink: the I/O side of an output whose destination is a Kafka topic,
//! through librdkafka (`rdkafka`).
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

use std::time::Instant;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::engine::OutputConfig;
use crate::engine::log::StoredRecord;
use crate::engine::output::Answer;
use crate::engine::sink::{Answers, Attempts, Connect, Open, Session, Sink, Tick};
use crate::promise::Promise;

#[cfg(feature = "mutants")]
use crate::engine::mutant::{self, Mutant};

/// The Kafka sink (stateless: everything is in the output's config).
#[derive(Clone, Copy)]
pub struct KafkaSink;

/// The producer settings the rules above need (SASL from the environment when the output
/// names credentials; a variable that is not set leaves them out and the broker refuses).
fn producer_config(cfg: &OutputConfig, name: &str) -> ClientConfig {
    let secrets = cfg.credentials.read().unwrap_or_default();
    let mut config = super::client_config(&cfg.address.to_string(), &secrets);
    config.set("client.id", name);
    if let Some(tls) = &cfg.tls {
        with_tls(&mut config, tls);
    }
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
        // A request (a produce too) unanswered this long times out, and librdkafka drops the
        // connection (`socket.max.fails` = 1) and retries the batch on a new one under the same
        // producer id and sequence: a connection gone silent (a strand) is noticed within the
        // answer timeout instead of librdkafka's 60 s, and the broker still drops a retried
        // batch it has. (Ending the session here instead, as the other kinds do, would give up
        // the producer id and make copies after a half-open link: `kafka-half-open` found it.)
        .set(
            "socket.timeout.ms",
            cfg.answer_timeout.0.as_millis().max(1000).to_string(),
        )
        .set("reconnect.backoff.ms", "100")
        .set("reconnect.backoff.max.ms", "1000")
        .set("linger.ms", "5");
    config
}

/// TLS through librdkafka's OpenSSL (feature `kafka-tls`): the output's CA, and its client
/// certificate under mutual TLS. The broker's name is checked (`https`) against the address
/// dialled, or `server_name` when given.
fn with_tls(config: &mut ClientConfig, tls: &crate::tls::TlsConfig) {
    let sasl = config
        .get("security.protocol")
        .is_some_and(|p| p.starts_with("SASL"));
    config
        .set("security.protocol", if sasl { "SASL_SSL" } else { "SSL" })
        .set("ssl.ca.location", tls.ca_file.display().to_string())
        .set("ssl.endpoint.identification.algorithm", "https");
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        config
            .set("ssl.certificate.location", cert.display().to_string())
            .set("ssl.key.location", key.display().to_string());
    }
}

/// Builds a producer and probes: a metadata request for the topic and its answer. Writes no
/// data.
pub async fn connect_and_probe(cfg: &OutputConfig, name: &str) -> Result<FutureProducer, String> {
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

impl Sink for KafkaSink {
    type Session = KafkaSession;

    /// librdkafka speaks TLS only through OpenSSL: in builds with the feature `kafka-tls`.
    const TLS: bool = cfg!(feature = "kafka-tls");
    const NO_TLS: &'static str = "`tls`: this build of drill speaks no TLS to Kafka (librdkafka needs OpenSSL): build it with `--features kafka-tls` (the release archives and wheels have it)";

    const PROMISE: (Promise, &'static str) = (
        Promise::AtLeastOnce,
        "a Kafka output keeps `at_least_once` (a new producer session after a crash may add a copy)",
    );

    /// Kafka records in the producer's batches.
    const DEFAULT_WINDOW: usize = 16_384;

    const SESSION: &'static str = "producer session";

    async fn connect<'a>(&'a self, to: Connect<'a>) -> Result<KafkaSession, String> {
        Ok(KafkaSession {
            producer: connect_and_probe(to.cfg, to.client_id).await?,
            topic: to.cfg.topic.clone(),
            in_flight: FuturesUnordered::new(),
        })
    }
}

/// One producer session: the producer and the deliveries it has not answered yet.
pub struct KafkaSession {
    /// Dropped last (after the deliveries in flight): a new session is a new producer.
    in_flight: FuturesUnordered<BoxFuture<'static, (u16, Outcome)>>,
    producer: FutureProducer,
    topic: String,
}

impl Session for KafkaSession {
    async fn send(&mut self, attempts: &mut Attempts, answers: &mut Answers) -> Result<(), String> {
        for (tag, record) in attempts.drain(..) {
            match self.producer.send_result(produce(&self.topic, &record)) {
                Ok(delivery) => self.in_flight.push(
                    async move {
                        let outcome = match delivery.await {
                            Ok(Ok(_)) => Outcome::Answer(Answer::Accepted),
                            Ok(Err((e, _))) => classify(&e),
                            Err(_) => Outcome::SessionLost("delivery report dropped".to_string()),
                        };
                        (tag, outcome)
                    }
                    .boxed(),
                ),
                Err((e, _)) => match classify(&e) {
                    Outcome::Answer(answer) => answers.push((tag, answer)),
                    Outcome::SessionLost(why) => return Err(why),
                },
            }
        }
        Ok(())
    }

    async fn answers(&mut self, into: &mut Answers) -> Result<(), String> {
        if self.in_flight.is_empty() {
            return std::future::pending().await;
        }
        let Some(first) = self.in_flight.next().await else {
            return std::future::pending().await;
        };
        // Every answer already in is taken now, and costs one write of delivery marks, not
        // one per record.
        let mut next = Some(first);
        let mut handled = 0;
        while let Some((tag, outcome)) = next {
            match outcome {
                Outcome::Answer(answer) => into.push((tag, answer)),
                Outcome::SessionLost(why) => return Err(why),
            }
            handled += 1;
            next = if handled < ANSWERS_AT_ONCE {
                self.in_flight.next().now_or_never().flatten()
            } else {
                None
            };
        }
        Ok(())
    }

    /// librdkafka keeps its own connections alive, drops one whose produce went unanswered for
    /// the answer timeout (`request.timeout.ms`), and retries the open batches itself (under the
    /// same producer id and sequence numbers); nothing to do here.
    async fn tick(&mut self, _now: Instant, _open: Open) -> Tick {
        Tick::Fine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings that keep docs/src/design.md#1-engine-rules with librdkafka, pinned: change
    /// one and this fails.
    #[test]
    fn the_producer_keeps_the_rules() {
        let cfg = OutputConfig::new("kafka", "k", "127.0.0.1:19092".parse().unwrap(), "t");
        let config = producer_config(&cfg, "drill-engine-k");
        let get = |key: &str| config.get(key);
        // docs/src/design.md#rule-1-1: no age limit, not even in the client library.
        assert_eq!(get("message.timeout.ms"), Some("0"));
        // A retried batch is dropped by the broker, not stored twice; and it is stored only
        // once every in-sync replica has it.
        assert_eq!(get("enable.idempotence"), Some("true"));
        assert_eq!(get("acks"), Some("all"));
        // Only through the link in front of the broker.
        assert_eq!(get("bootstrap.servers"), Some("127.0.0.1:19092"));
        // A silent connection is dropped after the answer timeout (a strand), and only then.
        assert_eq!(
            get("socket.timeout.ms").map(str::to_string),
            Some(cfg.answer_timeout.0.as_millis().max(1000).to_string())
        );
        assert_eq!(
            get("socket.max.fails"),
            None,
            "librdkafka's 1: a timeout disconnects"
        );
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
