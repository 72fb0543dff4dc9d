//! The engine's syslog sink: one RFC 5424 message per record, the write key as structured data
//! (`[drill key="…"]`), over the output's `transport`.
//!
//! | transport | connect + probe | an attempt ends | promise |
//! |---|---|---|---|
//! | `relp` (default) | TCP connect and a RELP `open` answered `200` (writes nothing) | `rsp 200` → delivered; another code → refused (counted); no answer within the answer timeout, `serverclose` or a lost connection → `possibly_sent` | `at_least_once` |
//! | `tcp` | the TCP handshake (the only round trip plain TCP has; writes nothing) | `sent_unconfirmed` once the write returned | `at_most_once` |
//! | `udp` | none exists: nothing on UDP answers without data | `sent_unconfirmed` once the datagram is handed to the OS | `at_most_once` |
//!
//! A plain TCP receiver says nothing back, so nothing can tell a record in a socket buffer when
//! the connection died from one that was written: what the OS took is settled, never resent
//! (resending would make copies the destination cannot recognise). The report counts such
//! records apart when they are missing, and never says "nothing lost" for them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::wire::syslog::{octet_counted, rfc5424};
use crate::wire::relp::{self, Reply};
use super::{Transport, transport_promise};
use crate::engine::OutputConfig;
use crate::engine::output::Answer;
use crate::engine::sink::{Answers, Attempts, Connect, Open, Session, Sink, Tick};
use crate::promise::Promise;

#[cfg(feature = "mutants")]
use crate::engine::mutant::{self, Mutant};

/// The host name every message carries.
const HOST: &str = "drill";

/// The syslog sink (stateless: the transport is in the output's config).
#[derive(Clone, Copy)]
pub struct SyslogSink;

/// The message for one record: no timestamp of its own (the NILVALUE; the receiver stamps it),
/// the write key as structured data, the record's data as the message.
pub fn message_for(key: &str, data: &str) -> String {
    rfc5424("-", HOST, Some(key), data)
}

/// The output's transport, as its config names it (`relp` when it names none).
fn transport_of(cfg: &OutputConfig) -> Result<Transport, String> {
    match cfg.transport.as_deref() {
        None => Ok(Transport::Relp),
        Some(t) => Transport::parse(t)
            .ok_or_else(|| format!("`transport: {t}`: a syslog output takes relp, tcp or udp")),
    }
}

impl Sink for SyslogSink {
    type Session = SyslogSession;

    const SESSION: &'static str = "syslog session";

    const PROMISE: (Promise, &'static str) = (
        Promise::AtLeastOnce,
        "a syslog output over RELP keeps `at_least_once` (a lost rsp means a resend)",
    );

    /// librelp's window: a RELP server takes up to 128 unanswered frames.
    const DEFAULT_WINDOW: usize = 128;

    fn promise_for(&self, cfg: &OutputConfig) -> (Promise, &'static str) {
        transport_of(cfg).map_or(Self::PROMISE, transport_promise)
    }

    fn check(&self, cfg: &OutputConfig) -> Result<(), String> {
        if cfg.key_header.is_some() {
            return Err("`key_header`: only an http output takes it; leave it out".to_string());
        }
        transport_of(cfg).map(drop)
    }

    async fn connect<'a>(&'a self, to: Connect<'a>) -> Result<SyslogSession, String> {
        let cfg = to.cfg;
        let limit = cfg.answer_timeout.0;
        let link = match transport_of(cfg)? {
            Transport::Relp => Link::Relp {
                session: open_relp(&to).await?,
                open: HashMap::new(),
            },
            Transport::Tcp => {
                let stream = tokio::time::timeout(limit, TcpStream::connect(cfg.address))
                    .await
                    .map_err(|_| format!("no TCP handshake within {limit:?}"))?
                    .map_err(|e| e.to_string())?;
                stream.set_nodelay(true).map_err(|e| e.to_string())?;
                Link::Tcp(stream)
            }
            Transport::Udp => {
                // Any local address of the destination's family (a remote receiver, IPv6).
                let local: std::net::SocketAddr = match cfg.address {
                    std::net::SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
                    std::net::SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
                };
                let socket = UdpSocket::bind(local).await.map_err(|e| e.to_string())?;
                socket
                    .connect(cfg.address)
                    .await
                    .map_err(|e| e.to_string())?;
                Link::Udp(socket)
            }
        };
        Ok(SyslogSession {
            link,
            answer_timeout: limit,
        })
    }
}

/// A RELP session opened and answered: the data-free probe. In test builds, the mutants that
/// break it (see `engine::mutant`).
async fn open_relp(to: &Connect<'_>) -> Result<relp::Session, String> {
    let (addr, limit) = (to.cfg.address, to.cfg.answer_timeout.0);
    #[cfg(feature = "mutants")]
    if mutant::is(Mutant::LocalConnectedFlag) {
        // MUTANT: "connected" once TCP connects: the open goes out, its answer is not awaited.
        let mut session = relp::Session::connect(addr, limit)
            .await
            .map_err(|e| e.to_string())?;
        session.offer().await.map_err(|e| e.to_string())?;
        return Ok(session);
    }
    let session = relp::Session::open(addr, limit)
        .await
        .map_err(|e| e.to_string())?;
    #[cfg(feature = "mutants")]
    if mutant::is(Mutant::ProbeWithOldestRecord)
        && let Some(record) = to.oldest
    {
        // MUTANT: the probe writes data: the oldest waiting record, without its write key,
        // its answer not awaited (docs/src/design.md#rule-1-5).
        let mut session = session;
        let message = rfc5424("-", HOST, None, &record.data);
        session.syslog(&message).await.map_err(|e| e.to_string())?;
        return Ok(session);
    }
    Ok(session)
}

/// One connected syslog session.
pub struct SyslogSession {
    link: Link,
    answer_timeout: Duration,
}

/// The session's connection, by transport.
enum Link {
    /// A RELP session: each `syslog` command's transaction number → the attempt's tag.
    Relp {
        session: relp::Session,
        open: HashMap<u32, u16>,
    },
    Tcp(TcpStream),
    Udp(UdpSocket),
}

impl Session for SyslogSession {
    async fn send(&mut self, attempts: &mut Attempts, answers: &mut Answers) -> Result<(), String> {
        let limit = self.answer_timeout;
        let write = async {
            match &mut self.link {
                Link::Relp { session, open } => {
                    for (tag, record) in attempts.iter() {
                        let txnr = session
                            .syslog(&message_for(&record.key, &record.data))
                            .await
                            .map_err(|e| format!("write failed: {e}"))?;
                        open.insert(txnr, *tag);
                    }
                }
                Link::Tcp(stream) => {
                    for (tag, record) in attempts.iter() {
                        #[cfg(feature = "mutants")]
                        if crate::engine::mutant::skips_this_write() {
                            answers.push((*tag, Answer::SentUnconfirmed));
                            continue;
                        }
                        let frame = octet_counted(&message_for(&record.key, &record.data));
                        stream
                            .write_all(&frame)
                            .await
                            .map_err(|e| format!("write failed: {e}"))?;
                        // The OS took the bytes: that is all plain TCP will ever say.
                        answers.push((*tag, Answer::SentUnconfirmed));
                    }
                }
                Link::Udp(socket) => {
                    for (tag, record) in attempts.iter() {
                        #[cfg(feature = "mutants")]
                        if crate::engine::mutant::skips_this_write() {
                            answers.push((*tag, Answer::SentUnconfirmed));
                            continue;
                        }
                        let message = message_for(&record.key, &record.data);
                        socket
                            .send(message.as_bytes())
                            .await
                            .map_err(|e| format!("send failed: {e}"))?;
                        answers.push((*tag, Answer::SentUnconfirmed));
                    }
                }
            }
            Ok(())
        };
        match tokio::time::timeout(limit, write).await {
            Ok(result) => result,
            Err(_) => Err(format!("writes blocked for {limit:?}")),
        }
    }

    async fn answers(&mut self, into: &mut Answers) -> Result<(), String> {
        match &mut self.link {
            Link::Relp { session, open } => {
                // The next reply, then every one already read (one batch: one write of marks).
                let mut reply = Some(session.reply().await.map_err(|e| e.to_string())?);
                while let Some(r) = reply {
                    match r {
                        Reply::Rsp { txnr, answer } => {
                            if let Some(tag) = open.remove(&txnr) {
                                into.push((tag, relp_answer(answer)));
                            }
                        }
                        Reply::EmptyRsp { .. } => {}
                        Reply::ServerClose => {
                            return Err("the server closed the RELP session".to_string());
                        }
                    }
                    reply = session.buffered_reply().map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            Link::Tcp(stream) => {
                // A syslog receiver sends nothing; what it does send is read and dropped, so
                // only the end of the connection is news.
                let mut buf = [0u8; 512];
                match stream.read(&mut buf).await {
                    Ok(0) => Err("the receiver closed the connection".to_string()),
                    Ok(_) => Ok(()),
                    Err(e) => Err(format!("connection error: {e}")),
                }
            }
            Link::Udp(socket) => {
                // Nothing answers on UDP; an ICMP unreachable surfaces here as an error.
                let mut buf = [0u8; 512];
                match socket.recv(&mut buf).await {
                    Ok(_) => Ok(()),
                    Err(e) => Err(format!("datagrams not taken: {e}")),
                }
            }
        }
    }

    async fn tick(&mut self, _now: Instant, open: Open) -> Tick {
        #[cfg(feature = "mutants")]
        if let Some(tick) = mutant::session_tick(self.answer_timeout) {
            // MUTANT `no-keepalive` or `local-connected-flag` (see `mutant::session_tick`).
            return tick;
        }
        // RELP has no keepalive command: an attempt unanswered past the answer timeout ends
        // the session, and its open attempts end `possibly_sent`.
        match open.oldest_waited {
            Some(waited) if waited > self.answer_timeout => {
                Tick::Lost(format!("no rsp within {:?}", self.answer_timeout))
            }
            _ => Tick::Fine,
        }
    }

    async fn close(&mut self) {
        match &mut self.link {
            Link::Relp { session, .. } => {
                let _ = session.command("close", Vec::new()).await;
            }
            Link::Tcp(stream) => {
                let _ = stream.shutdown().await;
            }
            Link::Udp(_) => {}
        }
    }
}

/// What a RELP `rsp` means for the attempt.
fn relp_answer(answer: relp::Answer) -> Answer {
    match answer {
        relp::Answer::Taken => Answer::Accepted,
        relp::Answer::Refused { code, text } => Answer::Refused(format!("RELP {code} {text}")),
    }
}
