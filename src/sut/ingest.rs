//! Handing records to the system under test, and what its answer means.
//!
//! - [`Ingest::Http`]: POST NDJSON batches; a 2xx answer means every line is held, with the
//!   write keys when the body gives them: listed (`{"write_keys": [...]}`), or as a prefix and
//!   the first of consecutive sequences (`{"write_key_prefix": "p-", "first_seq": 7,
//!   "accepted": 3}` → `p-7`, `p-8`, `p-9`), as drill's engine answers; any other answer means
//!   not accepted; no answer means unknown.
//! - [`Ingest::Mqtt`]: publish each record at QoS 1 to the engine's own listener; its PUBACK
//!   (reason < 0x80) means held; a PUBACK ≥ 0x80 means not accepted; a connection lost before
//!   the PUBACK means unknown. MQTT 5, or 3.1.1 where the engine speaks nothing newer (its
//!   PUBACK has no reason code: always held).
//! - [`Ingest::TcpLines`]: newline-delimited records on one TCP connection. The protocol has no
//!   acknowledgement: a record counts as held once the OS took its bytes for the engine's
//!   socket (`sent_unconfirmed`, docs/src/design.md#rule-1-6); the report says so.
//! - [`Ingest::Relp`]: each record as an RFC 5424 message (the record's JSON as its text) on
//!   one RELP session to the engine's listener, as a syslog client sends; `rsp 200` means
//!   held, another code means not accepted, a session lost before the answer means unknown.
//! - [`Ingest::File`]: each record as one JSON line appended to a file the engine tails
//!   (`crate::source::FileSource`); written and synced means held.
//! - [`Ingest::Kafka`]: each record produced into a source topic the engine consumes
//!   (`crate::source::KafkaSource`); the broker's acknowledgement means held.
//! - [`Ingest::Outbox`]: each record inserted as a row of an outbox table the engine polls
//!   (`crate::source::OutboxSource`); the transaction's commit means held.
//!
//! Nothing here retries a record whose answer was unknown: that would hide what a drill counts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::scenario::IngestSpec;
use crate::wire::mqtt::{self, Inbound, Packet, Publish, QoS};
use crate::wire::mqtt311;
use crate::wire::relp::{self, Reply};
use crate::wire::syslog::rfc5424;
use crate::workload::{IngestAnswer, Intake, Record};

/// How long one ingest call may wait for its answer.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// A connection (or client) to the system's ingest.
pub enum Ingest {
    Http {
        url: String,
        batch: usize,
        client: reqwest::Client,
    },
    Mqtt {
        addr: SocketAddr,
        topic: String,
        client_id: String,
        session: Option<MqttLink>,
        next_pkid: u16,
        /// MQTT 3.1.1 instead of 5.
        v311: bool,
    },
    TcpLines {
        addr: SocketAddr,
        stream: Option<TcpStream>,
    },
    Relp {
        addr: SocketAddr,
        session: Option<relp::Session>,
    },
    File(crate::source::FileSource),
    Kafka(crate::source::KafkaSource),
    Outbox(crate::source::OutboxSource),
}

/// An MQTT ingest session, in the protocol the engine's listener speaks.
pub enum MqttLink {
    V5(Box<mqtt::Session>),
    V311(Box<mqtt311::Session>),
}

impl Ingest {
    /// The ingest `spec` describes, at `addr`; `run` names the MQTT client.
    pub fn new(spec: &IngestSpec, addr: SocketAddr, run: &str) -> Result<Ingest, String> {
        Ok(match spec {
            IngestSpec::Http { path, batch } => Ingest::Http {
                url: format!("http://{addr}{path}"),
                batch: *batch,
                client: reqwest::Client::builder()
                    .timeout(ANSWER_LIMIT)
                    .build()
                    .map_err(|e| format!("cannot build an HTTP client: {e}"))?,
            },
            IngestSpec::Mqtt { topic, v311, .. } => Ingest::Mqtt {
                addr,
                topic: topic.clone(),
                client_id: format!("drill-ingest-{run}"),
                session: None,
                next_pkid: 1,
                v311: *v311,
            },
            IngestSpec::TcpLines => Ingest::TcpLines { addr, stream: None },
            IngestSpec::Relp => Ingest::Relp {
                addr,
                session: None,
            },
            IngestSpec::File(_) | IngestSpec::Kafka(_) | IngestSpec::PostgresOutbox(_) => {
                return Err(
                    "a source the engine reads from is made by the runner before the engine starts"
                        .to_string(),
                );
            }
        })
    }

    /// What "held" means for this ingest, for the report.
    pub fn meaning(&self) -> Option<&'static str> {
        match self {
            Ingest::TcpLines { .. } => Some(
                "ingest `tcp_lines` has no acknowledgement: `held` counts records whose bytes the OS took for the engine's socket; a record lost between the socket and the engine's disk counts as lost",
            ),
            Ingest::File(_) => Some(
                "ingest `file`: `held` counts records drill wrote to the source file and synced; the engine reads them when it will, and a record in a file drill removed or cut before the engine read it is destroyed by the source fault, not lost",
            ),
            Ingest::Outbox(_) => Some(
                "ingest `postgres_outbox`: `held` counts rows drill inserted into the outbox table and committed; the engine polls them when it will, and the rows it marked or deleted are its checkpoint",
            ),
            Ingest::Kafka(_) => Some(
                "ingest `kafka`: `held` counts records the source topic's broker acknowledged; the engine consumes them when it will, and its group's committed offset is its checkpoint",
            ),
            _ => None,
        }
    }

    /// Whether a record counts as held once the OS took its bytes for the engine's socket
    /// (`tcp_lines`): one taken just before the engine died may never have been read.
    pub fn held_by_the_socket(&self) -> bool {
        matches!(self, Ingest::TcpLines { .. })
    }

    /// Hands `records` to the engine; one answer per record, in order.
    async fn send_batch(&mut self, records: &[Record]) -> Vec<IngestAnswer> {
        match self {
            // Each writes its own lines (or messages).
            Ingest::File(source) => return source.write(records).await,
            Ingest::Kafka(source) => return source.write(records).await,
            Ingest::Outbox(source) => return source.write(records).await,
            _ => {}
        }
        let lines: Vec<String> = records
            .iter()
            .map(|r| serde_json::to_string(r).unwrap_or_default())
            .collect();
        match self {
            Ingest::Http { url, batch, client } => {
                let mut answers = Vec::with_capacity(lines.len());
                for chunk in lines.chunks((*batch).max(1)) {
                    answers.extend(post(client, url, chunk).await);
                }
                answers
            }
            Ingest::Mqtt {
                addr,
                topic,
                client_id,
                session,
                next_pkid,
                v311,
            } => {
                let to = Publisher {
                    addr: *addr,
                    topic,
                    client_id,
                    v311: *v311,
                };
                to.publish(session, next_pkid, lines).await
            }
            Ingest::TcpLines { addr, stream } => write_lines(*addr, stream, &lines).await,
            Ingest::Relp { addr, session } => send_relp(*addr, session, &lines).await,
            // Handled above, before the lines were made.
            Ingest::File(source) => source.write(records).await,
            Ingest::Kafka(source) => source.write(records).await,
            Ingest::Outbox(source) => source.write(records).await,
        }
    }
}

async fn post(client: &reqwest::Client, url: &str, lines: &[String]) -> Vec<IngestAnswer> {
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let all = |a: IngestAnswer| vec![a; lines.len()];
    match client.post(url).body(body).send().await {
        Ok(response) if response.status().is_success() => {
            // The body may list the write keys (drill's own engine does); anything else in it
            // is the engine's business.
            let keys: Option<Vec<String>> = response
                .json::<serde_json::Value>()
                .await
                .ok()
                .and_then(|v| answered_keys(&v));
            match keys {
                Some(keys) if keys.len() == lines.len() => keys
                    .into_iter()
                    .map(|k| IngestAnswer::Accepted(Some(k)))
                    .collect(),
                Some(keys) => all(IngestAnswer::NotAccepted(format!(
                    "engine answered {} keys for {} records",
                    keys.len(),
                    lines.len()
                ))),
                None => all(IngestAnswer::Accepted(None)),
            }
        }
        Ok(response) => {
            let status = response.status();
            // The engine's own words, first line, when it gave any.
            let body = response.text().await.unwrap_or_default();
            let said = body.lines().next().unwrap_or("").trim();
            let said: String = said.chars().take(300).collect();
            all(IngestAnswer::NotAccepted(if said.is_empty() {
                format!("HTTP {status}")
            } else {
                format!("HTTP {status}: {said}")
            }))
        }
        // Connection refused: the request never reached an engine.
        Err(e) if e.is_connect() => all(IngestAnswer::NotAccepted(format!("connect: {e}"))),
        // Sent, then the answer was lost (engine killed mid-request, timeout).
        Err(_) => all(IngestAnswer::Unknown),
    }
}

/// The write keys an ingest answer gives, in the order of the lines: listed, or as a prefix
/// and the first of `accepted` consecutive sequences.
fn answered_keys(v: &serde_json::Value) -> Option<Vec<String>> {
    if let Some(list) = v.get("write_keys").and_then(|k| k.as_array()) {
        return Some(
            list.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect(),
        );
    }
    let prefix = v.get("write_key_prefix")?.as_str()?;
    let first = v.get("first_seq")?.as_u64()?;
    let count = v.get("accepted")?.as_u64()?;
    Some(
        (first..first + count)
            .map(|seq| format!("{prefix}{seq}"))
            .collect(),
    )
}

/// Where an MQTT ingest publishes, and in which protocol.
struct Publisher<'a> {
    addr: SocketAddr,
    topic: &'a str,
    client_id: &'a str,
    v311: bool,
}

impl Publisher<'_> {
    /// Publishes `lines` at QoS 1 on the session (connected first if there is none), and
    /// waits for their PUBACKs; a session that broke is dropped.
    async fn publish(
        &self,
        session: &mut Option<MqttLink>,
        next_pkid: &mut u16,
        lines: Vec<String>,
    ) -> Vec<IngestAnswer> {
        let n = lines.len();
        if session.is_none() {
            let keep_alive = Duration::from_secs(30);
            let linked = if self.v311 {
                mqtt311::connect(self.addr, self.client_id, keep_alive, ANSWER_LIMIT)
                    .await
                    .map(|s| MqttLink::V311(Box::new(s)))
            } else {
                mqtt::connect(self.addr, self.client_id, keep_alive, ANSWER_LIMIT)
                    .await
                    .map(|s| MqttLink::V5(Box::new(s)))
            };
            match linked {
                Ok(l) => *session = Some(l),
                Err(e) => return vec![IngestAnswer::NotAccepted(e.to_string()); n],
            }
        }
        let topic = self.topic;
        let (answers, broken) = match session.as_mut() {
            Some(MqttLink::V5(s)) => {
                let packet = |pkid, line: String| {
                    let mut p =
                        Publish::new(topic, QoS::AtLeastOnce, bytes::Bytes::from(line), None);
                    p.pkid = pkid;
                    Packet::Publish(p)
                };
                let ack = |inbound| match inbound {
                    Inbound::Ack(ack) if ack.accepted() => Some((ack.pkid, Ok(()))),
                    Inbound::Ack(ack) => Some((ack.pkid, Err(ack.describe()))),
                    _ => None,
                };
                publish_on(&mut s.framed, next_pkid, lines, packet, ack).await
            }
            Some(MqttLink::V311(s)) => {
                use rumqttc::mqttbytes::v4;
                let packet = |pkid, line: String| {
                    let mut p = v4::Publish::new(topic, rumqttc::mqttbytes::QoS::AtLeastOnce, line);
                    p.pkid = pkid;
                    v4::Packet::Publish(p)
                };
                let ack = |inbound| match inbound {
                    v4::Packet::PubAck(ack) => Some((ack.pkid, Ok(()))),
                    _ => None,
                };
                publish_on(&mut s.framed, next_pkid, lines, packet, ack).await
            }
            None => (
                vec![IngestAnswer::NotAccepted("no session".to_string()); n],
                false,
            ),
        };
        if broken {
            *session = None;
        }
        answers
    }
}

/// Feeds one QoS 1 publish per line (`packet` makes it with its packet id), flushes, and reads
/// until every one is answered (`ack` finds a PUBACK: its id, and a refusal's words) or the
/// answer limit passes. Returns the answers, and whether the session broke (closed, an error,
/// silent): what was not acknowledged then stays unknown.
async fn publish_on<F, P, I, E>(
    framed: &mut F,
    next_pkid: &mut u16,
    lines: Vec<String>,
    packet: impl Fn(u16, String) -> P,
    ack: impl Fn(I) -> Option<(u16, Result<(), String>)>,
) -> (Vec<IngestAnswer>, bool)
where
    F: Sink<P> + Stream<Item = Result<I, E>> + Unpin,
{
    let mut answers = vec![IngestAnswer::Unknown; lines.len()];
    let mut waiting: HashMap<u16, usize> = HashMap::new();
    for (i, line) in lines.into_iter().enumerate() {
        let pkid = *next_pkid;
        *next_pkid = next_pkid.checked_add(1).unwrap_or(1);
        if framed.feed(packet(pkid, line)).await.is_err() {
            return (answers, true);
        }
        waiting.insert(pkid, i);
    }
    if framed.flush().await.is_err() {
        return (answers, true);
    }
    let deadline = tokio::time::Instant::now() + ANSWER_LIMIT;
    while !waiting.is_empty() {
        match tokio::time::timeout_at(deadline, framed.next()).await {
            Ok(Some(Ok(inbound))) => {
                if let Some((pkid, said)) = ack(inbound)
                    && let Some(i) = waiting.remove(&pkid)
                {
                    answers[i] = match said {
                        Ok(()) => IngestAnswer::Accepted(None),
                        Err(why) => IngestAnswer::NotAccepted(why),
                    };
                }
            }
            Ok(Some(Err(_))) | Ok(None) | Err(_) => return (answers, true),
        }
    }
    (answers, false)
}

async fn write_lines(
    addr: SocketAddr,
    stream: &mut Option<TcpStream>,
    lines: &[String],
) -> Vec<IngestAnswer> {
    let n = lines.len();
    // A peer that closed (an engine killed since the last batch) shows as end of stream or an
    // error here: connect again rather than write into a dead socket.
    if let Some(s) = stream.as_ref() {
        let mut probe = [0u8; 1];
        match s.try_read(&mut probe) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => *stream = None,
        }
    }
    if stream.is_none() {
        match tokio::time::timeout(ANSWER_LIMIT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => *stream = Some(s),
            Ok(Err(e)) => return vec![IngestAnswer::NotAccepted(format!("connect: {e}")); n],
            Err(_) => return vec![IngestAnswer::NotAccepted("connect timed out".to_string()); n],
        }
    }
    let Some(s) = stream.as_mut() else {
        return vec![IngestAnswer::NotAccepted("no connection".to_string()); n];
    };
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    match tokio::time::timeout(ANSWER_LIMIT, s.write_all(body.as_bytes())).await {
        Ok(Ok(())) => vec![IngestAnswer::Accepted(None); n],
        // Some bytes may have gone: the engine may hold some of these.
        _ => {
            *stream = None;
            vec![IngestAnswer::Unknown; n]
        }
    }
}

/// Each line as one RFC 5424 message on a RELP session (opened on first use, and again after
/// a loss); waits for every answer. What was sent and not answered stays unknown; what could
/// not be sent after a failed write was not accepted.
async fn send_relp(
    addr: SocketAddr,
    session: &mut Option<relp::Session>,
    lines: &[String],
) -> Vec<IngestAnswer> {
    let n = lines.len();
    if session.is_none() {
        match relp::Session::open(addr, ANSWER_LIMIT).await {
            Ok(s) => *session = Some(s),
            Err(e) => return vec![IngestAnswer::NotAccepted(format!("RELP open: {e}")); n],
        }
    }
    let Some(s) = session.as_mut() else {
        return vec![IngestAnswer::NotAccepted("no RELP session".to_string()); n];
    };
    let mut answers = vec![IngestAnswer::Unknown; n];
    let mut waiting: HashMap<u32, usize> = HashMap::new();
    for (i, line) in lines.iter().enumerate() {
        let message = rfc5424("-", "drill", None, line);
        match tokio::time::timeout(ANSWER_LIMIT, s.syslog(&message)).await {
            Ok(Ok(txnr)) => {
                waiting.insert(txnr, i);
            }
            // Part of this frame may have gone; the ones after it never did.
            _ => {
                for a in answers.iter_mut().skip(i + 1) {
                    *a = IngestAnswer::NotAccepted(
                        "the RELP session was lost before it was sent".to_string(),
                    );
                }
                *session = None;
                return answers;
            }
        }
    }
    let deadline = tokio::time::Instant::now() + ANSWER_LIMIT;
    while !waiting.is_empty() {
        match tokio::time::timeout_at(deadline, s.reply()).await {
            Ok(Ok(Reply::Rsp { txnr, answer })) => {
                if let Some(i) = waiting.remove(&txnr) {
                    answers[i] = match answer {
                        relp::Answer::Taken => IngestAnswer::Accepted(None),
                        relp::Answer::Refused { code, text } => {
                            IngestAnswer::NotAccepted(format!("RELP {code} {text}"))
                        }
                    };
                }
            }
            Ok(Ok(Reply::EmptyRsp { .. })) => {}
            // Closed, broken or silent: what was not answered stays unknown.
            Ok(Ok(Reply::ServerClose)) | Ok(Err(_)) | Err(_) => {
                *session = None;
                break;
            }
        }
    }
    answers
}

impl Intake for Ingest {
    fn send(&mut self, records: &[Record]) -> impl Future<Output = Vec<IngestAnswer>> + Send {
        self.send_batch(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_listed_or_as_a_prefix_and_first_sequence() {
        let listed = serde_json::json!({"accepted": 2, "write_keys": ["a-1", "a-2"]});
        assert_eq!(
            answered_keys(&listed),
            Some(vec!["a-1".to_string(), "a-2".to_string()])
        );
        let ranged = serde_json::json!({"accepted": 3, "first_seq": 7, "write_key_prefix": "p-"});
        assert_eq!(
            answered_keys(&ranged),
            Some(vec![
                "p-7".to_string(),
                "p-8".to_string(),
                "p-9".to_string()
            ])
        );
        assert_eq!(answered_keys(&serde_json::json!({"accepted": 3})), None);
    }
}
