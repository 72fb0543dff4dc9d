//! The engine's NATS JetStream sink: the I/O side of an output whose destination is a stream.
//!
//! Each record is published with `Nats-Msg-Id` = its write key, so the stream's duplicate window
//! turns a resend into `duplicate: true` instead of a second copy: the output declares
//! `effectively_once` (within the window). Many publishes are in flight at once (the output's
//! window). Each goes out with a reply subject of its own, `<inbox>.<tag>` (the attempt's tag),
//! under one inbox subscription per connection: the PubAck names the attempt it answers. This is
//! the JetStream publish protocol itself, without a future, a timer and a channel per publish
//! (what `jetstream::Context::send_publish` adds; they cost more CPU than the rest of a
//! delivery, `drill bench engine` shows).
//!
//! Outcomes: a PubAck (duplicate or not) is `delivered`; a JetStream API error for this record
//! while the connection works (e.g. the stream's `max_msg_size`), or a payload the server's
//! `max_payload` forbids (it never left the machine), is a counted refusal; an attempt left
//! unanswered for the answer timeout, a lost connection or no responders ends *every* open
//! attempt `possibly_sent` and drops the connection: the next one is made only after a
//! data-free probe (a JetStream account-info round trip) answers, and the held records go again
//! with the same message ids. The client is built so that it
//! cannot route around the proxy (`ignore_discovered_servers`) and never reconnects on its own
//! (a reconnect would flush its buffered publishes without the output's say): this output
//! decides when to connect.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::{FutureExt, StreamExt};

use crate::engine::OutputConfig;
use crate::engine::output::Answer;
use crate::engine::sink::{Answers, Attempts, Connect, Open, Session, Sink, Tick};
use crate::promise::Promise;

/// The JetStream sink (stateless: everything is in the output's config).
#[derive(Clone, Copy)]
pub struct NatsSink;

/// Connects and probes: a JetStream account-info request and its answer. Writes no data.
pub async fn connect_and_probe(
    cfg: &OutputConfig,
    name: &str,
) -> Result<jetstream::Context, String> {
    let limit = cfg.answer_timeout.0;
    let secrets = cfg.credentials.read()?;
    let tls = cfg.client_tls()?;
    let options = super::with_tls(super::options(&secrets), tls.as_ref())
        .name(name)
        .ignore_discovered_servers()
        .ping_interval(cfg.keepalive.0)
        .connection_timeout(limit)
        .request_timeout(Some(limit))
        .max_reconnects(Some(0));
    let servers: Vec<async_nats::ServerAddr> = std::iter::once(cfg.address)
        .chain(cfg.more_addresses.iter().copied())
        .map(|a| {
            format!("nats://{a}")
                .parse()
                .map_err(|e| format!("server address {a}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let client = tokio::time::timeout(limit, options.connect(servers))
        .await
        .map_err(|_| format!("no connection within {limit:?}"))?
        .map_err(|e| e.to_string())?;
    let js = jetstream::new(client);
    tokio::time::timeout(limit, js.query_account())
        .await
        .map_err(|_| format!("no account-info answer within {limit:?}"))?
        .map_err(|e| format!("account-info probe: {e}"))?;
    Ok(js)
}

/// Answers handled in one go before the loop sends more.
const ANSWERS_AT_ONCE: usize = 4096;

/// What became of one publish.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Answer(Answer),
    /// Nothing certain came back: the connection is to be treated as lost.
    LinkLost(String),
}

/// The part of a JetStream publish answer the outcome depends on: `{"stream": .., "seq": ..}`
/// for a stored (or duplicate) message, `{"error": {..}}` for a refusal.
#[derive(serde::Deserialize)]
struct PubAckAnswer {
    #[serde(default)]
    error: Option<jetstream::Error>,
    #[serde(default)]
    stream: Option<serde::de::IgnoredAny>,
}

/// What a message on the inbox says about the attempt it answers, the way
/// `jetstream::context::PublishAckFuture` reads it: no responders means no stream captures the
/// subject (nothing certain: the connection is dropped, as for a timeout); an API error answers
/// this record (`wrong last sequence` / `message id` are not asked for here, and treated as
/// lost like async-nats' own kinds); anything else unreadable is the server refusing it.
fn classify(message: &async_nats::Message) -> Outcome {
    if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
        return Outcome::LinkLost("no responders: no stream captures the subject".to_string());
    }
    match serde_json::from_slice::<PubAckAnswer>(&message.payload) {
        Ok(PubAckAnswer {
            error: Some(error), ..
        }) => match error.error_code() {
            jetstream::ErrorCode::STREAM_WRONG_LAST_MESSAGE_ID
            | jetstream::ErrorCode::STREAM_WRONG_LAST_SEQUENCE => {
                Outcome::LinkLost(error.to_string())
            }
            _ => Outcome::Answer(Answer::Refused(error.to_string())),
        },
        Ok(PubAckAnswer {
            stream: Some(_), ..
        }) => Outcome::Answer(Answer::Accepted),
        Ok(_) => Outcome::Answer(Answer::Refused(format!(
            "not a publish answer: {}",
            String::from_utf8_lossy(&message.payload)
        ))),
        Err(e) => Outcome::Answer(Answer::Refused(format!(
            "unreadable publish answer ({e}): {}",
            String::from_utf8_lossy(&message.payload)
        ))),
    }
}

/// The tag of the attempt a message on `<inbox>.<tag>` answers.
fn tag_of(subject: &str) -> Option<u16> {
    subject.rsplit_once('.')?.1.parse().ok()
}

/// A connection's inbox: one subscription to `<inbox>.*`, and the reply subject of each tag
/// made once.
struct Inbox {
    answers: async_nats::Subscriber,
    prefix: String,
    replies: Vec<Option<async_nats::Subject>>,
}

impl Inbox {
    async fn open(client: &async_nats::Client) -> Result<Inbox, String> {
        let prefix = client.new_inbox();
        let answers = client
            .subscribe(format!("{prefix}.*"))
            .await
            .map_err(|e| format!("inbox subscription: {e}"))?;
        // A flush makes the server take the subscription before the first publish.
        client
            .flush()
            .await
            .map_err(|e| format!("inbox subscription: {e}"))?;
        Ok(Inbox {
            answers,
            prefix,
            replies: vec![None; usize::from(u16::MAX) + 1],
        })
    }

    fn reply(&mut self, tag: u16) -> async_nats::Subject {
        let prefix = &self.prefix;
        self.replies[usize::from(tag)]
            .get_or_insert_with(|| async_nats::Subject::from(format!("{prefix}.{tag}")))
            .clone()
    }
}

impl Sink for NatsSink {
    type Session = NatsSession;

    const PROMISE: (Promise, &'static str) = (
        Promise::EffectivelyOnce,
        "a JetStream output keeps `effectively_once` only within the stream's duplicate window",
    );

    /// JetStream publishes awaiting their acks.
    const DEFAULT_WINDOW: usize = 4096;
    const TLS: bool = true;

    async fn connect<'a>(&'a self, to: Connect<'a>) -> Result<NatsSession, String> {
        let client = connect_and_probe(to.cfg, to.client_id).await?.client();
        let inbox = Inbox::open(&client).await?;
        Ok(NatsSession {
            subject: async_nats::Subject::from(to.cfg.topic.as_str()),
            answer_timeout: to.cfg.answer_timeout.0,
            client,
            inbox,
        })
    }
}

/// One connection: the client, its inbox, the subject the stream captures.
pub struct NatsSession {
    client: async_nats::Client,
    inbox: Inbox,
    subject: async_nats::Subject,
    answer_timeout: Duration,
}

impl Session for NatsSession {
    async fn send(&mut self, attempts: &mut Attempts, answers: &mut Answers) -> Result<(), String> {
        for (tag, record) in attempts.drain(..) {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, record.key.as_str());
            let payload = bytes::Bytes::copy_from_slice(record.data.as_bytes());
            let reply = self.inbox.reply(tag);
            let published = self
                .client
                .publish_with_reply_and_headers(self.subject.clone(), reply, headers, payload)
                .await;
            match published {
                Ok(()) => {}
                Err(e) if e.kind() == async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                    // It never left the machine: the server's limit refuses it.
                    answers.push((tag, Answer::Refused(e.to_string())));
                }
                Err(e) => return Err(format!("publish: {e}")),
            }
        }
        Ok(())
    }

    async fn answers(&mut self, into: &mut Answers) -> Result<(), String> {
        let Some(first) = self.inbox.answers.next().await else {
            return Err("the inbox subscription ended".to_string());
        };
        // Every answer already in is taken now, and costs one write of delivery marks, not
        // one per record.
        let mut next = Some(first);
        let mut handled = 0;
        while let Some(message) = next {
            if let Some(tag) = tag_of(&message.subject) {
                match classify(&message) {
                    Outcome::Answer(answer) => into.push((tag, answer)),
                    Outcome::LinkLost(why) => return Err(why),
                }
            }
            handled += 1;
            next = if handled < ANSWERS_AT_ONCE {
                self.inbox.answers.next().now_or_never().flatten()
            } else {
                None
            };
        }
        Ok(())
    }

    fn tick(&mut self, _now: Instant, open: Open) -> impl Future<Output = Tick> + Send {
        let state = self.client.connection_state();
        let limit = self.answer_timeout;
        async move {
            if matches!(state, async_nats::connection::State::Disconnected) {
                return Tick::Lost("connection lost".to_string());
            }
            if open.oldest_waited.is_some_and(|w| w > limit) {
                return Tick::Lost(format!("no PubAck within {limit:?}"));
            }
            Tick::Fine
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer_on(
        subject: &str,
        payload: &str,
        status: Option<async_nats::StatusCode>,
    ) -> async_nats::Message {
        async_nats::Message {
            subject: subject.into(),
            reply: None,
            payload: bytes::Bytes::copy_from_slice(payload.as_bytes()),
            headers: None,
            status,
            description: None,
            length: payload.len(),
        }
    }

    #[test]
    fn the_inbox_subject_names_the_attempt() {
        assert_eq!(tag_of("_INBOX.abc123.42"), Some(42));
        assert_eq!(tag_of("_INBOX.abc123.65535"), Some(65535));
        assert_eq!(tag_of("_INBOX.abc123.65536"), None);
        assert_eq!(tag_of("_INBOX.abc123.x"), None);
        assert_eq!(tag_of("nodots"), None);
    }

    /// The answers nats-server gives, read as `PublishAckFuture` reads them.
    #[test]
    fn publish_answers_are_classified_like_async_nats() {
        let on = |payload: &str| classify(&answer_on("_INBOX.i.1", payload, None));
        assert_eq!(
            on(r#"{"stream":"S","seq":7}"#),
            Outcome::Answer(Answer::Accepted)
        );
        assert_eq!(
            on(r#"{"stream":"S","seq":7,"duplicate":true}"#),
            Outcome::Answer(Answer::Accepted),
            "a duplicate is the copy the stream has: delivered"
        );
        let Outcome::Answer(Answer::Refused(words)) = on(
            r#"{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"},"stream":"S","seq":0}"#,
        ) else {
            panic!("an API error refuses the record");
        };
        assert!(words.contains("maximum allowed"), "{words}");
        assert!(matches!(
            on(r#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}"#),
            Outcome::LinkLost(_)
        ));
        assert!(matches!(
            on("not json"),
            Outcome::Answer(Answer::Refused(_))
        ));
        assert!(matches!(on("{}"), Outcome::Answer(Answer::Refused(_))));
        assert!(matches!(
            classify(&answer_on(
                "_INBOX.i.1",
                "",
                Some(async_nats::StatusCode::NO_RESPONDERS)
            )),
            Outcome::LinkLost(_)
        ));
    }
}
