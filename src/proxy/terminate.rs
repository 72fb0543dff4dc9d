//! A link that terminates TLS (`destination.tls: { links: terminate }`): a TLS server to the
//! engine, with the certificate of the drill's CA, and a TLS client to the broker (or plain TCP
//! to a broker that serves no TLS, such as tansu). Between the two, the bytes are plaintext, so
//! a Kafka-aware link rewrites broker addresses and a protocol tap reads what crosses, as on a
//! plain link.
//!
//! It is built around the link's own machinery rather than into it: the engine's TLS session is
//! decrypted onto one end of a loopback socket pair, and the link serves the other end as any
//! accepted connection ([`connection::serve`]); toward the broker, the link dials a pair whose
//! far end is encrypted to the broker ([`dial`]). Every fault, condition, counter and tap of
//! the link works unchanged on the plaintext, and what happens on the pair is carried to the
//! real sockets: an end of stream as `close_notify` and FIN, a reset as a reset (RST with
//! SO_LINGER 0, no `close_notify`). A connection turned away at accept (refused, reset,
//! `bad_certificate`) is turned away before any handshake, as from the broker itself.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_util::sync::CancellationToken;

use super::LinkShared;
use super::connection::{self, Admission, rst};
use crate::tls::ClientTls;

/// How long a handshake may take, on either side.
const HANDSHAKE: Duration = Duration::from_secs(10);
const BUF: usize = 64 * 1024;

/// A terminating link's two TLS sides.
pub struct Terminate {
    /// What the link shows the engine: a certificate from the drill's CA.
    pub server: Arc<ServerConfig>,
    /// How the link reaches the broker: TLS, trusting the broker's CA (`None`: plain TCP, for
    /// a broker that serves no TLS).
    pub upstream: Option<ClientTls>,
}

impl Terminate {
    /// The two sides of a link that terminates TLS in front of a broker drill starts with
    /// `broker`'s certificates: to the engine, the broker's own certificate (under mutual TLS,
    /// asking for one from the same CA); to the broker, a client of its CA (showing the client
    /// certificate under mutual TLS) when it serves TLS (`served`), plain TCP when it does not.
    pub fn in_front_of(broker: &crate::tls::BrokerTls, served: bool) -> Result<Terminate, String> {
        Ok(Terminate {
            server: crate::tls::server::link_server(&broker.files, broker.client_certificates)?,
            upstream: if served {
                Some(ClientTls::new(&broker.client())?)
            } else {
                None
            },
        })
    }
}

impl std::fmt::Debug for Terminate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminate")
            .field("upstream_tls", &self.upstream.is_some())
            .finish_non_exhaustive()
    }
}

/// Serves one accepted engine connection on a terminating link.
pub(crate) async fn serve(
    shared: Arc<LinkShared>,
    client: TcpStream,
    abort: CancellationToken,
    terminate: Arc<Terminate>,
) {
    let _ = client.set_nodelay(true);
    match connection::admission(&shared) {
        Admission::Serve { .. } => {}
        away => return connection::turn_away(&shared, client, away).await,
    }
    let accept = TlsAcceptor::from(terminate.server.clone()).accept(client);
    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE, accept).await else {
        return;
    };
    let Ok((near, far)) = pair().await else {
        return;
    };
    // The link's side of the pair is served as any accepted connection; this task carries
    // the engine's TLS session to and from the other side.
    shared
        .tasks
        .spawn(connection::serve(shared.clone(), far, abort));
    carry(tls, near).await;
}

/// The link's connection to the broker: plain TCP, or on a terminating link to a TLS broker,
/// the near end of a pair whose far end is carried over TLS to the broker.
pub(crate) async fn dial(shared: &LinkShared) -> io::Result<TcpStream> {
    let upstream = shared.upstream();
    let tls = shared
        .terminate
        .read()
        .ok()
        .and_then(|t| t.as_ref().and_then(|t| t.upstream.clone()));
    let Some(tls) = tls else {
        return TcpStream::connect(upstream).await;
    };
    let tcp = TcpStream::connect(upstream).await?;
    let _ = tcp.set_nodelay(true);
    let stream = tokio::time::timeout(HANDSHAKE, tls.handshake(tcp, upstream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake with the broker"))??;
    let (near, far) = pair().await?;
    shared.tasks.spawn(carry(stream, far));
    Ok(near)
}

/// A TLS stream with the TCP socket under it reachable (to reset it).
pub(crate) trait OverTcp: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn tcp(&self) -> &TcpStream;
}

impl OverTcp for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

impl OverTcp for crate::tls::Stream {
    fn tcp(&self) -> &TcpStream {
        crate::tls::Stream::tcp(self)
    }
}

/// Two connected loopback sockets.
async fn pair() -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (near, far) = tokio::try_join!(TcpStream::connect(addr), async {
        listener.accept().await.map(|(s, _)| s)
    })?;
    let _ = near.set_nodelay(true);
    let _ = far.set_nodelay(true);
    Ok((near, far))
}

/// Carries bytes both ways between a TLS session and a plain socket until both directions
/// end. An end of stream is passed on as one (a TLS peer that closes without `close_notify`
/// counts as closing); a reset or any other failure on either side resets both.
async fn carry<S: OverTcp>(tls: S, plain: TcpStream) {
    let reset = CancellationToken::new();
    let (mut tls_read, mut tls_write) = tokio::io::split(tls);
    let (mut plain_read, mut plain_write) = plain.into_split();
    tokio::join!(
        one_way(&mut tls_read, &mut plain_write, &reset),
        one_way(&mut plain_read, &mut tls_write, &reset),
    );
    if reset.is_cancelled() {
        let tls = tls_read.unsplit(tls_write);
        rst(tls.tcp());
        if let Ok(plain) = plain_read.reunite(plain_write) {
            rst(&plain);
        }
    }
}

async fn one_way<R, W>(from: &mut R, to: &mut W, reset: &CancellationToken)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF];
    loop {
        let read = tokio::select! {
            r = from.read(&mut buf) => r,
            _ = reset.cancelled() => return,
        };
        let n = match read {
            Ok(0) => 0,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => 0,
            Err(_) => return reset.cancel(),
        };
        if n == 0 {
            let _ = to.shutdown().await;
            return;
        }
        let written = tokio::select! {
            w = async {
                to.write_all(&buf[..n]).await?;
                to.flush().await
            } => w,
            _ = reset.cancelled() => return,
        };
        if written.is_err() {
            return reset.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{Direction, Fault, Link};
    use crate::tls::{BrokerTls, ClientTls};
    use std::net::SocketAddr;

    /// An echo server (plain, as tansu serves no TLS).
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// Through a terminating link: the engine's bytes cross as plaintext (the link counts
    /// them), an echo comes back over TLS; a `reset` reaches the engine as a reset, not as a
    /// clean close; `refuse` refuses before any handshake; `bad_certificate` fails it.
    #[tokio::test]
    async fn a_terminating_link_carries_plaintext_and_passes_on_each_fault() {
        let dir = tempfile::tempdir().unwrap();
        let broker = BrokerTls::mint(dir.path(), "t", &[], false).unwrap();
        let link = Link::start(
            "t",
            "127.0.0.1:0".parse().unwrap(),
            echo().await,
            CancellationToken::new(),
        )
        .await
        .unwrap();
        link.terminate(Arc::new(Terminate {
            server: crate::tls::server::link_server(&broker.files, false).unwrap(),
            upstream: None,
        }));
        let client = ClientTls::new(&broker.client()).unwrap();
        let at = link.listen_addr();
        let mut tls = echoed(at, &client, b"hello over tls").await;
        // The link counted the plaintext both ways (a TLS record would be longer).
        let s = link.status();
        assert_eq!((s.bytes_upstream, s.bytes_downstream), (14, 14), "{s:?}");

        let epoch = link.apply(Fault::Reset, Direction::Both);
        assert!(link.settled(epoch, Duration::from_secs(5)).await);
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf))
            .await
            .expect("the reset reached the engine");
        let e = read.expect_err("a reset, not a clean end of stream");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");

        let epoch = link.apply(Fault::Refuse, Direction::Both);
        assert!(link.settled(epoch, Duration::from_secs(5)).await);
        let e = crate::tls::client::connect(at, Some(&client))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");

        let epoch = link.apply(Fault::BadCertificate, Direction::Both);
        assert!(link.settled(epoch, Duration::from_secs(5)).await);
        let e = crate::tls::client::connect(at, Some(&client))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("UnknownIssuer"), "{e}");

        let epoch = link.apply(Fault::Heal, Direction::Both);
        assert!(link.settled(epoch, Duration::from_secs(5)).await);
        echoed(at, &client, b"again").await;
        link.shutdown().await;
    }

    /// A TLS connection through the link at `at` that sent `what` and read it back.
    async fn echoed(at: SocketAddr, client: &ClientTls, what: &[u8]) -> crate::tls::Stream {
        let mut tls = crate::tls::client::connect(at, Some(client)).await.unwrap();
        tls.write_all(what).await.unwrap();
        tls.flush().await.unwrap();
        let mut got = vec![0u8; what.len()];
        tls.read_exact(&mut got).await.unwrap();
        assert_eq!(got, what);
        tls
    }
}
