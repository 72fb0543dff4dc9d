//! The engine's AMQP 0-9-1 sink: publisher confirms on one channel, each record published
//! persistent (`delivery_mode` 2) and `mandatory` to the drill's queue through the default
//! exchange, with its write key as `message_id`. The probe is the connection handshake, a
//! `confirm.select` and a passive `queue.declare` of the queue: data-free, and it fails while
//! the queue is missing.
//!
//! What each answer means (docs/src/destinations.md, "Which answers refuse a record"):
//!
//! - a confirm (`basic.ack`) with nothing returned: delivered;
//! - a confirm after a `basic.return` (312 NO_ROUTE: no queue took it — the queue was deleted)
//!   or a `basic.nack` (a `reject-publish` overflow, an internal error): **not now** — every
//!   answer already in is recorded, the session ends, and the record goes again after the
//!   backoff (no attempt spent, nothing counted);
//! - a `406 PRECONDITION_FAILED` channel close naming the size of one of the open publishes
//!   (RabbitMQ's `max_message_size`): that record is refused and counted; the channel is gone,
//!   so the session ends and the rest go again;
//! - `connection.blocked` (a memory or disk alarm): backpressure — while blocked, an open
//!   attempt waits for its confirm past the answer timeout, and nothing is counted;
//! - a lost channel or connection, a missed heartbeat, or no confirm within the answer
//!   timeout: every open attempt ends `possibly_sent`.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{FieldTable, ShortString};
use lapin::uri::{AMQPAuthority, AMQPQueryString, AMQPUri, AMQPUserInfo};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use crate::engine::OutputConfig;
use crate::engine::output::Answer;
use crate::engine::sink::{Answers, Attempts, Connect, Open, Session, Sink, Tick};
use crate::promise::Promise;

#[cfg(feature = "mutants")]
use crate::engine::mutant::{self, Mutant};

/// Whether publishes go out `mandatory` (not under the `no-mandatory` mutant).
fn mandatory() -> bool {
    #[cfg(feature = "mutants")]
    if mutant::is(Mutant::NoMandatory) {
        // MUTANT: an unroutable publish is confirmed and dropped.
        return false;
    }
    true
}

/// The AMQP sink (stateless: everything is in the output's config).
#[derive(Clone, Copy)]
pub struct AmqpSink;

/// Answers handled in one go before the loop sends more.
const ANSWERS_AT_ONCE: usize = 4096;

/// The output's broker as an AMQP URI: its address, its login (`guest` when it gives none),
/// the default virtual host, heartbeats every keepalive.
fn uri_of(cfg: &OutputConfig, login: Option<(&str, &str)>) -> AMQPUri {
    let (username, password) = login.unwrap_or(("guest", "guest"));
    AMQPUri {
        authority: AMQPAuthority {
            userinfo: AMQPUserInfo {
                username: username.to_string(),
                password: password.to_string(),
            },
            host: cfg.address.ip().to_string(),
            port: cfg.address.port(),
        },
        vhost: "/".to_string(),
        query: AMQPQueryString {
            heartbeat: Some(u16::try_from(cfg.keepalive.0.as_secs().max(1)).unwrap_or(60)),
            ..AMQPQueryString::default()
        },
        ..AMQPUri::default()
    }
}

/// Connects and probes: the handshake, `confirm.select`, and a passive declare of the queue.
/// Writes no data.
pub async fn connect_and_probe(
    cfg: &OutputConfig,
    name: &str,
) -> Result<(Connection, Channel), String> {
    let limit = cfg.answer_timeout.0;
    let secrets = cfg.credentials.read()?;
    let props = ConnectionProperties::default().with_connection_name(name.into());
    let probe = async {
        let connection = Connection::connect_uri(uri_of(cfg, secrets.login()), props)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("channel: {e}"))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("confirm.select: {e}"))?;
        if !mandatory() {
            // MUTANT `no-mandatory`: "connected" is enough; the queue is never asked for.
            return Ok((connection, channel));
        }
        channel
            .queue_declare(
                cfg.topic.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("queue {}: {e}", cfg.topic))?;
        Ok::<_, String>((connection, channel))
    };
    tokio::time::timeout(limit, probe)
        .await
        .map_err(|_| format!("no AMQP handshake and queue answer within {limit:?}"))?
}

impl Sink for AmqpSink {
    type Session = AmqpSession;

    const PROMISE: (Promise, &'static str) = (
        Promise::AtLeastOnce,
        "AMQP has no deduplication: a publish whose confirm was lost is published again, a second copy",
    );

    /// Publishes awaiting their confirms.
    const DEFAULT_WINDOW: usize = 1024;

    async fn connect<'a>(&'a self, to: Connect<'a>) -> Result<AmqpSession, String> {
        let (connection, channel) = connect_and_probe(to.cfg, to.client_id).await?;
        Ok(AmqpSession {
            connection,
            channel,
            queue: to.cfg.topic.as_str().into(),
            answer_timeout: to.cfg.answer_timeout.0,
            confirms: FuturesUnordered::new(),
            sent: 0,
        })
    }
}

/// What came back for one publish: its tag, its body's size, the order it was sent in, and
/// the confirm (or why none).
type Confirmed = (u16, usize, u64, lapin::Result<Confirmation>);

/// One connection with one confirming channel.
pub struct AmqpSession {
    connection: Connection,
    channel: Channel,
    queue: ShortString,
    answer_timeout: Duration,
    confirms: FuturesUnordered<BoxFuture<'static, Confirmed>>,
    /// Publishes sent on this channel.
    sent: u64,
}

/// What one confirm says.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Answer(Answer),
    /// "Not now": the record goes again in a new session.
    Away(String),
    /// The channel or connection is gone; the size the broker named, when it refused one
    /// publish for its size.
    Lost { why: String, oversized: Option<usize> },
}

/// The size RabbitMQ names when `max_message_size` refuses a publish: "message size 5000 is
/// larger than configured max size 4096".
fn oversized(text: &str) -> Option<usize> {
    let rest = text.split("message size ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

fn classify(confirmed: lapin::Result<Confirmation>) -> Outcome {
    match confirmed {
        Ok(Confirmation::Ack(None)) => Outcome::Answer(Answer::Accepted),
        Ok(Confirmation::Ack(Some(returned))) => Outcome::Away(format!(
            "returned {} {}: no queue took it (not now)",
            returned.reply_code, returned.reply_text
        )),
        #[cfg(feature = "mutants")]
        Ok(Confirmation::Nack(_)) if mutant::is(Mutant::NackAsConfirm) => {
            // MUTANT: a nack read as a confirm.
            Outcome::Answer(Answer::Accepted)
        }
        Ok(Confirmation::Nack(_)) => {
            Outcome::Away("nacked: the broker did not take it (not now)".to_string())
        }
        Ok(Confirmation::NotRequested) => Outcome::Lost {
            why: "a publish without a confirm".to_string(),
            oversized: None,
        },
        Err(e) => {
            let oversized = match e.kind() {
                lapin::ErrorKind::ProtocolError(amqp)
                    if *amqp.kind() == AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) =>
                {
                    oversized(amqp.get_message().as_str())
                }
                _ => None,
            };
            Outcome::Lost {
                why: e.to_string(),
                oversized,
            }
        }
    }
}

impl Session for AmqpSession {
    async fn send(&mut self, attempts: &mut Attempts, _answers: &mut Answers) -> Result<(), String> {
        let limit = self.answer_timeout;
        for (tag, record) in attempts.drain(..) {
            let properties = BasicProperties::default()
                .with_message_id(record.key.as_str().into())
                .with_delivery_mode(2)
                .with_content_type("application/json".into());
            let options = BasicPublishOptions {
                mandatory: mandatory(),
                immediate: false,
            };
            let body = record.data.as_bytes();
            let publish =
                self.channel
                    .basic_publish("".into(), self.queue.clone(), options, body, properties);
            // Blocked by an alarm, the client holds the publish back: waiting is the answer.
            let mut publish = std::pin::pin!(publish);
            let confirm = loop {
                match tokio::time::timeout(limit, publish.as_mut()).await {
                    Ok(published) => break published.map_err(|e| format!("publish: {e}"))?,
                    Err(_) if self.connection.status().blocked() => {}
                    Err(_) => return Err(format!("a publish not written within {limit:?}")),
                }
            };
            let (size, order) = (body.len(), self.sent);
            self.sent += 1;
            self.confirms
                .push(async move { (tag, size, order, confirm.await) }.boxed());
        }
        Ok(())
    }

    async fn answers(&mut self, into: &mut Answers) -> Result<(), String> {
        let Some(first) = self.confirms.next().await else {
            return std::future::pending().await;
        };
        let mut next = Some(first);
        let mut handled = 0;
        let mut ended: Option<String> = None;
        // The publishes the channel's close ended, for the one the broker refused by size.
        let mut closed: Vec<(u16, usize, u64)> = Vec::new();
        let mut named: Option<usize> = None;
        while let Some((tag, size, order, confirmed)) = next {
            match classify(confirmed) {
                Outcome::Answer(answer) => into.push((tag, answer)),
                Outcome::Away(why) => {
                    ended.get_or_insert(why);
                }
                Outcome::Lost { why, oversized } => {
                    named = named.or(oversized);
                    closed.push((tag, size, order));
                    ended.get_or_insert(why);
                }
            }
            handled += 1;
            next = if handled < ANSWERS_AT_ONCE || ended.is_some() {
                self.confirms.next().now_or_never().flatten()
            } else {
                None
            };
        }
        if let Some(size) = named
            && let Some(&(tag, ..)) = closed
                .iter()
                .filter(|(_, s, _)| *s == size)
                .min_by_key(|(.., order)| *order)
        {
            into.push((
                tag,
                Answer::Refused(format!(
                    "406 PRECONDITION_FAILED: message size {size} is larger than the broker's max_message_size"
                )),
            ));
        }
        match ended {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    fn tick(&mut self, _now: Instant, open: Open) -> impl Future<Output = Tick> + Send {
        let status = self.connection.status();
        let (gone, blocked) = (
            !status.connected() || !self.channel.status().connected(),
            status.blocked(),
        );
        let limit = self.answer_timeout;
        async move {
            if gone {
                return Tick::Lost("connection or channel closed".to_string());
            }
            // Blocked by an alarm: the broker holds the publishes; waiting is the answer.
            if !blocked && open.oldest_waited.is_some_and(|w| w > limit) {
                return Tick::Lost(format!("no confirm within {limit:?}"));
            }
            Tick::Fine
        }
    }

    async fn close(&mut self) {
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            self.connection.close(200, "engine stopping".into()),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_rabbitmq_names_is_read() {
        assert_eq!(
            oversized("PRECONDITION_FAILED - message size 5000 is larger than configured max size 4096"),
            Some(5000)
        );
        assert_eq!(oversized("PRECONDITION_FAILED - inequivalent arg"), None);
    }

    #[test]
    fn a_plain_confirm_is_delivered() {
        assert_eq!(
            classify(Ok(Confirmation::Ack(None))),
            Outcome::Answer(Answer::Accepted)
        );
        assert!(matches!(
            classify(Ok(Confirmation::Nack(None))),
            Outcome::Away(_)
        ));
    }
}
