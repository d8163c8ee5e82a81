//! [`Prefixed`]: a socket with bytes already read from it put back in front,
//! so what followed a PROXY header (or the bytes read to find out there was
//! none) reaches the TLS handshake unchanged.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, with `prefix` read first.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    /// `inner` with `prefix` in front.
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Self { prefix, inner }
    }

    /// The socket.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if self.prefix.is_empty() {
                // An emptied `Bytes` still holds the buffer it was cut from
                // (the ClientHello's, grown to a few KiB while it was read)
                // for as long as the connection lives: 2.5 KiB per idle
                // agent connection, measured. Let it go.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn prefix_comes_first_then_the_socket() {
        let (a, mut b) = tokio::io::duplex(64);
        b.write_all(b" world").await.unwrap();
        drop(b);
        let mut p = Prefixed::new(Bytes::from_static(b"hello"), a);
        let mut out = String::new();
        p.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }

    /// Frees its buffer once the prefix has been read.
    #[tokio::test]
    async fn the_prefix_buffer_is_freed_once_read() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        struct Owner(Vec<u8>, Arc<AtomicBool>);
        impl AsRef<[u8]> for Owner {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Owner {
            fn drop(&mut self) {
                self.1.store(true, Ordering::SeqCst);
            }
        }
        let freed = Arc::new(AtomicBool::new(false));
        let prefix = Bytes::from_owner(Owner(b"hello".to_vec(), freed.clone()));
        let (a, mut b) = tokio::io::duplex(64);
        b.write_all(b" world").await.unwrap();
        let mut p = Prefixed::new(prefix, a);
        let mut out = [0u8; 5];
        p.read_exact(&mut out).await.unwrap();
        assert_eq!(&out, b"hello");
        assert!(
            freed.load(Ordering::SeqCst),
            "the emptied prefix still holds its buffer"
        );
        let mut rest = [0u8; 6];
        p.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b" world");
    }
}
