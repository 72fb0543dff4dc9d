//! The JetStream tap: which records went up in a PUB (or HPUB), and which the stream's PubAck
//! confirmed.
//!
//! NATS is a text protocol: a control line ending in CRLF, and for `PUB`/`HPUB` (client →
//! server) and `MSG`/`HMSG` (server → client) a payload of the size the line's last token
//! gives, then CRLF. A JetStream publish names a reply subject; the stream answers there with
//! `{"stream": …, "seq": …}` (stored, or a duplicate it already has) or `{"error": …}`.

use std::hash::BuildHasher;

use rustc_hash::FxBuildHasher;

use crate::proxy::tap::{FramedTaps, Framing, IdFinder, TapId, Write};

/// NATS's PUB/HPUB and the stream's answer on the reply subject, as a framed tap reads them.
pub struct NatsPublish;

/// Makes JetStream taps that find ids of one run.
pub type NatsTaps = FramedTaps<NatsPublish>;

impl Framing for NatsPublish {
    const PROTOCOL: &'static str = "NATS PUB/HPUB and the stream's PubAck";
    /// The reply subject (its hash).
    type Key = u64;
    type Note = ();

    fn frame_len(b: &[u8]) -> Option<usize> {
        op_len(b)
    }

    fn write(op: &[u8], ids: &IdFinder) -> Option<Write<u64, ()>> {
        let (reply, ids) = publish(op, ids)?;
        Some(Write {
            ids,
            awaits: reply.map(|reply| (reply, ())),
        })
    }

    /// A `MSG`/`HMSG` on a reply subject.
    fn answers(op: &[u8]) -> Option<u64> {
        let (name, _) = split_op(op);
        if name != b"MSG" && name != b"HMSG" {
            return None;
        }
        let (tokens, _) = parts(op);
        tokens.first().map(|s| subject(s))
    }

    /// `{"stream": …, "seq": …}` (stored, or a duplicate the stream already has), not
    /// `{"error": …}`.
    fn stored(op: &[u8], _: &()) -> bool {
        let (_, payload) = parts(op);
        let text = String::from_utf8_lossy(payload);
        text.contains("\"stream\"") && !text.contains("\"error\"")
    }
}

/// A control line longer than this is no NATS: passed over.
const MAX_LINE: usize = 64 * 1024;

/// The length of the operation at the start of `b`: its line, and for one that carries a
/// payload, the payload and its CRLF.
fn op_len(b: &[u8]) -> Option<usize> {
    let Some(end) = memchr::memmem::find(b, b"\r\n") else {
        return (b.len() > MAX_LINE).then_some(b.len());
    };
    let line = &b[..end];
    let (op, _) = split_op(line);
    let payload = match op {
        b"PUB" | b"HPUB" | b"MSG" | b"HMSG" => std::str::from_utf8(line)
            .ok()
            .and_then(|l| l.split_ascii_whitespace().last())
            .and_then(|n| n.parse::<usize>().ok())
            .map_or(0, |n| n + 2),
        _ => 0,
    };
    Some(end + 2 + payload)
}

fn split_op(line: &[u8]) -> (&[u8], &[u8]) {
    let i = line
        .iter()
        .position(|b| b.is_ascii_whitespace())
        .unwrap_or(line.len());
    (&line[..i], &line[i..])
}

/// An operation's tokens (after the op) and its payload.
fn parts(op: &[u8]) -> (Vec<&str>, &[u8]) {
    let end = memchr::memmem::find(op, b"\r\n").unwrap_or(op.len());
    let tokens = std::str::from_utf8(&op[..end])
        .map(|l| l.split_ascii_whitespace().skip(1).collect())
        .unwrap_or_default();
    let payload = op
        .get(end + 2..op.len().saturating_sub(2))
        .unwrap_or_default();
    (tokens, payload)
}

/// A subject, as the waiting table keys it.
fn subject(s: &str) -> u64 {
    FxBuildHasher.hash_one(s)
}

/// A publish's ids and its reply subject, if it names one (`None`: no PUB or HPUB).
fn publish(op: &[u8], ids: &IdFinder) -> Option<(Option<u64>, Vec<TapId>)> {
    let (name, _) = split_op(op);
    // PUB subject [reply] size; HPUB subject [reply] header-size total-size.
    let sizes = match name {
        b"PUB" => 1,
        b"HPUB" => 2,
        _ => return None,
    };
    let (tokens, payload) = parts(op);
    let reply = (tokens.len() == 2 + sizes).then(|| subject(tokens[1]));
    Some((reply, ids.ids(payload)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::tap::{TapLog, TapMaker};

    #[test]
    fn publishes_go_up_and_pubacks_confirm_them_however_the_stream_is_cut() {
        let mut up = b"CONNECT {\"verbose\":false}\r\nPING\r\nSUB _INBOX.x.* 1\r\n".to_vec();
        let body = b"NATS/1.0\r\nNats-Msg-Id: w-1\r\n\r\n{\"id\":\"r/k0/0\"}";
        up.extend(format!("HPUB drill _INBOX.x.1 34 {}\r\n", body.len()).as_bytes());
        up.extend(body);
        up.extend(b"\r\nPUB drill _INBOX.x.2 15\r\n{\"id\":\"r/k0/1\"}\r\n");
        up.extend(b"PUB other 5\r\nhello\r\n");
        let ack = b"{\"stream\":\"DRILL\",\"seq\":1}";
        let mut down = b"INFO {}\r\nPONG\r\n".to_vec();
        down.extend(format!("MSG _INBOX.x.1 1 {}\r\n", ack.len()).as_bytes());
        down.extend(ack);
        let refused = b"{\"error\":{\"code\":400}}";
        down.extend(format!("\r\nMSG _INBOX.x.2 1 {}\r\n", refused.len()).as_bytes());
        down.extend(refused);
        down.extend(b"\r\n");
        for cut in [1, 5, 40, up.len() / 2] {
            let taps = NatsTaps::new(IdFinder::new("r"));
            let log = TapLog::default();
            let mut tap = taps.tap();
            let (a, b) = up.split_at(cut.min(up.len()));
            tap.left(a, &log);
            tap.left(b, &log);
            tap.up(a, &log);
            tap.up(b, &log);
            let (a, b) = down.split_at(cut.min(down.len()));
            tap.down(a, &log);
            tap.down(b, &log);
            let seen = log.seen();
            assert_eq!(seen.sent.len(), 2, "cut at {cut}");
            assert_eq!(seen.left.len(), 2, "cut at {cut}");
            assert_eq!((seen.frames, seen.unreadable), (3, 1), "`hello` has no id");
            assert!(
                seen.acked.contains(&TapId { key: 0, seq: 0 }),
                "cut at {cut}"
            );
            assert!(
                !seen.acked.contains(&TapId { key: 0, seq: 1 }),
                "an error confirms nothing"
            );
        }
    }
}
