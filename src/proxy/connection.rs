//! One proxied connection: two pumps (client → broker and broker → client) that follow the
//! link's condition chunk by chunk.
//!
//! The upstream socket is dialled lazily: a connection accepted while its upstream direction is
//! swallowed or hung has no far side yet (like a client behind a cut cable), and is dialled at
//! the heal. A reset is a real RST: SO_LINGER 0 on both sockets, and the write halves are
//! forgotten rather than shut down so no FIN goes out first.
//!
//! Bytes a pump has read but not yet written are *held*, in order, with the instant they are
//! due: `delay` holds them `latency ± jitter` (never reordered), `throttle` spaces them to the
//! cap, `hang` keeps them until the heal, `swallow` throws them away with everything after. A
//! held queue is bounded, so a delayed or throttled sender feels back-pressure like on a real
//! slow link.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::kafka::{self, Family, Pending};
use super::splice::Pipe;
use super::tap::ConnTap;
use super::{Condition, Flow, LinkShared, Shape, Side, add};

/// Read buffers start small and double while reads keep filling them, up to `BUF`: a bulk
/// stream gets few syscalls per byte, and 1,000 idle or stalled connections stay cheap.
const BUF: usize = 256 * 1024;
const FIRST_BUF: usize = 16 * 1024;
/// A read at least this large means bulk: the next ones go zero-copy (a pipe's two `splice`
/// calls cost a small message more than a read and a write; a bulk stream, much less).
const BULK: usize = 32 * 1024;
/// What a delayed direction may hold before it stops reading (back-pressure).
const HOLD_LIMIT: usize = 8 * 1024 * 1024;

/// State both pumps of a connection share.
struct Conn {
    /// Bytes were thrown away (or an end of stream hidden): the stream has a hole.
    lost: AtomicBool,
    /// Cancelled to reset the connection; each pump then RSTs the sockets it holds.
    abort: CancellationToken,
    counted_reset: AtomicBool,
    /// The link's `strand` count when the connection was accepted: a later strand silences it.
    born: u64,
    counted_strand: AtomicBool,
    /// The link's protocol tap, when it has one: reads what this connection carries.
    tap: Option<ConnTap>,
    /// Which connection of the link this is (a condition's toxicity is drawn per connection).
    serial: u64,
}

pub(crate) fn rst(socket: &TcpStream) {
    let _ = SockRef::from(socket).set_linger(Some(Duration::ZERO));
}

/// What a link does with a connection it just accepted, by the condition in force at that
/// instant (a fault in force at accept applies to this connection too).
pub(crate) enum Admission {
    /// `bad_certificate`: the link stands in for the broker's TLS server with the wrong
    /// certificate (`expired`: the broker's own, expired).
    Impostor { expired: bool },
    /// The link is cut toward the broker: the connection is reset at once.
    Cut,
    /// Served, and silenced by any `strand` after this count.
    Serve { born: u64 },
}

pub(crate) fn admission(shared: &LinkShared) -> Admission {
    let condition = shared.condition.borrow();
    if let Some(a) = condition
        .active
        .filter(|a| a.fault == super::Fault::BadCertificate)
    {
        Admission::Impostor { expired: a.expired }
    } else if condition.flow(Side::Up, 0) == Flow::Cut {
        Admission::Cut
    } else {
        Admission::Serve {
            born: condition.strands,
        }
    }
}

/// Turns `client` away as `admission` said: an impostor's handshake, or a reset (counted).
pub(crate) async fn turn_away(shared: &LinkShared, client: TcpStream, admission: Admission) {
    match admission {
        Admission::Impostor { expired } => {
            let config = if expired {
                shared.expired.read().ok().and_then(|e| e.clone())
            } else {
                None
            };
            crate::tls::impostor::present(client, config).await;
        }
        _ => {
            rst(&client);
            add(&shared.counters.reset, 1);
        }
    }
}

/// Serves one accepted client socket until both directions end or the connection is reset.
pub(crate) async fn serve(shared: Arc<LinkShared>, client: TcpStream, abort: CancellationToken) {
    let _ = client.set_nodelay(true);
    let born = match admission(&shared) {
        Admission::Serve { born } => born,
        away => return turn_away(&shared, client, away).await,
    };
    let tap = shared
        .tapping
        .read()
        .ok()
        .and_then(|t| t.as_ref().map(ConnTap::new));
    let conn = Arc::new(Conn {
        lost: AtomicBool::new(false),
        abort,
        counted_reset: AtomicBool::new(false),
        born,
        counted_strand: AtomicBool::new(false),
        tap,
        serial: shared.counters.served.fetch_add(1, Ordering::Relaxed),
    });
    add(&shared.counters.active, 1);
    let (client_read, client_write) = client.into_split();
    let (far_tx, far_rx) = oneshot::channel();
    let mut up = Pump::new(
        &shared,
        &conn,
        Side::Up,
        Some(client_read),
        None,
        Far::Dial(Some(far_tx)),
    );
    let mut down = Pump::new(
        &shared,
        &conn,
        Side::Down,
        None,
        Some(client_write),
        Far::Await(Some(far_rx)),
    );
    if let Some(family) = shared.kafka.as_ref().and_then(kafka::Role::family) {
        let pending = Pending::default();
        up.kafka = Some(Kafka::Requests(kafka::Requests::default(), pending.clone()));
        down.kafka = Some(Kafka::Answers(kafka::Answers::default(), pending, family));
    }
    tokio::join!(up.run(), down.run());
    shared.counters.active.fetch_sub(1, Ordering::Relaxed);
}

/// What a Kafka-aware link's pump does with the bytes it passes: the client → broker side notes
/// the requests whose answers carry broker addresses, the broker → client side rewrites those.
enum Kafka {
    Requests(kafka::Requests, Pending),
    Answers(kafka::Answers, Pending, Arc<Family>),
}

/// How a pump gets its far end: the client → broker pump dials the broker and hands the read
/// half of that socket to the broker → client pump.
enum Far {
    Dial(Option<oneshot::Sender<OwnedReadHalf>>),
    Await(Option<oneshot::Receiver<OwnedReadHalf>>),
}

struct Pump {
    shared: Arc<LinkShared>,
    conn: Arc<Conn>,
    side: Side,
    rx: watch::Receiver<Condition>,
    from: Option<OwnedReadHalf>,
    to: Option<OwnedWriteHalf>,
    far: Far,
    held: VecDeque<(Instant, Bytes)>,
    held_bytes: usize,
    /// The latest due instant handed out: chunks never overtake each other.
    last_due: Instant,
    at_eof: bool,
    /// `limit_data`: (the budgets' epoch, bytes passed under them).
    limited: (u64, u64),
    /// A Kafka-aware link's view of the protocol (`None`: bytes only).
    kafka: Option<Kafka>,
    /// Where a Kafka-aware link's answers are assembled (kept, so no read allocates).
    scratch: Vec<u8>,
    /// The zero-copy path while the direction passes untouched (`None`: not made yet);
    /// `splicing` false once it cannot serve (no pipe), for good.
    pipe: Option<Pipe>,
    splicing: bool,
    /// The last read was bulk ([`BULK`]): splice the next one.
    bulk: bool,
}

/// Why a pump stopped waiting.
enum Woke {
    Changed,
    Abort,
}

impl Pump {
    fn new(
        shared: &Arc<LinkShared>,
        conn: &Arc<Conn>,
        side: Side,
        from: Option<OwnedReadHalf>,
        to: Option<OwnedWriteHalf>,
        far: Far,
    ) -> Pump {
        Pump {
            shared: shared.clone(),
            conn: conn.clone(),
            side,
            rx: shared.condition.subscribe(),
            from,
            to,
            far,
            held: VecDeque::new(),
            held_bytes: 0,
            last_due: Instant::now(),
            at_eof: false,
            limited: (0, 0),
            kafka: None,
            scratch: Vec::new(),
            pipe: None,
            splicing: super::zero_copy_on(),
            bulk: false,
        }
    }

    /// The bytes to pass on for `bytes` read: the same, except a Kafka-aware link's answers
    /// with broker addresses (held until whole, then rewritten).
    fn translate<'b>(&mut self, bytes: &'b [u8]) -> std::borrow::Cow<'b, [u8]> {
        use std::borrow::Cow;
        match &mut self.kafka {
            None => Cow::Borrowed(bytes),
            Some(Kafka::Requests(requests, pending)) => {
                requests.observe(bytes, pending);
                Cow::Borrowed(bytes)
            }
            Some(Kafka::Answers(answers, pending, family)) => {
                if answers.passes(bytes.len()) {
                    return Cow::Borrowed(bytes);
                }
                let mut out = std::mem::take(&mut self.scratch);
                out.clear();
                answers.feed(bytes, pending, &mut out, |key, version, frame| {
                    family.rewrite(key, version, frame)
                });
                Cow::Owned(out)
            }
        }
    }

    /// This pump read `bytes`: the tap reads them — from the engine (they left it, whether
    /// or not the link passes them on) or from the broker (it answered, whether or not the
    /// answer reaches the engine).
    fn tap_read(&self, bytes: &[u8]) {
        match (self.side, &self.conn.tap) {
            (Side::Up, Some(tap)) => tap.left(bytes),
            (Side::Down, Some(tap)) => tap.down(bytes),
            (_, None) => {}
        }
    }

    /// This pump read the end of its stream: from the engine, the connection is over for it.
    fn tap_ended(&self) {
        if let (Side::Up, Some(tap)) = (self.side, &self.conn.tap) {
            tap.ended();
        }
    }

    /// Resets the whole connection: RST on every socket this pump holds.
    fn reset(&mut self) {
        if !self.conn.counted_reset.swap(true, Ordering::SeqCst) {
            add(&self.shared.counters.reset, 1);
        }
        self.conn.abort.cancel();
        if let Some(r) = self.from.as_ref() {
            rst(r.as_ref());
        }
        if let Some(w) = self.to.take() {
            rst(w.as_ref());
            w.forget();
        }
    }

    /// At the heal of a swallow, before the reset: what the peer wrote while the swallow was
    /// in force and still waits in this socket's receive buffer (the pump woke for the heal
    /// instead of reading it) is swallowed too — and read by the tap, because it did leave the
    /// peer: a sender's write the operating system took is sent, not kept (CI once called two
    /// such syslog records "lost before sending").
    fn drain_received(&mut self, buf: &mut [u8]) {
        while !self.at_eof {
            let Some(from) = self.from.as_ref() else {
                return;
            };
            match from.try_read(buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    self.tap_read(&buf[..n]);
                    self.lose(n);
                }
            }
        }
    }

    fn counted(&self, forwarded: bool, n: usize) {
        let c = &self.shared.counters;
        let counter = match (self.side, forwarded) {
            (Side::Up, true) => &c.bytes_up,
            (Side::Down, true) => &c.bytes_down,
            (Side::Up, false) => &c.swallowed_up,
            (Side::Down, false) => &c.swallowed_down,
        };
        add(counter, n as u64);
    }

    fn lose(&mut self, n: usize) {
        self.conn.lost.store(true, Ordering::SeqCst);
        self.counted(false, n);
    }

    async fn wait(&mut self) -> Woke {
        tokio::select! {
            _ = self.rx.changed() => Woke::Changed,
            _ = self.conn.abort.cancelled() => Woke::Abort,
        }
    }

    async fn run(mut self) {
        let mut buf = vec![0u8; FIRST_BUF];
        loop {
            // Read under the borrow, not cloned: the condition holds a list (stacked
            // conditions) and this runs for every chunk.
            let (stranded, flow, swallows, budget_epoch) = {
                let c = self.rx.borrow_and_update();
                (
                    c.strands > self.conn.born,
                    c.flow(self.side, self.conn.serial),
                    c.swallows(),
                    c.budget_epoch,
                )
            };
            if stranded {
                return self.strand(&mut buf).await;
            }
            // docs/src/design.md#3-fault-vocabulary: after a swallow, a connection that lost
            // bytes is reset at the heal.
            let healed_with_hole = self.conn.lost.load(Ordering::SeqCst) && !swallows;
            if healed_with_hole {
                self.drain_received(&mut buf);
            }
            if flow == Flow::Cut || healed_with_hole || self.conn.abort.is_cancelled() {
                return self.reset();
            }
            // The broker → client pump first needs the far side's read half.
            if let Far::Await(pending) = &mut self.far
                && self.from.is_none()
            {
                let Some(receiver) = pending.as_mut() else {
                    return;
                };
                tokio::select! {
                    far = receiver => match far {
                        Ok(r) => { self.from = Some(r); pending.take(); }
                        // The client left before a far side was ever needed.
                        Err(_) => {
                            if let Some(w) = self.to.as_mut() { let _ = w.shutdown().await; }
                            return;
                        }
                    },
                    _ = self.rx.changed() => {}
                    _ = self.conn.abort.cancelled() => return self.reset(),
                }
                continue;
            }
            match flow {
                Flow::Cut => return self.reset(),
                Flow::Hang => {
                    // Held bytes stay held: the peer is frozen.
                    if let Woke::Abort = self.wait().await {
                        return self.reset();
                    }
                }
                Flow::Swallow => {
                    // Bytes in flight when the link went dark are lost with it.
                    if self.held_bytes > 0 {
                        let n = self.held_bytes;
                        self.held.clear();
                        self.held_bytes = 0;
                        self.lose(n);
                    }
                    let Some(from) = self.from.as_mut().filter(|_| !self.at_eof) else {
                        if let Woke::Abort = self.wait().await {
                            return self.reset();
                        }
                        continue;
                    };
                    tokio::select! {
                        n = from.read(&mut buf) => match n {
                            Ok(0) => { self.at_eof = true; self.tap_ended(); self.lose(0); }
                            Ok(n) => { self.tap_read(&buf[..n]); self.lose(n) }
                            Err(_) => return self.reset(),
                        },
                        _ = self.rx.changed() => {}
                        _ = self.conn.abort.cancelled() => return self.reset(),
                    }
                }
                Flow::Pass | Flow::Shaped(_) => {
                    if self.limited.0 != budget_epoch {
                        self.limited = (budget_epoch, 0);
                    }
                    if self.to.is_none() {
                        match self.dial().await {
                            Ok(()) => continue,
                            Err(()) => return self.reset(),
                        }
                    }
                    let done = if flow == Flow::Pass && self.can_splice() {
                        !self.splice_step().await
                    } else {
                        !self.forward(flow, &mut buf).await
                    };
                    if done {
                        return;
                    }
                }
            }
        }
    }

    /// A stranded connection (`strand`, docs/src/design.md#3-fault-vocabulary): from now on
    /// this direction reads and drops every byte, and nothing is ever written, shut down or
    /// reset — the far side hears nothing, as when a NAT entry is lost. The pump ends only
    /// when its own side closes (or the link shuts down); its write half is forgotten, so no
    /// FIN leaves on our initiative.
    async fn strand(mut self, buf: &mut [u8]) {
        if !self.conn.counted_strand.swap(true, Ordering::SeqCst) {
            add(&self.shared.counters.stranded, 1);
        }
        if self.held_bytes > 0 {
            let n = self.held_bytes;
            self.held.clear();
            self.held_bytes = 0;
            self.counted(false, n);
        }
        loop {
            let Some(from) = self.from.as_mut().filter(|_| !self.at_eof) else {
                // The broker → client pump may still wait for a far side that will never be
                // dialled now; it ends when the client → broker pump does.
                if let Far::Await(Some(pending)) = &mut self.far {
                    tokio::select! {
                        _ = pending => {}
                        _ = self.conn.abort.cancelled() => return self.reset(),
                    }
                }
                break;
            };
            tokio::select! {
                n = from.read(buf) => match n {
                    // The engine closed its side: its attempts on this connection are over,
                    // though the stranded connection's other side may never close.
                    Ok(0) | Err(_) => { self.tap_ended(); break }
                    Ok(n) => { self.tap_read(&buf[..n]); self.counted(false, n) }
                },
                _ = self.conn.abort.cancelled() => return self.reset(),
            }
        }
        if let Some(w) = self.to.take() {
            w.forget();
        }
    }

    /// Whether this direction may take the zero-copy path now: it carries bulk, passes
    /// untouched, nothing is held, nobody reads the bytes (no Kafka rewrite, no protocol tap),
    /// and both ends are there.
    fn can_splice(&self) -> bool {
        self.splicing
            && self.bulk
            && self.kafka.is_none()
            && self.conn.tap.is_none()
            && self.held.is_empty()
            && !self.at_eof
            && self.from.is_some()
            && self.to.is_some()
    }

    /// One step of the zero-copy path: what the socket received goes into the pipe, and from
    /// the pipe to the other socket. Returns to the loop (true) at the end of the stream or
    /// when the condition changes — with whatever the pipe still held moved, in order, into
    /// `held` for the copying path — and false when this direction is over.
    async fn splice_step(&mut self) -> bool {
        let pipe = match self.pipe.take() {
            Some(p) => Some(p),
            None => Pipe::new(),
        };
        let Some(mut pipe) = pipe else {
            self.splicing = false;
            return true;
        };
        let (Some(from), Some(to)) = (self.from.as_ref(), self.to.as_ref()) else {
            self.pipe = Some(pipe);
            return true;
        };
        let spliced = splice_once(
            &mut pipe,
            from.as_ref(),
            to.as_ref(),
            &mut self.rx,
            &self.conn.abort,
        )
        .await;
        self.counted(true, spliced.moved);
        add(&self.shared.counters.spliced, spliced.moved as u64);
        self.bulk = spliced.moved >= BULK;
        let alive = match spliced.end {
            SpliceEnd::Through => true,
            SpliceEnd::Eof => {
                self.at_eof = true;
                true
            }
            // The condition changed with bytes in the pipe: they go first through the copying
            // path, which follows the new condition.
            SpliceEnd::Changed => match pipe.take() {
                Ok(bytes) => {
                    if !bytes.is_empty() {
                        self.held_bytes += bytes.len();
                        self.held.push_back((Instant::now(), bytes));
                    }
                    true
                }
                Err(_) => false,
            },
            SpliceEnd::Failed => false,
        };
        self.pipe = Some(pipe);
        if !alive {
            self.reset();
        }
        alive
    }

    /// Dials the broker for the client → broker pump and hands the read half over.
    async fn dial(&mut self) -> Result<(), ()> {
        let Far::Dial(sender) = &mut self.far else {
            return Err(());
        };
        let stream = tokio::select! {
            s = super::terminate::dial(&self.shared) => s.map_err(|_| ())?,
            _ = self.conn.abort.cancelled() => return Err(()),
        };
        let _ = stream.set_nodelay(true);
        let (r, w) = stream.into_split();
        if let Some(tx) = sender.take() {
            let _ = tx.send(r);
        }
        self.to = Some(w);
        Ok(())
    }

    /// One step of forwarding, passed or shaped. Returns false when this direction is
    /// finished (or the connection was reset).
    async fn forward(&mut self, flow: Flow, buf: &mut Vec<u8>) -> bool {
        let shape = match flow {
            Flow::Shaped(shape) => shape,
            _ => Shape::default(),
        };
        // A byte budget spent: what it let through leaves first, then the connection is reset.
        let spent = shape.limit > 0 && self.limited.1 >= shape.limit;
        if spent && self.held.is_empty() {
            self.reset();
            return false;
        }
        // Write the oldest held chunk if it is due (when nothing holds, everything held is due).
        if let Some((due, _)) = self.held.front() {
            if !shape.holds() || *due <= Instant::now() {
                let Some((_, bytes)) = self.held.pop_front() else {
                    return true;
                };
                self.held_bytes -= bytes.len();
                return self.write(&bytes).await;
            }
        } else if self.at_eof {
            // `slow_close`: the end of the stream is passed on late.
            if !shape.close_delay.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(shape.close_delay) => {}
                    _ = self.conn.abort.cancelled() => {
                        self.reset();
                        return false;
                    }
                }
            }
            if let Some(w) = self.to.as_mut() {
                let _ = w.shutdown().await;
            }
            return false;
        }
        let size = buf.len();
        let (mut chunk, hold_limit) = if shape.bytes_per_s > 0 {
            // A rate holds about one chunk ahead; a delay beside it, what the rate passes in
            // the delay too (the bytes on the slow wire), or the delay would halve the rate.
            let chunk = ((shape.bytes_per_s / 50) as usize).clamp(512, size);
            let in_flight = shape.bytes_per_s as f64 * (shape.latency + shape.jitter).as_secs_f64();
            (chunk, chunk + (in_flight as usize).min(HOLD_LIMIT))
        } else if shape.holds() {
            (size, HOLD_LIMIT)
        } else {
            (size, 0)
        };
        if shape.limit > 0 {
            chunk = chunk.min((shape.limit.saturating_sub(self.limited.1) as usize).max(1));
        }
        let can_read =
            !spent && !self.at_eof && self.held_bytes <= hold_limit && self.from.is_some();
        let wake = self
            .held
            .front()
            .map(|(due, _)| tokio::time::Instant::from_std(*due));
        let read = async {
            match self.from.as_mut() {
                Some(r) if can_read => r.read(&mut buf[..chunk]).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            n = read => match n {
                Ok(0) => {
                    self.at_eof = true;
                    self.tap_ended();
                }
                Ok(n) => {
                    let data = self.translate(&buf[..n]);
                    let alive = self.pass_on(shape, &data).await;
                    if let std::borrow::Cow::Owned(used) = data {
                        self.scratch = used;
                    }
                    // The tap reads after the write: it never delays the bytes.
                    self.tap_read(&buf[..n]);
                    if !alive {
                        return false;
                    }
                    if n == size && size < BUF {
                        buf.resize(size * 2, 0);
                    }
                    self.bulk = n >= BULK;
                }
                Err(_) => {
                    self.reset();
                    return false;
                }
            },
            _ = async { if let Some(w) = wake { tokio::time::sleep_until(w).await } }, if wake.is_some() => {}
            _ = self.rx.changed() => {}
            _ = self.conn.abort.cancelled() => {}
        }
        true
    }

    /// Passes on a chunk just read, as `shape` says: written now, queued until due, and cut
    /// at a byte budget. False when the connection is over.
    async fn pass_on(&mut self, shape: Shape, bytes: &[u8]) -> bool {
        let bytes = if shape.limit > 0 {
            let allowed = (shape.limit.saturating_sub(self.limited.1) as usize).min(bytes.len());
            self.limited.1 += allowed as u64;
            &bytes[..allowed]
        } else {
            bytes
        };
        if bytes.is_empty() {
            // A Kafka answer being held until whole, or nothing left of the budget.
        } else if !shape.holds() && self.held.is_empty() {
            // The fast path: straight from the read buffer, nothing queued.
            if !self.write(bytes).await {
                return false;
            }
        } else {
            // Each piece of a `slicer` is held, and written, on its own.
            let mut rest = bytes;
            while !rest.is_empty() {
                let n = if shape.slices() {
                    self.piece(shape).min(rest.len())
                } else {
                    rest.len()
                };
                let due = self.due(shape, n);
                self.held
                    .push_back((due, Bytes::copy_from_slice(&rest[..n])));
                self.held_bytes += n;
                rest = &rest[n..];
            }
        }
        if shape.limit > 0 && self.limited.1 >= shape.limit && self.held.is_empty() {
            self.reset();
            return false;
        }
        true
    }

    /// When a chunk of `n` bytes read now may be written: `latency ± jitter` from now (seeded),
    /// never before the chunk ahead of it, and after that chunk's share of the rate.
    fn due(&mut self, shape: Shape, n: usize) -> Instant {
        let now = Instant::now();
        let j = shape.jitter.as_micros() as u64;
        let offset = if j == 0 {
            0i64
        } else {
            let draw = self
                .shared
                .rng
                .lock()
                .map(|mut r| r.below(2 * j + 1))
                .unwrap_or(j);
            draw as i64 - j as i64
        };
        let base = now + shape.latency;
        let late = if offset >= 0 {
            base + Duration::from_micros(offset as u64)
        } else {
            base.checked_sub(Duration::from_micros(offset.unsigned_abs()))
                .unwrap_or(now)
                .max(now)
        };
        let at = late.max(self.last_due);
        self.last_due = if shape.bytes_per_s > 0 {
            at + Duration::from_secs_f64(n as f64 / shape.bytes_per_s as f64)
        } else {
            at
        };
        if shape.slices() {
            self.last_due += shape.slice.2;
        }
        at
    }

    /// The size of a `slicer`'s next piece: the average ± a seeded draw of the variation,
    /// never below one byte.
    fn piece(&mut self, shape: Shape) -> usize {
        let (average, variation, _) = shape.slice;
        let v = variation.min(average.saturating_sub(1));
        let draw = if v == 0 {
            0
        } else {
            self.shared
                .rng
                .lock()
                .map(|mut r| r.below(2 * v + 1))
                .unwrap_or(v)
        };
        (average + draw).saturating_sub(v).max(1) as usize
    }

    async fn write(&mut self, bytes: &[u8]) -> bool {
        let Some(to) = self.to.as_mut() else {
            return false;
        };
        match write_following(to, bytes, &mut self.rx, &self.conn, self.side).await {
            Ok(()) => {
                self.counted(true, bytes.len());
                match (self.side, &self.conn.tap) {
                    (Side::Up, Some(tap)) => tap.up(bytes),
                    (Side::Down, Some(tap)) => tap.delivered(bytes),
                    (_, None) => {}
                }
                true
            }
            // A strand while the write was blocked: the loop goes silent instead of resetting.
            Err(()) if self.rx.borrow().strands > self.conn.born => true,
            Err(()) => {
                self.reset();
                false
            }
        }
    }
}

/// Writes bytes that were read while the direction passed. A write may block (the receiver is
/// slow); meanwhile a `reset`/`refuse` must still cut the connection, so watch the condition.
async fn write_following(
    to: &mut OwnedWriteHalf,
    bytes: &[u8],
    rx: &mut watch::Receiver<Condition>,
    conn: &Conn,
    side: Side,
) -> Result<(), ()> {
    let write = to.write_all(bytes);
    tokio::pin!(write);
    loop {
        tokio::select! {
            done = &mut write => return done.map_err(|_| ()),
            changed = rx.changed() => {
                let now = rx.borrow();
                if changed.is_err() || now.flow(side, conn.serial) == Flow::Cut || now.strands > conn.born {
                    return Err(());
                }
            }
            _ = conn.abort.cancelled() => return Err(()),
        }
    }
}

/// How one zero-copy step ended, and how many bytes it moved through.
struct Spliced {
    moved: usize,
    end: SpliceEnd,
}

enum SpliceEnd {
    /// Everything read went through.
    Through,
    /// The sender ended its stream (nothing was read).
    Eof,
    /// The condition changed (or the connection is to be reset): the pipe may still hold bytes.
    Changed,
    /// A socket failed: the connection is reset.
    Failed,
}

/// Reads what `from` has into `pipe` (waiting for it, unless the condition changes first) and
/// splices all of it out to `to`.
async fn splice_once(
    pipe: &mut Pipe,
    from: &TcpStream,
    to: &TcpStream,
    rx: &mut watch::Receiver<Condition>,
    abort: &CancellationToken,
) -> Spliced {
    let end = |moved, end| Spliced { moved, end };
    let filled = loop {
        match pipe.fill(from) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return end(0, SpliceEnd::Failed),
        }
        tokio::select! {
            ready = from.readable() => if ready.is_err() {
                return end(0, SpliceEnd::Failed);
            },
            _ = rx.changed() => return end(0, SpliceEnd::Changed),
            _ = abort.cancelled() => return end(0, SpliceEnd::Changed),
        }
    };
    if filled == 0 {
        return end(0, SpliceEnd::Eof);
    }
    let mut moved = 0;
    while pipe.held > 0 {
        match pipe.drain(to) {
            Ok(n) => {
                moved += n;
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return end(moved, SpliceEnd::Failed),
        }
        tokio::select! {
            ready = to.writable() => if ready.is_err() {
                return end(moved, SpliceEnd::Failed);
            },
            _ = rx.changed() => return end(moved, SpliceEnd::Changed),
            _ = abort.cancelled() => return end(moved, SpliceEnd::Changed),
        }
    }
    end(moved, SpliceEnd::Through)
}
