//! Protocol taps: what crossed a link, by record.
//!
//! A link may carry a [`Tapping`]: a [`TapMaker`] (a destination kind's protocol reader,
//! `src/dest/<kind>/tap.rs`) and one shared [`TapLog`]. Every connection then gets its own
//! [`Tap`], fed three streams: the bytes read from the engine (a record *left* the engine,
//! whether or not the link passed it on), the bytes written to the broker (it *reached* the
//! broker's socket through the link), and the bytes read from the broker (the broker
//! *answered*, whether or not the answer reached the engine). The tap finds the records' ids
//! in what it reads and notes, in the log, which left, which reached the broker and which the
//! broker confirmed. A tap that pairs requests with answers also reads the bytes written to
//! the engine (the answer *reached* it) and the connection's end, and notes which attempts are
//! open: an id sent again while an attempt carrying it is open is an *overlapping attempt*
//! (one open attempt per write key: docs/src/engine.md, docs/src/destinations.md).
//!
//! The proxy knows no protocol: the tap is called with bytes and decides. A tap must never
//! change, hold or slow the bytes; it reads them, and it must cope with any cut of a stream
//! into chunks (a frame split across reads, many frames in one read).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rustc_hash::FxBuildHasher;

pub mod text;

/// A harness id as a tap holds it: `<run>/k<key>/<seq>`, the run implied by the tap's
/// [`IdFinder`]. Two numbers, so noting a record costs no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TapId {
    pub key: u32,
    pub seq: u64,
}

impl TapId {
    /// The id as the verifier writes it, in run `run`.
    pub fn name(self, run: &str) -> String {
        format!("{run}/k{}/{}", self.key, self.seq)
    }
}

/// Record ids, as the tap found them in the bytes.
pub type Ids = HashSet<TapId, FxBuildHasher>;

/// What all of a link family's connections saw, merged.
#[derive(Debug, Default)]
pub struct TapLog {
    inner: Mutex<Seen>,
}

/// The log's contents.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Ids the engine sent into the link (read from it), whether or not the link passed them.
    pub left: Ids,
    /// Ids written to the broker, with when each was first.
    pub sent: HashMap<TapId, Instant, FxBuildHasher>,
    /// Ids the broker answered positively (stored).
    pub acked: Ids,
    /// Data frames (a publish, a produce) in which no id could be read (compressed, or the
    /// engine's own records): while there are any, a record missing from `sent` may still have
    /// crossed.
    pub unreadable: u64,
    /// Data frames read at all.
    pub frames: u64,
    /// How many attempts carrying each id are open now, on any connection: sent by the engine
    /// and neither answered to it nor ended by the end of their connection (only taps that
    /// pair requests with answers note these: PostgreSQL's).
    pub open: HashMap<TapId, u32, FxBuildHasher>,
    /// Ids the engine sent again while an attempt carrying them was open, once each, in the
    /// order seen.
    pub overlapping: Vec<TapId>,
}

impl TapLog {
    /// Notes ids the engine sent into the link in one data frame.
    pub fn left(&self, ids: &[TapId]) {
        if let Ok(mut s) = self.inner.lock() {
            s.left.extend(ids.iter().copied());
        }
    }

    /// Notes ids written to the broker in one data frame (none found: an unreadable frame).
    pub fn sent(&self, ids: &[TapId]) {
        let now = Instant::now();
        if let Ok(mut s) = self.inner.lock() {
            s.frames += 1;
            if ids.is_empty() {
                s.unreadable += 1;
            }
            for &id in ids {
                s.sent.entry(id).or_insert(now);
            }
        }
    }

    /// Notes ids the broker answered positively.
    pub fn acked(&self, ids: impl IntoIterator<Item = TapId>) {
        if let Ok(mut s) = self.inner.lock() {
            s.acked.extend(ids);
        }
    }

    /// Notes an attempt carrying `ids` that the engine just sent: an id with an attempt still
    /// open is an overlapping attempt.
    pub fn opened(&self, ids: &[TapId]) {
        if let Ok(mut s) = self.inner.lock() {
            for &id in ids {
                let open = s.open.entry(id).or_insert(0);
                *open += 1;
                if *open > 1 && !s.overlapping.contains(&id) {
                    s.overlapping.push(id);
                }
            }
        }
    }

    /// Notes that an attempt carrying `ids` is over: answered to the engine, or its connection
    /// ended.
    pub fn closed(&self, ids: &[TapId]) {
        if let Ok(mut s) = self.inner.lock() {
            for id in ids {
                if let Some(open) = s.open.get_mut(id) {
                    *open -= 1;
                    if *open == 0 {
                        s.open.remove(id);
                    }
                }
            }
        }
    }

    /// What was seen so far.
    pub fn seen(&self) -> Seen {
        self.inner.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// One connection's protocol reader. Each stream is cut into chunks anyhow: a tap keeps a
/// framer per stream.
pub trait Tap: Send {
    /// Bytes read from the engine.
    fn left(&mut self, bytes: &[u8], log: &TapLog);
    /// Bytes written to the broker.
    fn up(&mut self, bytes: &[u8], log: &TapLog);
    /// Bytes read from the broker.
    fn down(&mut self, bytes: &[u8], log: &TapLog);
    /// Bytes written to the engine: an answer reached it (a `delay` holds them until then).
    fn delivered(&mut self, _bytes: &[u8], _log: &TapLog) {}
    /// The connection is over for the engine: it closed its side, or the connection ended.
    /// Called once at least; a tap must take a second call in its stride.
    fn ended(&mut self, _log: &TapLog) {}
}

/// Makes a connection's tap: a destination kind's protocol reader.
pub trait TapMaker: Send + Sync {
    /// The protocol it reads, for the report (`MQTT PUBLISH/PUBACK`).
    fn protocol(&self) -> &'static str;
    fn tap(&self) -> Box<dyn Tap>;
    /// Whether its taps pair the engine's attempts with their answers ([`TapLog::opened`]):
    /// then what they note of overlapping attempts is a judgement.
    fn pairs_answers(&self) -> bool {
        false
    }
}

/// A link's tapping: how to read its connections, and where to note what they carried.
#[derive(Clone)]
pub struct Tapping {
    pub maker: Arc<dyn TapMaker>,
    pub log: Arc<TapLog>,
}

/// One connection's tap with the log it writes to, shared by the connection's two pumps.
pub(crate) struct ConnTap {
    tap: Mutex<Box<dyn Tap>>,
    log: Arc<TapLog>,
}

impl ConnTap {
    pub(crate) fn new(tapping: &Tapping) -> ConnTap {
        ConnTap {
            tap: Mutex::new(tapping.maker.tap()),
            log: tapping.log.clone(),
        }
    }

    pub(crate) fn left(&self, bytes: &[u8]) {
        if let Ok(mut t) = self.tap.lock() {
            t.left(bytes, &self.log);
        }
    }

    pub(crate) fn up(&self, bytes: &[u8]) {
        if let Ok(mut t) = self.tap.lock() {
            t.up(bytes, &self.log);
        }
    }

    pub(crate) fn down(&self, bytes: &[u8]) {
        if let Ok(mut t) = self.tap.lock() {
            t.down(bytes, &self.log);
        }
    }

    pub(crate) fn delivered(&self, bytes: &[u8]) {
        if let Ok(mut t) = self.tap.lock() {
            t.delivered(bytes, &self.log);
        }
    }

    pub(crate) fn ended(&self) {
        if let Ok(mut t) = self.tap.lock() {
            t.ended(&self.log);
        }
    }
}

impl Drop for ConnTap {
    /// However the connection ended, its attempts are over.
    fn drop(&mut self) {
        self.ended();
    }
}

/// Frames cut out of a byte stream that arrives in arbitrary chunks: bytes are kept until a
/// whole frame is in, each whole frame handed on, the rest kept for the next chunk. What a
/// frame is, the protocol says (`frame_len`: the length of the frame at the start of the
/// buffer, `None` until enough is in to tell).
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
    /// Bytes to pass over without keeping them (the rest of a frame too large to hold).
    skip: usize,
}

/// Frames larger than this are not kept whole: the tap reads the first `MAX_FRAME` bytes of
/// one and skips the rest (a record's id is near its start; a frame this large is rare).
pub const MAX_FRAME: usize = 4 << 20;

impl Framer {
    /// Feeds `bytes`; calls `each` with every whole frame (at most [`MAX_FRAME`] of it).
    pub fn feed(
        &mut self,
        bytes: &[u8],
        frame_len: impl Fn(&[u8]) -> Option<usize>,
        mut each: impl FnMut(&[u8]),
    ) {
        let mut bytes = bytes;
        if self.skip > 0 {
            let n = self.skip.min(bytes.len());
            self.skip -= n;
            bytes = &bytes[n..];
        }
        if self.buf.is_empty() {
            // The fast path: whole frames straight from the chunk, only a tail kept.
            let used = Self::frames(bytes, &frame_len, &mut each, &mut self.skip);
            self.buf.extend_from_slice(&bytes[used..]);
            return;
        }
        self.buf.extend_from_slice(bytes);
        let buf = std::mem::take(&mut self.buf);
        let used = Self::frames(&buf, &frame_len, &mut each, &mut self.skip);
        self.buf = buf;
        self.buf.drain(..used);
    }

    /// Hands on the whole frames at the start of `bytes`; returns how many bytes they took.
    fn frames(
        bytes: &[u8],
        frame_len: &impl Fn(&[u8]) -> Option<usize>,
        each: &mut impl FnMut(&[u8]),
        skip: &mut usize,
    ) -> usize {
        let mut at = 0;
        while at < bytes.len() {
            let Some(len) = frame_len(&bytes[at..]) else {
                break;
            };
            let len = len.max(1);
            if at + len <= bytes.len() {
                each(&bytes[at..at + len]);
                at += len;
            } else if len > MAX_FRAME {
                // Too large to hold: read what is here (its start) and skip the rest.
                each(&bytes[at..]);
                *skip = len - (bytes.len() - at);
                return bytes.len();
            } else {
                break;
            }
        }
        at
    }
}

/// A protocol whose writes and answers are frames, as a [`FramedTap`] reads it: where a frame
/// ends, which frames are writes (and which answer ties back to each), and whether an answer
/// says stored. Kafka (Produce and its answer), MQTT (PUBLISH and PUBACK) and NATS (PUB and
/// the stream's PubAck) are each one of these; the tap's body is written once, here.
pub trait Framing: Send + Sync + 'static {
    /// The protocol, for the report (`MQTT PUBLISH/PUBACK`).
    const PROTOCOL: &'static str;
    /// What ties an answer to its write: a correlation id, a packet id, a reply subject.
    type Key: std::hash::Hash + Eq + Send;
    /// What reading the answer needs to know of its write (Kafka: the request's version).
    type Note: Send;

    /// The length of the frame at the start of `b`; `None` until enough is in to tell.
    fn frame_len(b: &[u8]) -> Option<usize>;
    /// A write's ids, and the key its answer will carry (`None`: no answer is awaited, as for
    /// an MQTT QoS 0 PUBLISH). `None`: the frame is no write.
    fn write(frame: &[u8], ids: &IdFinder) -> Option<Write<Self::Key, Self::Note>>;
    /// The key of the write an answer answers (`None`: the frame is no answer to a write).
    fn answers(frame: &[u8]) -> Option<Self::Key>;
    /// Whether the answer says the write was stored (`false` for a refusal, or when it
    /// cannot be read).
    fn stored(frame: &[u8], note: &Self::Note) -> bool;
}

/// A write as a [`Framing`] reads it.
pub struct Write<K, N> {
    pub ids: Vec<TapId>,
    /// The key its answer will carry and what reading that answer needs.
    pub awaits: Option<(K, N)>,
}

/// Makes [`FramedTap`]s of one protocol that find ids of one run.
pub struct FramedTaps<P> {
    ids: IdFinder,
    protocol: std::marker::PhantomData<fn() -> P>,
}

impl<P: Framing> FramedTaps<P> {
    pub fn new(ids: IdFinder) -> FramedTaps<P> {
        FramedTaps {
            ids,
            protocol: std::marker::PhantomData,
        }
    }
}

impl<P: Framing> TapMaker for FramedTaps<P> {
    fn protocol(&self) -> &'static str {
        P::PROTOCOL
    }

    fn tap(&self) -> Box<dyn Tap> {
        Box::new(FramedTap::<P> {
            ids: self.ids.clone(),
            left: Framer::default(),
            up: Framer::default(),
            down: Framer::default(),
            waiting: HashMap::default(),
        })
    }
}

/// One connection's tap for a [`Framing`] protocol: a write read from the engine *left*; one
/// written to the broker was *sent*, and awaits its answer under its key; an answer read from
/// the broker that says stored *confirms* the write's ids.
pub struct FramedTap<P: Framing> {
    ids: IdFinder,
    left: Framer,
    up: Framer,
    down: Framer,
    waiting: HashMap<P::Key, (P::Note, Vec<TapId>), FxBuildHasher>,
}

impl<P: Framing> Tap for FramedTap<P> {
    fn left(&mut self, bytes: &[u8], log: &TapLog) {
        let ids = &self.ids;
        self.left.feed(bytes, P::frame_len, |frame| {
            if let Some(write) = P::write(frame, ids) {
                log.left(&write.ids);
            }
        });
    }

    fn up(&mut self, bytes: &[u8], log: &TapLog) {
        let (ids, waiting) = (&self.ids, &mut self.waiting);
        self.up.feed(bytes, P::frame_len, |frame| {
            let Some(write) = P::write(frame, ids) else {
                return;
            };
            log.sent(&write.ids);
            if let Some((key, note)) = write.awaits {
                waiting.insert(key, (note, write.ids));
            }
        });
    }

    fn down(&mut self, bytes: &[u8], log: &TapLog) {
        let waiting = &mut self.waiting;
        self.down.feed(bytes, P::frame_len, |frame| {
            let Some((note, ids)) = P::answers(frame).and_then(|key| waiting.remove(&key)) else {
                return;
            };
            if P::stored(frame, &note) {
                log.acked(ids);
            }
        });
    }
}

/// Finds harness ids (`<run>/k<N>/<seq>`) in bytes, as the verifier does: `prefix` is
/// `<run>/`.
#[derive(Debug, Clone)]
pub struct IdFinder {
    prefix: memchr::memmem::Finder<'static>,
}

impl IdFinder {
    pub fn new(run: &str) -> IdFinder {
        IdFinder {
            prefix: memchr::memmem::Finder::new(format!("{run}/").as_bytes()).into_owned(),
        }
    }

    /// Every distinct id in `bytes`, in order. An id whose numbers the verifier would not
    /// write so (a leading zero, too many digits) is not one of drill's and is passed over.
    pub fn ids(&self, bytes: &[u8]) -> Vec<TapId> {
        let mut ids: Vec<TapId> = Vec::new();
        // Dedup by a set once there are many: a Kafka batch holds thousands of records.
        let mut seen: HashSet<TapId, FxBuildHasher> = HashSet::default();
        let p = self.prefix.needle().len();
        let mut i = 0;
        while let Some(found) = self.prefix.find(&bytes[i..]) {
            let after = i + found + p;
            i = after;
            if bytes.get(after) != Some(&b'k') {
                continue;
            }
            let Some((key, slash)) = number(bytes, after + 1) else {
                continue;
            };
            if bytes.get(slash) != Some(&b'/') {
                continue;
            }
            let Some((seq, end)) = number(bytes, slash + 1) else {
                continue;
            };
            i = end;
            let Ok(key) = u32::try_from(key) else {
                continue;
            };
            let id = TapId { key, seq };
            if ids.len() < 8 {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            } else {
                if seen.is_empty() {
                    seen.extend(ids.iter().copied());
                }
                if seen.insert(id) {
                    ids.push(id);
                }
            }
        }
        ids
    }
}

/// The decimal number written at `from` as the verifier writes one (no leading zero, fits a
/// u64), and where it ends.
fn number(bytes: &[u8], from: usize) -> Option<(u64, usize)> {
    let digits = bytes
        .get(from..)?
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    if digits == 0 || (digits > 1 && bytes[from] == b'0') {
        return None;
    }
    let mut v = 0u64;
    for &d in &bytes[from..from + digits] {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some((v, from + digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_found_wherever_they_sit_once_each() {
        let f = IdFinder::new("run-1");
        let bytes = br#"{"id":"run-1/k3/17","x":"run-1/k3/17"} run-1/k10/2 run-1/kx/1 run-1/k2/ run-2/k1/1"#;
        let named: Vec<String> = f.ids(bytes).into_iter().map(|i| i.name("run-1")).collect();
        assert_eq!(named, ["run-1/k3/17", "run-1/k10/2"]);
        assert!(f.ids(b"run-1/k01/2 run-1/k1/02").is_empty());
        assert!(f.ids(b"nothing here").is_empty());
        // Every sequence a u64 holds is an id, 20 digits too (fuzzing found 10^19 passed
        // over); one past u64::MAX is not.
        let max = format!("run-1/k1/{}", u64::MAX);
        assert_eq!(
            f.ids(max.as_bytes()),
            [TapId {
                key: 1,
                seq: u64::MAX
            }]
        );
        assert!(f.ids(b"run-1/k1/18446744073709551616").is_empty());
    }

    /// A frame here: one length byte, then that many bytes.
    fn len(b: &[u8]) -> Option<usize> {
        b.first().map(|n| *n as usize + 1)
    }

    #[test]
    fn frames_are_whole_however_the_stream_is_cut() {
        let stream = [2u8, b'a', b'b', 0, 3, b'c', b'd', b'e'];
        for cut in 0..=stream.len() {
            let mut framer = Framer::default();
            let mut got = Vec::new();
            let (a, b) = stream.split_at(cut);
            framer.feed(a, len, |f| got.push(f.to_vec()));
            framer.feed(b, len, |f| got.push(f.to_vec()));
            assert_eq!(
                got,
                vec![vec![2, b'a', b'b'], vec![0], vec![3, b'c', b'd', b'e']],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_frame_too_large_to_hold_is_read_from_its_start_and_skipped() {
        let big = |b: &[u8]| b.first().map(|_| MAX_FRAME + 10);
        let mut framer = Framer::default();
        let mut got = Vec::new();
        framer.feed(&[1, 2, 3], big, |f| got.push(f.len()));
        assert_eq!(got, [3]);
        // The rest of it is passed over: nothing more until it has gone by.
        framer.feed(&vec![0; MAX_FRAME + 7], big, |f| got.push(f.len()));
        assert_eq!(got, [3]);
    }
}
