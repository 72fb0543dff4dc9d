//! The Kafka tap: which records went up in a Produce request, and which its answer confirmed.
//!
//! Both directions are length-prefixed frames. Upstream, a Produce request (API key 0) is noted
//! under its correlation id with the ids found in its record batches (read as bytes: an
//! uncompressed batch holds each record's value as it was given; a compressed one shows no id
//! and is counted unreadable). Downstream, the answer with that correlation id confirms its
//! records when every partition's error code is 0. The answer's layout follows the request's
//! version: flexible (compact arrays and strings, tagged fields) from v9.

use std::collections::HashMap;

use crate::proxy::tap::{Framer, IdFinder, Tap, TapId, TapLog, TapMaker};

/// Makes Kafka taps that find ids of one run.
pub struct KafkaTaps {
    pub ids: IdFinder,
}

impl TapMaker for KafkaTaps {
    fn protocol(&self) -> &'static str {
        "Kafka Produce and its answer"
    }

    fn tap(&self) -> Box<dyn Tap> {
        Box::new(KafkaTap {
            ids: self.ids.clone(),
            left: Framer::default(),
            up: Framer::default(),
            down: Framer::default(),
            waiting: HashMap::new(),
        })
    }
}

struct KafkaTap {
    ids: IdFinder,
    left: Framer,
    up: Framer,
    down: Framer,
    /// Each Produce request awaiting its answer, by correlation id: its version and ids.
    waiting: HashMap<i32, (i16, Vec<TapId>)>,
}

/// A frame: a 4-byte big-endian length, then that many bytes.
fn frame_len(b: &[u8]) -> Option<usize> {
    let n = i32::from_be_bytes(b.get(..4)?.try_into().ok()?);
    Some(4 + usize::try_from(n).unwrap_or(0))
}

/// A Produce request's version, correlation id and ids (`None`: another request).
fn produce(frame: &[u8], ids: &IdFinder) -> Option<(i16, i32, Vec<TapId>)> {
    let mut r = Reader::new(frame.get(4..).unwrap_or_default());
    let (key, version, correlation) = (r.i16()?, r.i16()?, r.i32()?);
    (key == 0).then(|| (version, correlation, ids.ids(frame)))
}

impl Tap for KafkaTap {
    fn left(&mut self, bytes: &[u8], log: &TapLog) {
        let ids = &self.ids;
        self.left.feed(bytes, frame_len, |frame| {
            if let Some((_, _, found)) = produce(frame, ids) {
                log.left(&found);
            }
        });
    }

    fn up(&mut self, bytes: &[u8], log: &TapLog) {
        let (ids, waiting) = (&self.ids, &mut self.waiting);
        self.up.feed(bytes, frame_len, |frame| {
            let Some((version, correlation, found)) = produce(frame, ids) else {
                return;
            };
            waiting.insert(correlation, (version, found.clone()));
            log.sent(&found);
        });
    }

    fn down(&mut self, bytes: &[u8], log: &TapLog) {
        let waiting = &mut self.waiting;
        self.down.feed(bytes, frame_len, |frame| {
            let mut r = Reader::new(frame.get(4..).unwrap_or_default());
            let Some(correlation) = r.i32() else {
                return;
            };
            let Some((version, ids)) = waiting.remove(&correlation) else {
                return;
            };
            if produce_stored(&mut r, version) == Some(true) {
                log.acked(ids);
            }
        });
    }
}

/// Whether a Produce answer (after its correlation id) says every partition stored its batch:
/// `None` when it cannot be read.
fn produce_stored(r: &mut Reader<'_>, version: i16) -> Option<bool> {
    let flexible = version >= 9;
    if flexible {
        r.tags()?;
    }
    let mut any = false;
    for _ in 0..r.array(flexible)? {
        r.string(flexible)?;
        for _ in 0..r.array(flexible)? {
            r.skip(4)?; // partition index
            if r.i16()? != 0 {
                return Some(false);
            }
            any = true;
            r.skip(8)?; // base offset
            if version >= 2 {
                r.skip(8)?; // log append time
            }
            if version >= 5 {
                r.skip(8)?; // log start offset
            }
            if version >= 8 {
                for _ in 0..r.array(flexible)? {
                    r.skip(4)?;
                    r.string(flexible)?;
                    if flexible {
                        r.tags()?;
                    }
                }
                r.string(flexible)?;
            }
            if flexible {
                r.tags()?;
            }
        }
        if flexible {
            r.tags()?;
        }
    }
    Some(any)
}

/// A cursor over a frame's bytes, with Kafka's encodings.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, at: 0 }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(drop)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn uvarint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let byte = *self.take(1)?.first()?;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// An array's length (a null array: 0).
    fn array(&mut self, flexible: bool) -> Option<usize> {
        if flexible {
            Some(usize::try_from(self.uvarint()?.saturating_sub(1)).ok()?)
        } else {
            Some(usize::try_from(self.i32()?.max(0)).ok()?)
        }
    }

    /// Skips a (nullable) string.
    fn string(&mut self, flexible: bool) -> Option<()> {
        let n = if flexible {
            self.uvarint()?.saturating_sub(1) as usize
        } else {
            usize::try_from(self.i16()?.max(0)).ok()?
        };
        self.skip(n)
    }

    /// Skips a tagged-field buffer.
    fn tags(&mut self) -> Option<()> {
        for _ in 0..self.uvarint()? {
            self.uvarint()?;
            let n = self.uvarint()? as usize;
            self.skip(n)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                let taps = KafkaTaps {
                    ids: IdFinder::new("r"),
                };
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
