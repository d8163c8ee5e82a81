//! The tunnel's connection type: a TCP stream, plain or wrapped in TLS, that
//! tonic can serve and ask for its peer.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

use super::gateways::Peer;

/// An accepted tunnel connection.
#[derive(Debug)]
pub struct TunnelIo {
    inner: Inner,
    peer: SocketAddr,
    gateway: Peer,
}

#[derive(Debug)]
enum Inner {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// What tonic learns about a tunnel connection.
#[derive(Debug, Clone)]
pub struct ConnectInfo {
    /// The peer's address.
    pub peer: SocketAddr,
    /// The peer presented a (verified) client certificate.
    pub client_certificate: bool,
    /// Whether the peer is a gateway the tunnel serves.
    pub gateway: Peer,
}

impl TunnelIo {
    /// A plaintext connection.
    pub fn plain(tcp: TcpStream, peer: SocketAddr) -> Self {
        Self {
            inner: Inner::Plain(tcp),
            peer,
            gateway: Peer::Plaintext,
        }
    }

    /// A TLS connection whose peer was judged `gateway` when its
    /// handshake completed.
    pub fn tls(tls: TlsStream<TcpStream>, peer: SocketAddr, gateway: Peer) -> Self {
        Self {
            inner: Inner::Tls(Box::new(tls)),
            peer,
            gateway,
        }
    }
}

impl Connected for TunnelIo {
    type ConnectInfo = ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let client_certificate = match &self.inner {
            Inner::Plain(_) => false,
            Inner::Tls(tls) => tls.get_ref().1.peer_certificates().is_some(),
        };
        ConnectInfo {
            peer: self.peer,
            client_certificate,
            gateway: self.gateway.clone(),
        }
    }
}

impl AsyncRead for TunnelIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for TunnelIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_flush(cx),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Inner::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Inner::Plain(s) => s.is_write_vectored(),
            Inner::Tls(s) => s.is_write_vectored(),
        }
    }
}
