//! The syslog tap: which records left the engine into the link, and which the link wrote on to
//! the receiver — over RELP, plain TCP (octet counting or a newline per message) and UDP alike.
//!
//! Syslog is plain text on every transport drill speaks, so the tap needs no framing: it reads
//! each stream for harness ids, keeping the last bytes of a chunk for the next (an id cut in two
//! by the stream's chunks is read whole). A datagram link makes a tap per datagram, so nothing
//! carries over from one datagram to the next. Nothing answers a message on TCP or UDP, and
//! RELP's `rsp` names a transaction, not a record: this tap notes no confirmation.
//!
//! What it gives the verdict: on TCP and UDP the engine's journal is the only word that a
//! record was sent (`sent_unconfirmed`); a record the journal calls sent that the link never
//! read from the engine was never written, and is *lost before sending*
//! (`report::verdict`).

use crate::proxy::tap::{IdFinder, Tap, TapId, TapLog, TapMaker};

/// Makes syslog taps that find ids of one run.
pub struct SyslogTaps {
    pub ids: IdFinder,
    /// The run's id: an id is at most this plus `/k<u32>/<u64>` long, which is what a chunk's
    /// tail must keep.
    pub carry: usize,
}

impl SyslogTaps {
    pub fn new(run: &str) -> SyslogTaps {
        SyslogTaps {
            ids: IdFinder::new(run),
            // `<run>/k` + 10 digits + `/` + 20 digits, and one byte to see where it ends.
            carry: run.len() + 3 + 10 + 20 + 1,
        }
    }
}

impl TapMaker for SyslogTaps {
    fn protocol(&self) -> &'static str {
        "syslog messages (RELP, TCP, UDP)"
    }

    fn tap(&self) -> Box<dyn Tap> {
        Box::new(SyslogTap {
            ids: self.ids.clone(),
            carry: self.carry,
            left: Vec::new(),
            up: Vec::new(),
        })
    }
}

struct SyslogTap {
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

impl Tap for SyslogTap {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_is_read_whole_however_the_stream_is_cut() {
        let taps = SyslogTaps::new("run-7");
        let stream: Vec<u8> = (1..=40u64)
            .flat_map(|i| {
                crate::wire::syslog::octet_counted(&format!(
                    "<13>1 - h drill - - [drill key=\"k\"] {{\"id\":\"run-7/k{}/{}\"}}",
                    i % 3,
                    i * 100 + 7
                ))
            })
            .collect();
        for chunk in [1, 2, 5, 17, 64, 1000] {
            let log = TapLog::default();
            let mut tap = taps.tap();
            for piece in stream.chunks(chunk) {
                tap.left(piece, &log);
                tap.up(piece, &log);
            }
            let seen = log.seen();
            // Each id once and whole: never a prefix of one (`k1/1` or `k1/10` of `k1/107`)
            // read as an id of its own.
            let all: std::collections::HashSet<TapId> = (1..=40u64)
                .map(|i| TapId {
                    key: (i % 3) as u32,
                    seq: i * 100 + 7,
                })
                .collect();
            assert_eq!(seen.left.iter().copied().collect::<std::collections::HashSet<_>>(), all, "chunks of {chunk}");
            assert_eq!(seen.sent.len(), 40, "chunks of {chunk}");
            assert_eq!(seen.unreadable, 0);
        }
    }
}
