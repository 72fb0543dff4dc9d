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

use crate::proxy::tap::text::TextTaps;

/// What the syslog tap reads, for the report.
pub const PROTOCOL: &str = "syslog messages (RELP, TCP, UDP)";

/// Makes syslog taps that find ids of one run: syslog is plain text on every transport.
pub fn taps(run: &str) -> TextTaps {
    TextTaps::new(run, PROTOCOL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::tap::{TapId, TapLog, TapMaker};

    #[test]
    fn every_id_is_read_whole_however_the_stream_is_cut() {
        let taps = taps("run-7");
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
