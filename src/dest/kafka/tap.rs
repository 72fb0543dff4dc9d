//! The Kafka tap: which records went up in a Produce request, and which its answer confirmed.
//!
//! Both directions are length-prefixed frames (read by `wire::kafka`). Upstream, a Produce
//! request is noted under its correlation id with the ids found in its record batches (read as
//! bytes: an uncompressed batch holds each record's value as it was given; a compressed one
//! shows no id and is counted unreadable). Downstream, the answer with that correlation id
//! confirms its records when every partition's error code is 0. The answer's layout follows
//! the request's version, so the request's version is what the answer's reading keeps.

use crate::proxy::tap::{FramedTaps, Framing, IdFinder, Write};
use crate::wire::kafka::{self, PRODUCE};

/// Kafka's Produce request and its answer, as a framed tap reads them.
pub struct KafkaProduce;

/// Makes Kafka taps that find ids of one run.
pub type KafkaTaps = FramedTaps<KafkaProduce>;

impl Framing for KafkaProduce {
    const PROTOCOL: &'static str = "Kafka Produce and its answer";
    /// The correlation id.
    type Key = i32;
    /// The request's version.
    type Note = i16;

    fn frame_len(b: &[u8]) -> Option<usize> {
        kafka::frame_len(b)
    }

    fn write(frame: &[u8], ids: &IdFinder) -> Option<Write<i32, i16>> {
        let header = kafka::request_header(frame.get(4..)?).ok()?;
        (header.api_key == PRODUCE).then(|| Write {
            ids: ids.ids(frame),
            awaits: Some((header.correlation, header.version)),
        })
    }

    fn answers(frame: &[u8]) -> Option<i32> {
        kafka::correlation(frame.get(4..)?).ok()
    }

    fn stored(frame: &[u8], version: &i16) -> bool {
        let answer = frame.get(4..).unwrap_or_default();
        kafka::produce_stored(answer, *version).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::tap::{TapId, TapLog, TapMaker};

    fn frame(body: Vec<u8>) -> Vec<u8> {
        let mut f = (body.len() as i32).to_be_bytes().to_vec();
        f.extend(body);
        f
    }

    fn produce(correlation: i32, version: i16, value: &str) -> Vec<u8> {
        let mut b = 0i16.to_be_bytes().to_vec();
        b.extend(version.to_be_bytes());
        b.extend(correlation.to_be_bytes());
        b.extend(b"\x00\x05drill....records..."); // client id, and the rest as bytes
        b.extend(value.as_bytes());
        frame(b)
    }

    /// A Produce v7 answer: one topic, one partition with `error`.
    fn answer_v7(correlation: i32, error: i16) -> Vec<u8> {
        let mut b = correlation.to_be_bytes().to_vec();
        b.extend(1i32.to_be_bytes());
        b.extend(5i16.to_be_bytes());
        b.extend(b"drill");
        b.extend(1i32.to_be_bytes());
        b.extend(0i32.to_be_bytes());
        b.extend(error.to_be_bytes());
        b.extend([0u8; 8 + 8 + 8]);
        b.extend(0i32.to_be_bytes()); // throttle
        frame(b)
    }

    /// A Produce v9 answer (flexible): one topic, one partition with `error`.
    fn answer_v9(correlation: i32, error: i16) -> Vec<u8> {
        let mut b = correlation.to_be_bytes().to_vec();
        b.push(0); // header tags
        b.push(2); // one topic
        b.push(6);
        b.extend(b"drill");
        b.push(2); // one partition
        b.extend(0i32.to_be_bytes());
        b.extend(error.to_be_bytes());
        b.extend([0u8; 24]);
        b.push(1); // no record errors
        b.push(0); // null error message
        b.push(0); // partition tags
        b.push(0); // topic tags
        b.extend(0i32.to_be_bytes());
        b.push(0);
        frame(b)
    }

    #[test]
    fn produce_requests_go_up_and_their_answers_confirm_them() {
        for (version, answer) in [
            (7, answer_v7 as fn(i32, i16) -> Vec<u8>),
            (9, answer_v9 as fn(i32, i16) -> Vec<u8>),
        ] {
            let mut up = produce(1, version, "{\"id\":\"r/k0/0\"}{\"id\":\"r/k1/0\"}");
            up.extend(produce(2, version, "{\"id\":\"r/k0/1\"}"));
            let metadata = frame([3i16.to_be_bytes(), 12i16.to_be_bytes()].concat());
            up.extend(metadata);
            let mut down = answer(1, 0);
            down.extend(answer(2, 10)); // MESSAGE_TOO_LARGE
            for cut in [1, 3, 9, up.len() / 2] {
                let taps = KafkaTaps::new(IdFinder::new("r"));
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
                assert_eq!(seen.sent.len(), 3, "v{version}, cut at {cut}");
                assert_eq!(seen.left.len(), 3, "v{version}, cut at {cut}");
                assert_eq!(seen.frames, 2, "only produce requests are data");
                assert!(
                    seen.acked.contains(&TapId { key: 1, seq: 0 }),
                    "v{version}, cut at {cut}"
                );
                assert!(
                    !seen.acked.contains(&TapId { key: 0, seq: 1 }),
                    "an error confirms nothing"
                );
            }
        }
    }
}
