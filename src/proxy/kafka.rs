//! Kafka-aware links: every broker of a cluster reached through a link of its own.
//!
//! A Kafka client asks any broker for metadata and then connects straight to every broker's
//! *advertised* address. A plain link in front of the bootstrap broker would carry the metadata
//! request and nothing else: the produce traffic would go around the fault. A Kafka-aware link
//! reads Kafka's framing (a 4-byte length, then for a request the api key, version and
//! correlation id) and rewrites the broker addresses inside the three answers that carry them —
//! Metadata, FindCoordinator and DescribeCluster, every version, flexible (compact) and not —
//! so each broker appears at a link of its own, `<name>-<node id>` (`kafka-1`), created the
//! first time an answer names it. The broker may then advertise itself. It also drops the
//! trailing tagged fields of an ApiVersions answer (v3 on), which librdkafka up to 2.0 — kcat,
//! rsyslog's omkafka, syslog-ng — cannot read (tansu sends four), and counts those it changed.
//!
//! What this module keeps to:
//! - Only broker host and port fields change. Every other byte of an answer is copied as it
//!   came (the edit replaces spans of the original frame), and every other frame passes
//!   untouched, without being buffered: only an answer being rewritten is held, one frame.
//! - Faults stay byte-level and per link. A fault on the family's head (`kafka`) is in force on
//!   every member too, members created later included; a fault on `kafka-2` is that one's.
//! - An answer that cannot be parsed passes unchanged (and is counted): the link never breaks a
//!   conversation it does not understand.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio_util::sync::CancellationToken;

use super::{FaultSpec, Link};
use crate::wire::kafka::{
    API_VERSIONS, BrokerAddress, request_header, rewrite, rewritten, trim_api_versions,
};

/// The most an answer being rewritten may hold (a metadata answer of a very large cluster is a
/// few MiB); a longer frame passes unchanged.
const MAX_REWRITE: usize = 64 * 1024 * 1024;

/// Requests in flight on one connection whose answers carry broker addresses: correlation id →
/// (api key, version). The client → broker side fills it before it forwards the request, so
/// the answer always finds its entry.
pub(crate) type Pending = Arc<Mutex<HashMap<i32, (i16, i16)>>>;

/// Follows the client → broker byte stream frame by frame and notes the requests whose answers
/// are to be rewritten. It never changes a byte and holds at most a 12-byte header.
#[derive(Default)]
pub(crate) struct Requests {
    head: [u8; 12],
    head_len: usize,
    /// Bytes of the current frame still to pass after its header.
    skip: usize,
}

impl Requests {
    pub(crate) fn observe(&mut self, mut bytes: &[u8], pending: &Pending) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (12 - self.head_len).min(bytes.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
            self.head_len += n;
            bytes = &bytes[n..];
            if self.head_len < 12 {
                return;
            }
            self.head_len = 0;
            let h = &self.head;
            let size = i32::from_be_bytes([h[0], h[1], h[2], h[3]]).max(8) as usize;
            self.skip = size - 8;
            if let Ok(h) = request_header(&h[4..])
                && rewritten(h.api_key, h.version)
                && let Ok(mut p) = pending.lock()
            {
                p.insert(h.correlation, (h.api_key, h.version));
            }
        }
    }
}

/// Where the broker → client side is in its byte stream.
enum State {
    /// Reading the next frame's length and correlation id.
    Head { buf: [u8; 8], len: usize },
    /// Passing `left` more bytes of a frame nobody rewrites.
    Pass { left: usize },
    /// Holding one answer to rewrite: its bytes after the length prefix.
    Hold {
        api_key: i16,
        version: i16,
        frame: Vec<u8>,
        size: usize,
    },
}

/// Follows the broker → client byte stream and rewrites the answers [`Requests`] noted.
pub(crate) struct Answers {
    state: State,
}

impl Default for Answers {
    fn default() -> Self {
        Answers {
            state: State::Head {
                buf: [0; 8],
                len: 0,
            },
        }
    }
}

impl Answers {
    /// Whether the next `n` bytes pass as they are (the common case: the middle of a frame
    /// nobody rewrites); if so they are accounted for and the caller writes them unchanged.
    pub(crate) fn passes(&mut self, n: usize) -> bool {
        if let State::Pass { left } = &mut self.state
            && *left >= n
        {
            *left -= n;
            return true;
        }
        false
    }

    /// Feeds bytes read from the broker; what the client should get is appended to `out`.
    pub(crate) fn feed(
        &mut self,
        mut bytes: &[u8],
        pending: &Pending,
        out: &mut Vec<u8>,
        mut rewrite_one: impl FnMut(i16, i16, &[u8]) -> Option<Vec<u8>>,
    ) {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Pass { left } => {
                    let n = (*left).min(bytes.len());
                    out.extend_from_slice(&bytes[..n]);
                    *left -= n;
                    bytes = &bytes[n..];
                    if *left == 0 {
                        self.state = State::Head {
                            buf: [0; 8],
                            len: 0,
                        };
                    }
                }
                State::Head { buf, len } => {
                    let n = (8 - *len).min(bytes.len());
                    buf[*len..*len + n].copy_from_slice(&bytes[..n]);
                    *len += n;
                    bytes = &bytes[n..];
                    if *len < 8 {
                        continue;
                    }
                    let head = *buf;
                    let size =
                        i32::from_be_bytes([head[0], head[1], head[2], head[3]]).max(4) as usize;
                    let correlation = i32::from_be_bytes([head[4], head[5], head[6], head[7]]);
                    let wanted = pending.lock().ok().and_then(|mut p| p.remove(&correlation));
                    match wanted {
                        Some((api_key, version)) if size <= MAX_REWRITE => {
                            let mut frame = Vec::with_capacity(size);
                            frame.extend_from_slice(&head[4..]);
                            self.state = State::Hold {
                                api_key,
                                version,
                                frame,
                                size,
                            };
                        }
                        _ => {
                            out.extend_from_slice(&head);
                            self.state = State::Pass { left: size - 4 };
                        }
                    }
                    if size == 4 {
                        self.finish(out, &mut rewrite_one);
                    }
                }
                State::Hold { frame, size, .. } => {
                    let n = (*size - frame.len()).min(bytes.len());
                    frame.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if frame.len() == *size {
                        self.finish(out, &mut rewrite_one);
                    }
                }
            }
        }
        if let State::Pass { left: 0 } = self.state {
            self.state = State::Head {
                buf: [0; 8],
                len: 0,
            };
        }
    }

    /// Emits the held answer, rewritten (or as it came when it cannot be read).
    fn finish(
        &mut self,
        out: &mut Vec<u8>,
        rewrite_one: &mut impl FnMut(i16, i16, &[u8]) -> Option<Vec<u8>>,
    ) {
        let state = std::mem::replace(
            &mut self.state,
            State::Head {
                buf: [0; 8],
                len: 0,
            },
        );
        match state {
            State::Hold {
                api_key,
                version,
                frame,
                ..
            } => {
                let new = rewrite_one(api_key, version, &frame);
                let body = new.as_deref().unwrap_or(&frame);
                out.extend_from_slice(&(body.len() as i32).to_be_bytes());
                out.extend_from_slice(body);
            }
            State::Pass { left } if left > 0 => self.state = State::Pass { left },
            _ => {}
        }
    }
}

/// The links of one Kafka cluster: the head (the bootstrap link, named e.g. `kafka`) and one
/// member per broker (`kafka-<node id>`), created the first time an answer names the broker.
pub(crate) struct Family {
    /// The head's name, the members' prefix.
    pub(crate) name: String,
    /// Where members listen (the head's address, port chosen by the system).
    listen_ip: IpAddr,
    /// Members stop with the head.
    cancel: CancellationToken,
    /// Members by node id.
    members: Mutex<BTreeMap<i32, Link>>,
    /// A fault put on a member before it existed, by name; it starts under it.
    early: Mutex<BTreeMap<String, FaultSpec>>,
    /// The fault in force on the whole family (the head's), which new members start under.
    group: Mutex<Option<FaultSpec>>,
    seed: AtomicU64,
    /// Answers that could not be read and passed unchanged.
    pub(crate) unreadable: AtomicU64,
    /// Answers rewritten.
    pub(crate) rewritten: AtomicU64,
    /// ApiVersions answers whose trailing tagged fields were dropped.
    pub(crate) trimmed: AtomicU64,
    /// The tap every member reads its connections with (the head's).
    tapping: Mutex<Option<super::tap::Tapping>>,
    terminate: Mutex<Option<Arc<super::terminate::Terminate>>>,
}

/// How a link takes part in a family.
#[derive(Clone)]
pub(crate) enum Role {
    Head(Arc<Family>),
    Member(Weak<Family>),
}

impl Role {
    pub(crate) fn family(&self) -> Option<Arc<Family>> {
        match self {
            Role::Head(f) => Some(f.clone()),
            Role::Member(w) => w.upgrade(),
        }
    }
}

impl Family {
    pub(crate) fn new(name: &str, listen_ip: IpAddr, cancel: CancellationToken) -> Family {
        Family {
            name: name.to_string(),
            listen_ip,
            cancel,
            members: Mutex::default(),
            early: Mutex::default(),
            group: Mutex::default(),
            seed: AtomicU64::new(0),
            unreadable: AtomicU64::new(0),
            rewritten: AtomicU64::new(0),
            trimmed: AtomicU64::new(0),
            tapping: Mutex::default(),
            terminate: Mutex::default(),
        }
    }

    /// The head's tap, on every member, those made later included.
    pub(crate) fn set_tap(&self, tapping: super::tap::Tapping) {
        for m in self.members() {
            m.set_tap(tapping.clone());
        }
        if let Ok(mut t) = self.tapping.lock() {
            *t = Some(tapping);
        }
    }

    /// The head's TLS termination, on every member, those made later included.
    pub(crate) fn set_terminate(&self, t: Arc<super::terminate::Terminate>) {
        for m in self.members() {
            m.terminate(t.clone());
        }
        if let Ok(mut slot) = self.terminate.lock() {
            *slot = Some(t);
        }
    }

    pub(crate) fn member_name(&self, node_id: i32) -> String {
        format!("{}-{node_id}", self.name)
    }

    pub(crate) fn members(&self) -> Vec<Link> {
        self.members
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn member(&self, name: &str) -> Option<Link> {
        self.members().into_iter().find(|l| l.name() == name)
    }

    /// The head's fault now in force on the whole family.
    pub(crate) fn set_group(&self, spec: Option<FaultSpec>) {
        if let Ok(mut g) = self.group.lock() {
            *g = spec;
        }
        if let Ok(mut e) = self.early.lock() {
            e.clear();
        }
        for m in self.members() {
            match spec {
                Some(s) => m.apply_spec(s),
                None => m.apply_spec(FaultSpec::new(super::Fault::Heal, super::Direction::Both)),
            };
        }
    }

    /// A fault for member `name` that does not exist yet: it starts under it.
    pub(crate) fn apply_early(&self, name: &str, spec: FaultSpec) {
        if let Ok(mut e) = self.early.lock() {
            if spec.fault == super::Fault::Heal {
                e.remove(name);
            } else if !spec.fault.instantaneous() {
                e.insert(name.to_string(), spec);
            }
        }
    }

    pub(crate) fn seed(&self, seed: u64) {
        self.seed.store(seed, Ordering::Relaxed);
        for m in self.members() {
            m.seed(seed);
        }
    }

    /// The link that stands for `broker`: its listen address (the member is created and
    /// pointed at the broker's address on first sight, and re-pointed if the broker moved).
    /// `None` when the address does not resolve or no port is free: the answer keeps it.
    pub(crate) fn stand_in(self: &Arc<Self>, broker: &BrokerAddress) -> Option<SocketAddr> {
        let port = u16::try_from(broker.port).ok()?;
        let upstream = (broker.host.as_str(), port)
            .to_socket_addrs()
            .ok()?
            .next()?;
        let mut members = self.members.lock().ok()?;
        if let Some(m) = members.get(&broker.node_id) {
            if m.upstream_addr() != upstream {
                m.set_upstream(upstream);
            }
            return Some(m.listen_addr());
        }
        let name = self.member_name(broker.node_id);
        let listener = super::listen_reusable(SocketAddr::new(self.listen_ip, 0)).ok()?;
        let link = Link::from_std(
            &name,
            listener,
            upstream,
            self.cancel.child_token(),
            Some(Role::Member(Arc::downgrade(self))),
        )
        .ok()?;
        link.seed(self.seed.load(Ordering::Relaxed));
        if let Some(t) = self.tapping.lock().ok().and_then(|t| t.clone()) {
            link.set_tap(t);
        }
        if let Some(t) = self.terminate.lock().ok().and_then(|t| t.clone()) {
            link.terminate(t);
        }
        let early = self.early.lock().ok().and_then(|mut e| e.remove(&name));
        let group = self.group.lock().ok().and_then(|g| *g);
        if let Some(spec) = early.or(group) {
            link.apply_spec(spec);
        }
        let addr = link.listen_addr();
        members.insert(broker.node_id, link);
        Some(addr)
    }

    /// Rewrites one answer so every broker it names is reached through its member link, or
    /// an ApiVersions answer so that older clients can read it.
    pub(crate) fn rewrite(
        self: &Arc<Self>,
        api_key: i16,
        version: i16,
        frame: &[u8],
    ) -> Option<Vec<u8>> {
        let done = if api_key == API_VERSIONS {
            trim_api_versions(version, frame).inspect(|new| {
                if new.is_some() {
                    self.trimmed.fetch_add(1, Ordering::Relaxed);
                }
            })
        } else {
            rewrite(api_key, version, frame, |b| {
                self.stand_in(b)
                    .map(|a| (a.ip().to_string(), i32::from(a.port())))
            })
            .map(|new| {
                self.rewritten.fetch_add(1, Ordering::Relaxed);
                Some(new)
            })
        };
        match done {
            Ok(new) => new,
            Err(e) => {
                if self.unreadable.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("drill: link {}: passed an answer unchanged: {e}", self.name);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::kafka::test_frames::metadata;
    use crate::wire::kafka::{METADATA, brokers};

    #[test]
    fn answers_pass_other_frames_untouched_and_rewrite_the_noted_one_across_reads() {
        let pending: Pending = Arc::default();
        let mut requests = Requests::default();
        // A produce request (api 0) then a metadata request v12, correlation 9, split oddly.
        let mut up = Vec::new();
        for (key, ver, corr) in [(0i16, 9i16, 8i32), (3, 12, 9)] {
            let body = [key.to_be_bytes(), ver.to_be_bytes()].concat();
            let mut frame = body.clone();
            frame.extend_from_slice(&corr.to_be_bytes());
            frame.extend_from_slice(b"payload");
            up.extend_from_slice(&(frame.len() as i32).to_be_bytes());
            up.extend_from_slice(&frame);
        }
        for chunk in up.chunks(5) {
            requests.observe(chunk, &pending);
        }
        assert_eq!(pending.lock().unwrap().get(&9), Some(&(3, 12)));
        assert!(!pending.lock().unwrap().contains_key(&8));

        let mut meta = metadata(12);
        meta[..4].copy_from_slice(&9i32.to_be_bytes());
        let produce_answer = [8i32.to_be_bytes().as_slice(), b"ok"].concat();
        let mut down = Vec::new();
        for f in [&produce_answer, &meta] {
            down.extend_from_slice(&(f.len() as i32).to_be_bytes());
            down.extend_from_slice(f);
        }
        let mut answers = Answers::default();
        let mut out = Vec::new();
        for chunk in down.chunks(3) {
            answers.feed(chunk, &pending, &mut out, |k, v, f| {
                rewrite(k, v, f, |_| Some(("h".into(), 1))).ok()
            });
        }
        let first = 4 + produce_answer.len();
        assert_eq!(&out[..first], &down[..first]);
        let size = i32::from_be_bytes(out[first..first + 4].try_into().unwrap()) as usize;
        assert_eq!(out.len(), first + 4 + size);
        let b = brokers(METADATA, 12, &out[first + 4..]).unwrap();
        assert!(b.iter().all(|b| b.host == "h" && b.port == 1));
        assert!(pending.lock().unwrap().is_empty());
    }
}
