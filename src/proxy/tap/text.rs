//! A tap for protocols whose records cross in plain text (syslog on every transport, an AMQP
//! message body): which records left the engine into the link, and which the link wrote on to
//! the receiver. It needs no framing: it reads each stream for harness ids, keeping the last
//! bytes of a chunk for the next (an id cut in two by the stream's chunks is read whole). A
//! datagram link makes a tap per datagram, so nothing carries over from one datagram to the
//! next. It notes no confirmation: what answers a record is the protocol's own to read.

use super::{IdFinder, Tap, TapId, TapLog, TapMaker};

/// Makes text taps that find ids of one run.
pub struct TextTaps {
    pub ids: IdFinder,
    /// What the tap reads, for the report (`syslog messages (RELP, TCP, UDP)`).
    pub protocol: &'static str,
    /// The run's id: an id is at most this plus `/k<u32>/<u64>` long, which is what a chunk's
    /// tail must keep.
    pub carry: usize,
}

impl TextTaps {
    pub fn new(run: &str, protocol: &'static str) -> TextTaps {
        TextTaps {
            ids: IdFinder::new(run),
            protocol,
            // `<run>/k` + 10 digits + `/` + 20 digits, and one byte to see where it ends.
            carry: run.len() + 3 + 10 + 20 + 1,
        }
    }
}

impl TapMaker for TextTaps {
    fn protocol(&self) -> &'static str {
        self.protocol
    }

    fn tap(&self) -> Box<dyn Tap> {
        Box::new(TextTap {
            ids: self.ids.clone(),
            carry: self.carry,
            left: Vec::new(),
            up: Vec::new(),
        })
    }
}

struct TextTap {
    ids: IdFinder,
    carry: usize,
    /// The tail of what was read from the engine so far.
    left: Vec<u8>,
    /// The tail of what was written to the receiver so far.
    up: Vec<u8>,
}

/// The ids in `tail` + `bytes`, keeping the last `carry` bytes as the next tail. Digits at the
/// very end may go on in the next chunk (`k1/4` of `k1/40`): they are read next time.
fn scan(ids: &IdFinder, tail: &mut Vec<u8>, carry: usize, bytes: &[u8]) -> Vec<TapId> {
    tail.extend_from_slice(bytes);
    let digits = tail.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    let found = ids.ids(&tail[..tail.len() - digits]);
    let keep = tail.len().min(carry);
    let cut = tail.len() - keep;
    // Found again next time (it sits in what is kept): a set downstream makes it once.
    tail.drain(..cut);
    found
}

impl Tap for TextTap {
    fn left(&mut self, bytes: &[u8], log: &TapLog) {
        let found = scan(&self.ids, &mut self.left, self.carry, bytes);
        if !found.is_empty() {
            log.left(&found);
        }
    }

    fn up(&mut self, bytes: &[u8], log: &TapLog) {
        let found = scan(&self.ids, &mut self.up, self.carry, bytes);
        if !found.is_empty() {
            log.sent(&found);
        }
    }

    fn down(&mut self, _bytes: &[u8], _log: &TapLog) {}
}
