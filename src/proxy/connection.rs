//! One proxied connection: two pumps (client → broker and broker → client) that follow the
//! link's condition byte by byte.
//!
//! The upstream socket is dialled lazily: a connection accepted while its upstream direction is
//! swallowed or hung has no far side yet (like a client behind a cut cable), and is dialled at
//! the heal. A reset is a real RST: SO_LINGER 0 on both sockets, and the write halves are
//! forgotten rather than shut down so no FIN goes out first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::{Condition, Flow, LinkShared, Side, add};

const BUF: usize = 64 * 1024;

/// State both pumps of a connection share.
struct Conn {
    /// Bytes were thrown away (or an end of stream hidden): the stream has a hole.
    lost: AtomicBool,
    /// Cancelled to reset the connection; each pump then RSTs the sockets it holds.
    abort: CancellationToken,
    counted_reset: AtomicBool,
}

impl Conn {
    fn reset(&self, shared: &LinkShared) {
        if !self.counted_reset.swap(true, Ordering::SeqCst) {
            add(&shared.counters.reset, 1);
        }
        self.abort.cancel();
    }
}

fn rst(socket: &TcpStream) {
    let _ = SockRef::from(socket).set_linger(Some(Duration::ZERO));
}

/// Serves one accepted client socket until both directions end or the connection is reset.
pub(crate) async fn serve(shared: Arc<LinkShared>, client: TcpStream, abort: CancellationToken) {
    let _ = client.set_nodelay(true);
    let conn = Arc::new(Conn {
        lost: AtomicBool::new(false),
        abort,
        counted_reset: AtomicBool::new(false),
    });
    // A fault in force at the instant of accept applies to this connection too.
    if shared.condition.borrow().flow(Side::Up) == Flow::Cut {
        rst(&client);
        add(&shared.counters.reset, 1);
        return;
    }
    add(&shared.counters.active, 1);
    let (client_read, client_write) = client.into_split();
    let (far_tx, far_rx) = oneshot::channel();
    let up = pump_up(shared.clone(), conn.clone(), client_read, far_tx);
    let down = pump_down(shared.clone(), conn.clone(), client_write, far_rx);
    tokio::join!(up, down);
    shared
        .counters
        .active
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
}

/// What a pump does after the condition changed.
enum Next {
    Continue,
    Reset,
}

fn after_change(conn: &Conn, condition: &Condition, side: Side) -> Next {
    if condition.flow(side) == Flow::Cut {
        return Next::Reset;
    }
    // DESIGN.md §3: after a swallow, a connection that lost bytes is reset at the heal.
    if conn.lost.load(Ordering::SeqCst) && !condition.swallows() {
        return Next::Reset;
    }
    Next::Continue
}

/// Client → broker. Owns the client's read half and the upstream write half, and dials.
async fn pump_up(
    shared: Arc<LinkShared>,
    conn: Arc<Conn>,
    mut from: OwnedReadHalf,
    far_tx: oneshot::Sender<OwnedReadHalf>,
) {
    let mut rx = shared.condition.subscribe();
    let mut to: Option<OwnedWriteHalf> = None;
    let mut far_tx = Some(far_tx);
    let mut at_eof = false;
    let mut buf = vec![0u8; BUF];
    let reset = |from: &OwnedReadHalf, to: Option<OwnedWriteHalf>| {
        conn.reset(&shared);
        rst(from.as_ref());
        if let Some(w) = to {
            rst(w.as_ref());
            w.forget();
        }
    };
    loop {
        let condition = rx.borrow_and_update().clone();
        if let Next::Reset = after_change(&conn, &condition, Side::Up) {
            reset(&from, to);
            return;
        }
        match condition.flow(Side::Up) {
            Flow::Cut => unreachable!("handled by after_change"),
            Flow::Hang => {
                tokio::select! {
                    _ = rx.changed() => {}
                    _ = conn.abort.cancelled() => { reset(&from, to); return; }
                }
            }
            Flow::Swallow if at_eof => {
                tokio::select! {
                    _ = rx.changed() => {}
                    _ = conn.abort.cancelled() => { reset(&from, to); return; }
                }
            }
            Flow::Swallow => {
                tokio::select! {
                    n = from.read(&mut buf) => match n {
                        Ok(0) => { at_eof = true; conn.lost.store(true, Ordering::SeqCst); }
                        Ok(n) => {
                            conn.lost.store(true, Ordering::SeqCst);
                            add(&shared.counters.swallowed_up, n as u64);
                        }
                        Err(_) => { reset(&from, to); return; }
                    },
                    _ = rx.changed() => {}
                    _ = conn.abort.cancelled() => { reset(&from, to); return; }
                }
            }
            Flow::Pass => {
                if to.is_none() {
                    let dial = tokio::select! {
                        d = TcpStream::connect(shared.upstream) => d,
                        _ = conn.abort.cancelled() => { reset(&from, to); return; }
                    };
                    match dial {
                        Ok(stream) => {
                            let _ = stream.set_nodelay(true);
                            let (r, w) = stream.into_split();
                            if let Some(tx) = far_tx.take() {
                                let _ = tx.send(r);
                            }
                            to = Some(w);
                        }
                        Err(_) => {
                            reset(&from, to);
                            return;
                        }
                    }
                    continue;
                }
                let Some(w) = to.as_mut() else { continue };
                let n = tokio::select! {
                    n = from.read(&mut buf) => n,
                    _ = rx.changed() => continue,
                    _ = conn.abort.cancelled() => { reset(&from, to); return; }
                };
                match n {
                    Ok(0) => {
                        let _ = w.shutdown().await;
                        return;
                    }
                    Ok(n) => match write_following(w, &buf[..n], &mut rx, &conn, Side::Up).await {
                        Ok(()) => add(&shared.counters.bytes_up, n as u64),
                        Err(()) => {
                            reset(&from, to);
                            return;
                        }
                    },
                    Err(_) => {
                        reset(&from, to);
                        return;
                    }
                }
            }
        }
    }
}

/// Broker → client. Owns the client's write half and (once dialled) the upstream read half.
async fn pump_down(
    shared: Arc<LinkShared>,
    conn: Arc<Conn>,
    mut to: OwnedWriteHalf,
    far_rx: oneshot::Receiver<OwnedReadHalf>,
) {
    let mut rx = shared.condition.subscribe();
    let mut from: Option<OwnedReadHalf> = None;
    let mut far_rx = Some(far_rx);
    let mut at_eof = false;
    let mut buf = vec![0u8; BUF];
    let reset = |to: OwnedWriteHalf, from: Option<OwnedReadHalf>| {
        conn.reset(&shared);
        rst(to.as_ref());
        if let Some(r) = from.as_ref() {
            rst(r.as_ref());
        }
        to.forget();
    };
    loop {
        let condition = rx.borrow_and_update().clone();
        if let Next::Reset = after_change(&conn, &condition, Side::Down) {
            reset(to, from);
            return;
        }
        if from.is_none() {
            let Some(pending) = far_rx.as_mut() else {
                return;
            };
            tokio::select! {
                far = pending => {
                    far_rx = None;
                    match far {
                        Ok(r) => from = Some(r),
                        // The client went away before a far side was ever needed.
                        Err(_) => { let _ = to.shutdown().await; return; }
                    }
                }
                _ = rx.changed() => {}
                _ = conn.abort.cancelled() => { reset(to, from); return; }
            }
            continue;
        }
        let Some(r) = from.as_mut() else { continue };
        match condition.flow(Side::Down) {
            Flow::Cut => unreachable!("handled by after_change"),
            Flow::Hang => {
                tokio::select! {
                    _ = rx.changed() => {}
                    _ = conn.abort.cancelled() => { reset(to, from); return; }
                }
            }
            Flow::Swallow if at_eof => {
                tokio::select! {
                    _ = rx.changed() => {}
                    _ = conn.abort.cancelled() => { reset(to, from); return; }
                }
            }
            Flow::Swallow => {
                tokio::select! {
                    n = r.read(&mut buf) => match n {
                        Ok(0) => { at_eof = true; conn.lost.store(true, Ordering::SeqCst); }
                        Ok(n) => {
                            conn.lost.store(true, Ordering::SeqCst);
                            add(&shared.counters.swallowed_down, n as u64);
                        }
                        Err(_) => { reset(to, from); return; }
                    },
                    _ = rx.changed() => {}
                    _ = conn.abort.cancelled() => { reset(to, from); return; }
                }
            }
            Flow::Pass => {
                let n = tokio::select! {
                    n = r.read(&mut buf) => n,
                    _ = rx.changed() => continue,
                    _ = conn.abort.cancelled() => { reset(to, from); return; }
                };
                match n {
                    Ok(0) => {
                        let _ = to.shutdown().await;
                        return;
                    }
                    Ok(n) => {
                        match write_following(&mut to, &buf[..n], &mut rx, &conn, Side::Down).await
                        {
                            Ok(()) => add(&shared.counters.bytes_down, n as u64),
                            Err(()) => {
                                reset(to, from);
                                return;
                            }
                        }
                    }
                    Err(_) => {
                        reset(to, from);
                        return;
                    }
                }
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
                if changed.is_err() || rx.borrow().flow(side) == Flow::Cut {
                    return Err(());
                }
            }
            _ = conn.abort.cancelled() => return Err(()),
        }
    }
}
