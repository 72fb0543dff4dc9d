//! The NATS JetStream output: the I/O side of one [`Output`] whose destination is a stream.
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

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::config::OutputConfig;
use super::journal::{Journal, ToOutput};
use super::output::{Answer, Output};
use super::session::OutputSide;
use super::stats::publish_stats;

/// Connects and probes: a JetStream account-info request and its answer. Writes no data.
pub(super) async fn connect_and_probe(
    cfg: &OutputConfig,
    name: &str,
) -> Result<jetstream::Context, String> {
    let limit = cfg.answer_timeout.0;
    let secrets = cfg.credentials.read()?;
    let options = crate::brokers::nats_options(&secrets)
        .await?
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

/// Handles one answer from the inbox: the attempt it names gets its outcome. `Err` when the
/// connection is to be treated as lost.
fn answer(
    out: &mut Output,
    journal: &mut Journal,
    message: &async_nats::Message,
) -> Result<(), String> {
    let Some(tag) = tag_of(&message.subject) else {
        return Ok(());
    };
    match classify(message) {
        Outcome::Answer(answer) => {
            journal.record(out.on_answer(tag, answer, std::time::Instant::now()));
            Ok(())
        }
        Outcome::LinkLost(why) => Err(why),
    }
}

/// The I/O side of one JetStream output. Runs until `cancel` fires or the ingest channel closes.
pub(super) async fn drive_nats(
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
    let subject = async_nats::Subject::from(cfg.topic.as_str());
    let answer_timeout = cfg.answer_timeout.0;
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
        let connected = side
            .connect(&cfg.name, &mut said_down, &cancel, || async {
                let client = connect_and_probe(&cfg, &name).await?.client();
                let inbox = Inbox::open(&client).await?;
                Ok((client, inbox))
            })
            .await;
        let Some((client, mut inbox)) = connected else {
            break;
        };
        publish_stats(&shared, index, &out, true);
        let mut sends = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let lost: String = 'conn: loop {
            journal.refill(&mut out);
            out.next_attempts_into(std::time::Instant::now(), &mut sends);
            for (tag, record) in sends.drain(..) {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, record.key.as_str());
                let payload = bytes::Bytes::copy_from_slice(record.data.as_bytes());
                let reply = inbox.reply(tag);
                match client
                    .publish_with_reply_and_headers(subject.clone(), reply, headers, payload)
                    .await
                {
                    Ok(()) => {}
                    Err(e)
                        if e.kind() == async_nats::client::PublishErrorKind::MaxPayloadExceeded =>
                    {
                        // It never left the machine: the server's limit refuses it.
                        let now = std::time::Instant::now();
                        journal.record(out.on_answer(tag, Answer::Refused(e.to_string()), now));
                    }
                    Err(e) => break 'conn format!("publish: {e}"),
                }
            }
            let due = out.next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break "engine stopping".to_string(),
                first = inbox.answers.next() => {
                    let Some(first) = first else {
                        break "the inbox subscription ended".to_string();
                    };
                    // Every answer already in is handled now, and costs one write of delivery
                    // marks, not one per record.
                    let mut next = Some(first);
                    let mut gone = None;
                    let mut handled = 0;
                    while let Some(message) = next {
                        if let Err(why) = answer(&mut out, &mut journal, &message) {
                            gone = Some(why);
                            break;
                        }
                        handled += 1;
                        next = if handled < ANSWERS_AT_ONCE {
                            inbox.answers.next().now_or_never().flatten()
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
                    if matches!(client.connection_state(), async_nats::connection::State::Disconnected) {
                        break "connection lost".to_string();
                    }
                    let waited = out.oldest_open_waited(std::time::Instant::now());
                    if waited.is_some_and(|w| w > answer_timeout) {
                        break format!("no PubAck within {answer_timeout:?}");
                    }
                    journal.housekeeping(&out, &shared, index);
                }
            }
        };
        // Whatever is still open has no certain answer: possibly sent, held, and sent again
        // (same message id) only after the next probe.
        journal.end_session(&mut out, &shared, index, &lost);
        drop(inbox);
        drop(client);
        if cancel.is_cancelled() {
            break;
        }
        eprintln!("drill engine: output {}: connection lost: {lost}", cfg.name);
        said_down = true;
    }
    journal.sync();
    publish_stats(&shared, index, &out, false);
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
