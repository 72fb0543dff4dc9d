//! The NATS JetStream output: the I/O side of one [`Output`] whose destination is a stream.
//!
//! Each record is published with `Nats-Msg-Id` = its write key, so the stream's duplicate window
//! turns a resend into `duplicate: true` instead of a second copy: the output declares
//! `effectively_once` (within the window). Many publishes are in flight at once (the output's
//! window), each awaited as its own future.
//!
//! Outcomes: a PubAck (duplicate or not) is `delivered`; a JetStream API error for this record
//! while the connection works (e.g. the stream's `max_msg_size`), or a payload the server's
//! `max_payload` forbids (it never left the machine), is a counted refusal; a timeout, a broken
//! pipe or no responders ends *every* open attempt `possibly_sent` and drops the connection: the
//! next one is made only after a data-free probe (a JetStream account-info round trip) answers,
//! and the held records go again with the same message ids. The client is built so that it
//! cannot route around the proxy (`ignore_discovered_servers`) and never reconnects on its own
//! (a reconnect would flush its buffered publishes without the output's say): this output
//! decides when to connect.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
use futures::stream::FuturesUnordered;
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
enum Outcome {
    Answer(Answer),
    /// Nothing certain came back: the connection is to be treated as lost.
    LinkLost(String),
}

fn classify(
    result: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
) -> Outcome {
    match result {
        Ok(_) => Outcome::Answer(Answer::Accepted),
        Err(e) => match e.kind() {
            PublishErrorKind::Other | PublishErrorKind::MaxPayloadExceeded => {
                Outcome::Answer(Answer::Refused(e.to_string()))
            }
            PublishErrorKind::TimedOut
            | PublishErrorKind::BrokenPipe
            | PublishErrorKind::StreamNotFound
            | PublishErrorKind::MaxAckPending
            | PublishErrorKind::WrongLastMessageId
            | PublishErrorKind::WrongLastSequence => Outcome::LinkLost(e.to_string()),
        },
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
        let Some(js) = side
            .connect(&cfg.name, &mut said_down, &cancel, || {
                connect_and_probe(&cfg, &name)
            })
            .await
        else {
            break;
        };
        publish_stats(&shared, index, &out, true);
        let mut in_flight = FuturesUnordered::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let lost: String = 'conn: loop {
            journal.refill(&mut out);
            for (tag, record) in out.next_attempts(std::time::Instant::now()) {
                let publish = PublishMessage::build()
                    .payload(bytes::Bytes::from(record.data.clone().into_bytes()))
                    .message_id(&record.key);
                match js.send_publish(cfg.topic.clone(), publish).await {
                    Ok(ack) => in_flight.push(async move { (tag, classify(ack.await)) }.boxed()),
                    Err(e) => match classify(Err(e)) {
                        Outcome::Answer(answer) => {
                            let now = std::time::Instant::now();
                            journal.record(out.on_answer(tag, answer, now));
                        }
                        Outcome::LinkLost(why) => break 'conn why,
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
                            Outcome::LinkLost(why) => {
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
                    if matches!(js.client().connection_state(), async_nats::connection::State::Disconnected) {
                        break "connection lost".to_string();
                    }
                    journal.housekeeping(&out, &shared, index);
                }
            }
        };
        // Whatever is still in flight has no certain answer: possibly sent, held, and sent
        // again (same message id) only after the next probe.
        drop(in_flight);
        journal.end_session(&mut out, &shared, index, &lost);
        drop(js);
        if cancel.is_cancelled() {
            break;
        }
        eprintln!("drill engine: output {}: connection lost: {lost}", cfg.name);
        said_down = true;
    }
    journal.sync();
    publish_stats(&shared, index, &out, false);
}
