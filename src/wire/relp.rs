//! RELP, the Reliable Event Logging Protocol (librelp's, as rsyslog's `imrelp`/`omrelp` speak
//! it): frames, and a client session that opens, sends `syslog` commands and reads the answers.
//!
//! A frame is `TXNR SP COMMAND SP DATALEN [SP DATA] LF`. The client numbers its commands from 1;
//! the server answers each with `rsp` and the same number, `200 OK` when it took the message and
//! another code when it refused it. A server that ends the session first sends `serverclose`
//! with number 0. What this means for an outcome is [`Answer::of`]: 200 → delivered, any other
//! code → refused, no answer (the connection ended or went quiet) → possibly sent, the caller's
//! to decide.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest frame drill accepts from a server (answers are short; librelp's default for
/// messages is 128 KiB).
const MAX_FRAME: usize = 1 << 20;

/// One RELP frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub txnr: u32,
    pub command: String,
    pub data: Vec<u8>,
}

impl Frame {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = format!("{} {} {}", self.txnr, self.command, self.data.len()).into_bytes();
        if !self.data.is_empty() {
            out.push(b' ');
            out.extend_from_slice(&self.data);
        }
        out.push(b'\n');
        out
    }
}

/// A byte stream that is not RELP.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a RELP frame: {0}")]
pub struct FrameError(String);

/// Takes one whole frame off the front of `buf`; `Ok(None)` when more bytes are needed.
pub fn decode(buf: &mut Vec<u8>) -> Result<Option<Frame>, FrameError> {
    // The header: three space-separated fields; DATALEN ends at a space (data follows) or at
    // the trailer (no data).
    let mut fields = [0usize; 3];
    let mut found = 0;
    let mut at = 0;
    while found < 3 {
        let Some(pos) = buf[at..].iter().position(|&b| b == b' ' || b == b'\n') else {
            if buf.len() > 64 {
                return Err(FrameError("a header longer than 64 bytes".to_string()));
            }
            return Ok(None);
        };
        let end = at + pos;
        fields[found] = end;
        found += 1;
        if buf[end] == b'\n' && found < 3 {
            return Err(FrameError(format!(
                "a header of {found} fields: {:?}",
                String::from_utf8_lossy(&buf[..end])
            )));
        }
        at = end + 1;
    }
    let text = |from: usize, to: usize| String::from_utf8_lossy(&buf[from..to]).into_owned();
    let txnr: u32 = text(0, fields[0])
        .parse()
        .map_err(|_| FrameError(format!("transaction number {:?}", text(0, fields[0]))))?;
    let command = text(fields[0] + 1, fields[1]);
    let len: usize = text(fields[1] + 1, fields[2])
        .parse()
        .map_err(|_| FrameError(format!("data length {:?}", text(fields[1] + 1, fields[2]))))?;
    if len > MAX_FRAME {
        return Err(FrameError(format!("{len} bytes of data")));
    }
    let (data_start, total) = if len == 0 {
        if buf[fields[2]] != b'\n' {
            return Err(FrameError("no trailer after an empty frame".to_string()));
        }
        (fields[2], fields[2] + 1)
    } else {
        (fields[2] + 1, fields[2] + 1 + len + 1)
    };
    if buf.len() < total {
        return Ok(None);
    }
    if buf[total - 1] != b'\n' {
        return Err(FrameError("no trailer after the data".to_string()));
    }
    let data = buf[data_start..data_start + len].to_vec();
    buf.drain(..total);
    Ok(Some(Frame {
        txnr,
        command,
        data,
    }))
}

/// What a server's `rsp` said about one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `200`: the server took it.
    Taken,
    /// Any other code, with the server's text: it said no to this one.
    Refused { code: u16, text: String },
}

impl Answer {
    /// The answer an `rsp` frame's data gives (`200 OK`, `500 …`).
    pub fn of(data: &[u8]) -> Result<Answer, FrameError> {
        let text = String::from_utf8_lossy(data);
        let first = text.lines().next().unwrap_or("");
        let (code, rest) = first.split_once(' ').unwrap_or((first, ""));
        let code: u16 = code
            .parse()
            .map_err(|_| FrameError(format!("an rsp without a code: {first:?}")))?;
        Ok(if code == 200 {
            Answer::Taken
        } else {
            Answer::Refused {
                code,
                text: rest.to_string(),
            }
        })
    }
}

/// What the server sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The answer to the command numbered `txnr`.
    Rsp { txnr: u32, answer: Answer },
    /// An answer without data: what a server says to `close`.
    EmptyRsp { txnr: u32 },
    /// The server ends the session: unanswered commands stay unanswered.
    ServerClose,
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("the server refused the session: {0:?}")]
    Refused(Answer),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the server sent {0:?} where an rsp was due")]
    Unexpected(String),
}

/// A client's RELP session.
pub struct Session {
    stream: TcpStream,
    buf: Vec<u8>,
    next: u32,
}

impl Session {
    /// Connects and opens a session offering `syslog`, waiting at most `wait` for the answer.
    /// It writes no message: this is the data-free probe of a RELP destination.
    pub async fn open(addr: SocketAddr, wait: Duration) -> Result<Session, SessionError> {
        let mut session = Session::connect(addr, wait).await?;
        let txnr = session.offer().await?;
        match tokio::time::timeout(wait, session.reply()).await {
            Err(_) => Err(SessionError::Timeout(wait)),
            Ok(Err(e)) => Err(e),
            Ok(Ok(Reply::Rsp { txnr: t, answer })) if t == txnr => match answer {
                Answer::Taken => Ok(session),
                refused => Err(SessionError::Refused(refused)),
            },
            Ok(Ok(other)) => Err(SessionError::Unexpected(format!("{other:?}"))),
        }
    }

    /// A TCP connection, no command sent yet.
    pub async fn connect(addr: SocketAddr, wait: Duration) -> Result<Session, SessionError> {
        let stream = tokio::time::timeout(wait, TcpStream::connect(addr))
            .await
            .map_err(|_| SessionError::Timeout(wait))??;
        stream.set_nodelay(true)?;
        Ok(Session {
            stream,
            buf: Vec::new(),
            next: 1,
        })
    }

    /// Writes the `open` command with drill's offers; returns its transaction number.
    pub async fn offer(&mut self) -> std::io::Result<u32> {
        let offers = b"relp_version=0\nrelp_software=drill\ncommands=syslog".to_vec();
        self.command("open", offers).await
    }

    /// Writes one command; returns its transaction number.
    pub async fn command(&mut self, command: &str, data: Vec<u8>) -> std::io::Result<u32> {
        let txnr = self.next;
        self.next = if self.next >= 999_999_999 {
            1
        } else {
            self.next + 1
        };
        let frame = Frame {
            txnr,
            command: command.to_string(),
            data,
        };
        self.stream.write_all(&frame.encode()).await?;
        Ok(txnr)
    }

    /// Sends one syslog message (without waiting for its answer).
    pub async fn syslog(&mut self, message: &str) -> std::io::Result<u32> {
        self.command("syslog", message.as_bytes().to_vec()).await
    }

    /// A frame already read and whole, without waiting for more bytes (`None`: there is none).
    pub fn buffered_reply(&mut self) -> Result<Option<Reply>, SessionError> {
        let Some(frame) = decode(&mut self.buf)? else {
            return Ok(None);
        };
        match frame.command.as_str() {
            "rsp" if frame.data.is_empty() => Ok(Some(Reply::EmptyRsp { txnr: frame.txnr })),
            "rsp" => Ok(Some(Reply::Rsp {
                txnr: frame.txnr,
                answer: Answer::of(&frame.data)?,
            })),
            "serverclose" => Ok(Some(Reply::ServerClose)),
            other => Err(SessionError::Unexpected(other.to_string())),
        }
    }

    /// The server's next frame: an answer, or its closing. Cancel-safe: bytes read are kept
    /// in the session's buffer until a whole frame is there.
    pub async fn reply(&mut self) -> Result<Reply, SessionError> {
        loop {
            if let Some(reply) = self.buffered_reply()? {
                return Ok(reply);
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Closes the session: `close`, then the server's answer (at most `wait`).
    pub async fn close(mut self, wait: Duration) -> Result<(), SessionError> {
        let txnr = self.command("close", Vec::new()).await?;
        tokio::time::timeout(wait, async {
            loop {
                match self.reply().await? {
                    Reply::Rsp { txnr: t, .. } | Reply::EmptyRsp { txnr: t } if t == txnr => {
                        return Ok(());
                    }
                    Reply::ServerClose => return Ok(()),
                    Reply::Rsp { .. } | Reply::EmptyRsp { .. } => {}
                }
            }
        })
        .await
        .map_err(|_| SessionError::Timeout(wait))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_split_anywhere() {
        let frames = [
            Frame {
                txnr: 1,
                command: "rsp".into(),
                data: b"200 OK\nrelp_version=0".to_vec(),
            },
            Frame {
                txnr: 3,
                command: "rsp".into(),
                data: Vec::new(),
            },
            Frame {
                txnr: 0,
                command: "serverclose".into(),
                data: Vec::new(),
            },
        ];
        let wire: Vec<u8> = frames.iter().flat_map(|f| f.encode()).collect();
        assert_eq!(&wire[wire.len() - 16..], b"0 serverclose 0\n");
        // Fed one byte at a time, the same frames come out, in order.
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for b in wire {
            buf.push(b);
            while let Some(f) = decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        assert_eq!(out, frames);
        assert!(buf.is_empty());
    }

    #[test]
    fn what_is_not_relp_is_an_error() {
        for bad in [
            &b"x rsp 0\n"[..],
            b"1 rsp\n",
            b"1 rsp 2 OKX",
            b"1 rsp 99999999999 ",
            b"1 rsp 0 x",
        ] {
            let mut buf = bad.to_vec();
            assert!(
                decode(&mut buf).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut partial = b"12 rsp 6 200 O".to_vec();
        assert_eq!(decode(&mut partial), Ok(None));
    }

    #[test]
    fn an_answer_is_taken_only_with_200() {
        assert_eq!(Answer::of(b"200 OK"), Ok(Answer::Taken));
        assert_eq!(
            Answer::of(b"500 queue full\nmore"),
            Ok(Answer::Refused {
                code: 500,
                text: "queue full".into()
            })
        );
        assert!(Answer::of(b"OK").is_err());
    }
}
