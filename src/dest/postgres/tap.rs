//! The PostgreSQL tap: which records went up in a statement, and which statements were still
//! unanswered — to the engine — when the same record went up again.
//!
//! The wire protocol (v3): after an untyped startup message (and, before it, perhaps an
//! `SSLRequest` the server answers with one byte), every message is a type byte and a length.
//! The engine's records travel in `Bind` parameters (extended protocol, as the built-in engine
//! and most drivers send them), in a `Query`'s text, or in `CopyData`. A statement group ends
//! with `Sync` (extended) or is one `Query` (simple); the server answers each with one
//! `ReadyForQuery`, in order, so the tap pairs them first in, first out: an attempt is open
//! from its `Sync` or `Query` leaving the engine until its `ReadyForQuery` is *written to the
//! engine* (a `delay` holds it on the way), or until the connection ends. The server's first
//! `ReadyForQuery` answers the startup.
//!
//! Nothing of a statement's row count is read: the tap notes no confirmation. A connection
//! that turns to TLS (`SSLRequest` answered `S`) is not read on.

use std::collections::VecDeque;

use crate::proxy::tap::{Framer, IdFinder, Tap, TapId, TapLog, TapMaker};

/// Makes PostgreSQL taps that find ids of one run.
pub struct PostgresTaps {
    pub ids: IdFinder,
}

impl TapMaker for PostgresTaps {
    fn protocol(&self) -> &'static str {
        "PostgreSQL Bind/Query and ReadyForQuery"
    }

    fn pairs_answers(&self) -> bool {
        true
    }

    fn tap(&self) -> Box<dyn Tap> {
        Box::new(PostgresTap {
            ids: self.ids.clone(),
            left: Framer::default(),
            up: Framer::default(),
            delivered: Framer::default(),
            startup: true,
            up_startup: true,
            ssl_answer: false,
            opaque: false,
            pending: Vec::new(),
            open: VecDeque::new(),
            early: 0,
        })
    }
}

struct PostgresTap {
    ids: IdFinder,
    left: Framer,
    up: Framer,
    delivered: Framer,
    /// The engine's next message is untyped (startup, `SSLRequest`), as read from it and as
    /// written to the server.
    startup: bool,
    up_startup: bool,
    /// The server's next byte answers an `SSLRequest` (`S` or `N`), unframed.
    ssl_answer: bool,
    /// TLS: nothing more is read.
    opaque: bool,
    /// Ids in the statement group being sent (since the last `Sync` or `Query`).
    pending: Vec<TapId>,
    /// The attempts sent and not yet answered to the engine, oldest first.
    open: VecDeque<Vec<TapId>>,
    /// `ReadyForQuery` written to the engine before the tap read the statement it answers (the
    /// proxy reads after it writes): the next attempts are answered at once.
    early: usize,
}

/// `SSLRequest` and `GSSENCRequest`: answered by one byte, then the startup comes.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

/// The length of a typed message at the start of `b`: its type byte and its length.
fn typed_len(b: &[u8]) -> Option<usize> {
    let len = u32::from_be_bytes(b.get(1..5)?.try_into().ok()?) as usize;
    // A length below 4 is no PostgreSQL: one byte, so the stream moves on.
    Some(if len < 4 { 1 } else { 1 + len })
}

/// The length of an untyped (startup) message at the start of `b`.
fn untyped_len(b: &[u8]) -> Option<usize> {
    let len = u32::from_be_bytes(b.get(..4)?.try_into().ok()?) as usize;
    Some(len.max(1))
}

impl PostgresTap {
    /// An attempt left the engine: open, unless its answer already reached the engine.
    fn sent(&mut self, log: &TapLog) {
        let ids = std::mem::take(&mut self.pending);
        log.opened(&ids);
        if self.early > 0 {
            self.early -= 1;
            log.closed(&ids);
        } else {
            self.open.push_back(ids);
        }
    }
}

/// A message from the engine, as [`client_messages`] cuts them.
enum FromClient<'a> {
    /// `SSLRequest` or `GSSENCRequest`: the server answers one byte, another untyped follows.
    Encryption,
    /// The startup message: typed messages follow, the first `ReadyForQuery` answers it.
    Startup,
    Typed(&'a [u8]),
}

/// Cuts the engine's stream into messages: untyped while `untyped` (the startup), typed after.
fn client_messages(
    framer: &mut Framer,
    untyped: &mut bool,
    bytes: &[u8],
    mut each: impl FnMut(FromClient<'_>),
) {
    let state = std::cell::Cell::new(*untyped);
    let frame_len = |b: &[u8]| {
        if state.get() {
            untyped_len(b)
        } else {
            typed_len(b)
        }
    };
    framer.feed(bytes, frame_len, |m| {
        if !state.get() {
            return each(FromClient::Typed(m));
        }
        let code = m
            .get(4..8)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        if matches!(code, Some(SSL_REQUEST | GSSENC_REQUEST)) {
            each(FromClient::Encryption);
        } else {
            state.set(false);
            each(FromClient::Startup);
        }
    });
    *untyped = state.get();
}

impl Tap for PostgresTap {
    fn left(&mut self, bytes: &[u8], log: &TapLog) {
        if self.opaque {
            return;
        }
        let ids = &self.ids;
        let mut found: Vec<(u8, Vec<TapId>)> = Vec::new();
        let mut encryption = false;
        client_messages(&mut self.left, &mut self.startup, bytes, |m| match m {
            FromClient::Encryption => encryption = true,
            FromClient::Startup => found.push((0, Vec::new())),
            FromClient::Typed(m) => match m[0] {
                b'B' | b'Q' | b'd' => found.push((m[0], ids.ids(m))),
                b'S' => found.push((b'S', Vec::new())),
                _ => {}
            },
        });
        self.ssl_answer |= encryption;
        for (kind, ids) in found {
            if !ids.is_empty() {
                log.left(&ids);
            }
            match kind {
                // The startup, a Sync, a Query: one ReadyForQuery each.
                0 | b'S' => self.sent(log),
                b'Q' => {
                    self.pending.extend(ids);
                    self.sent(log);
                }
                _ => self.pending.extend(ids),
            }
        }
    }

    fn up(&mut self, bytes: &[u8], log: &TapLog) {
        if self.opaque {
            return;
        }
        let ids = &self.ids;
        let mut found: Vec<TapId> = Vec::new();
        // What reached the server's socket: read for ids alone.
        client_messages(&mut self.up, &mut self.up_startup, bytes, |m| {
            if let FromClient::Typed(m) = m
                && matches!(m[0], b'B' | b'Q' | b'd')
            {
                found.extend(ids.ids(m));
            }
        });
        if !found.is_empty() {
            log.sent(&found);
        }
    }

    fn down(&mut self, _bytes: &[u8], _log: &TapLog) {}

    fn delivered(&mut self, bytes: &[u8], log: &TapLog) {
        if self.opaque {
            return;
        }
        let mut bytes = bytes;
        if self.ssl_answer && !bytes.is_empty() {
            self.ssl_answer = false;
            if bytes[0] == b'S' {
                self.opaque = true;
                return;
            }
            bytes = &bytes[1..];
        }
        let mut ready = 0;
        self.delivered.feed(bytes, typed_len, |m| {
            if m[0] == b'Z' {
                ready += 1;
            }
        });
        for _ in 0..ready {
            match self.open.pop_front() {
                Some(ids) => log.closed(&ids),
                None => self.early += 1,
            }
        }
    }

    fn ended(&mut self, log: &TapLog) {
        for ids in self.open.drain(..) {
            log.closed(&ids);
        }
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn startup() -> Vec<u8> {
        let body = b"\0\x03\0\0user\0drill\0\0";
        let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        m.extend_from_slice(body);
        m
    }

    /// Bind + Execute + Sync for one record, as tokio-postgres pipelines a prepared INSERT.
    fn insert(id: &str) -> Vec<u8> {
        let mut m = typed(b'B', format!("\0s1\0\0\0\0\x01\0\0\0\x10{id}").as_bytes());
        m.extend(typed(b'E', b"\0\0\0\0\0"));
        m.extend(typed(b'S', b""));
        m
    }

    fn ready() -> Vec<u8> {
        let mut m = typed(b'2', b"");
        m.extend(typed(b'C', b"INSERT 0 1\0"));
        m.extend(typed(b'Z', b"I"));
        m
    }

    /// One connection's tap fed in chunks of `chunk`.
    fn feed(tap: &mut dyn Tap, log: &TapLog, to_server: bool, bytes: &[u8], chunk: usize) {
        for piece in bytes.chunks(chunk) {
            if to_server {
                tap.left(piece, log);
                tap.up(piece, log);
            } else {
                tap.delivered(piece, log);
            }
        }
    }

    #[test]
    fn a_record_sent_again_before_its_answer_reached_the_engine_overlaps() {
        let taps = PostgresTaps {
            ids: IdFinder::new("r"),
        };
        for chunk in [1, 3, 1000] {
            let log = TapLog::default();
            let mut a = taps.tap();
            feed(a.as_mut(), &log, true, &startup(), chunk);
            feed(a.as_mut(), &log, false, &typed(b'Z', b"I"), chunk);
            // r/k1/1 answered before it goes again: no overlap.
            feed(a.as_mut(), &log, true, &insert("r/k1/1"), chunk);
            feed(a.as_mut(), &log, false, &ready(), chunk);
            feed(a.as_mut(), &log, true, &insert("r/k1/1"), chunk);
            feed(a.as_mut(), &log, false, &ready(), chunk);
            assert!(log.seen().overlapping.is_empty(), "chunks of {chunk}");
            // r/k1/2 unanswered; sent again on a second connection: an overlap.
            feed(a.as_mut(), &log, true, &insert("r/k1/2"), chunk);
            let mut b = taps.tap();
            feed(b.as_mut(), &log, true, &startup(), chunk);
            feed(b.as_mut(), &log, false, &typed(b'Z', b"I"), chunk);
            feed(b.as_mut(), &log, true, &insert("r/k1/2"), chunk);
            // r/k1/3: its first connection ended before it went again: no overlap.
            feed(a.as_mut(), &log, true, &insert("r/k1/3"), chunk);
            a.ended(&log);
            feed(b.as_mut(), &log, true, &insert("r/k1/3"), chunk);
            let seen = log.seen();
            assert_eq!(
                seen.overlapping,
                [TapId { key: 1, seq: 2 }],
                "chunks of {chunk}"
            );
            assert_eq!(seen.sent.len(), 3);
            assert_eq!(seen.unreadable, 0);
        }
    }

    /// The proxy reads what the engine sent after passing it on: an answer may reach the engine
    /// before the tap read the statement. It still answers that statement, not the next.
    #[test]
    fn an_answer_written_before_its_statement_was_read_answers_it() {
        let taps = PostgresTaps {
            ids: IdFinder::new("r"),
        };
        let log = TapLog::default();
        let mut a = taps.tap();
        feed(a.as_mut(), &log, false, &typed(b'Z', b"I"), 100);
        feed(a.as_mut(), &log, true, &startup(), 100);
        feed(a.as_mut(), &log, false, &ready(), 100);
        feed(a.as_mut(), &log, true, &insert("r/k0/7"), 100);
        feed(a.as_mut(), &log, true, &insert("r/k0/7"), 100);
        assert!(log.seen().overlapping.is_empty());
    }

    /// An SSLRequest answered `N` goes on in plain text; one answered `S` is not read on.
    #[test]
    fn a_refused_ssl_request_is_passed_over_and_tls_is_not_read() {
        let taps = PostgresTaps {
            ids: IdFinder::new("r"),
        };
        let ssl = {
            let mut m = 8u32.to_be_bytes().to_vec();
            m.extend_from_slice(&SSL_REQUEST.to_be_bytes());
            m
        };
        let log = TapLog::default();
        let mut a = taps.tap();
        feed(a.as_mut(), &log, true, &ssl, 100);
        let mut answer = b"N".to_vec();
        answer.extend(typed(b'R', b"\0\0\0\0"));
        answer.extend(typed(b'Z', b"I"));
        feed(a.as_mut(), &log, true, &startup(), 100);
        feed(a.as_mut(), &log, false, &answer, 100);
        feed(a.as_mut(), &log, true, &insert("r/k0/1"), 100);
        feed(a.as_mut(), &log, true, &insert("r/k0/1"), 100);
        assert_eq!(log.seen().overlapping, [TapId { key: 0, seq: 1 }]);
        let log = TapLog::default();
        let mut b = taps.tap();
        feed(b.as_mut(), &log, true, &ssl, 100);
        feed(b.as_mut(), &log, false, b"S", 100);
        feed(b.as_mut(), &log, true, b"\x16\x03\x01 r/k0/1 r/k0/1", 100);
        assert!(log.seen().left.is_empty());
    }
}
