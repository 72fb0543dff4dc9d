//! Publishing one of the engine's loopback ports on the agent's address, for one drill: every
//! connection from the drill's address is joined to the engine's port; a connection from any
//! other address is closed at once. The engine itself keeps listening on loopback only.

use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Listens on `at` (port 0: any free one) on the `data` runtime and joins each connection from
/// `allow` to `to`, until `cancel`. Returns the address it listens on.
pub fn start(
    data: &tokio::runtime::Handle,
    at: SocketAddr,
    to: SocketAddr,
    allow: IpAddr,
    cancel: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let std_listener = std::net::TcpListener::bind(at)?;
    std_listener.set_nonblocking(true)?;
    let bound = std_listener.local_addr()?;
    data.spawn(async move {
        let Ok(listener) = TcpListener::from_std(std_listener) else {
            return;
        };
        loop {
            let accepted = tokio::select! {
                () = cancel.cancelled() => return,
                a = listener.accept() => a,
            };
            let Ok((mut from, peer)) = accepted else {
                // Out of descriptors, say: do not spin.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            if peer.ip().to_canonical() != allow.to_canonical() {
                continue;
            }
            let cancel = cancel.clone();
            tokio::spawn(async move {
                let Ok(mut engine) = TcpStream::connect(to).await else {
                    return;
                };
                let _ = from.set_nodelay(true);
                let _ = engine.set_nodelay(true);
                tokio::select! {
                    () = cancel.cancelled() => {}
                    _ = tokio::io::copy_bidirectional(&mut from, &mut engine) => {}
                }
            });
        }
    });
    Ok(bound)
}
