//! TLS: a certificate authority minted for each drill ([`ca`]), and the client side that the
//! engine's outputs and drill's readers use to reach a broker that speaks TLS ([`client`],
//! [`Stream`]). One crypto provider (ring, as async-nats already uses); no system trust store:
//! a drill trusts exactly the CA it was given.

pub mod ca;
pub mod client;
pub mod impostor;
pub mod server;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub use ca::{DrillCa, TlsFiles};
pub use client::{ClientTls, TlsConfig};

/// A connection to a destination: plain TCP, or TLS over it.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    /// The TCP socket underneath (for socket options).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// TLS on a broker drill starts: the minted CA's files, and whether a client must show a
/// certificate from it (mutual TLS).
#[derive(Debug, Clone)]
pub struct BrokerTls {
    pub files: TlsFiles,
    pub client_certificates: bool,
}

impl BrokerTls {
    /// Mints the drill's CA into `dir`, with `names` on the broker's certificate.
    pub fn mint(
        dir: &std::path::Path,
        run_id: &str,
        names: &[String],
        client_certificates: bool,
    ) -> Result<BrokerTls, String> {
        let ca = DrillCa::mint(dir, &format!("drill {run_id}"), names)?;
        Ok(BrokerTls {
            files: ca.files,
            client_certificates,
        })
    }

    /// What a client of this broker trusts and shows: the CA, and the client certificate
    /// under mutual TLS.
    pub fn client(&self) -> TlsConfig {
        let f = &self.files;
        TlsConfig {
            cert_file: self.client_certificates.then(|| f.client_cert_file.clone()),
            key_file: self.client_certificates.then(|| f.client_key_file.clone()),
            ..TlsConfig::trusting(&f.ca_file)
        }
    }
}
