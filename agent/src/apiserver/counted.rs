//! Counting the API server's TCP connections where they are made: a connector
//! whose connections carry a guard that counts them open until dropped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use prometheus_client::metrics::gauge::Gauge;

/// Wraps a TCP connector so every connection it makes is counted in
/// `account` (the account's metric) and `slot` (its pool slot's own count)
/// for as long as it is open.
#[derive(Debug, Clone)]
pub struct Counting<C> {
    inner: C,
    account: Gauge,
    slot: Gauge,
}

impl<C> Counting<C> {
    /// Counts the connections `inner` makes in both gauges.
    pub fn new(inner: C, account: Gauge, slot: Gauge) -> Self {
        Self {
            inner,
            account,
            slot,
        }
    }
}

impl<C> tower::Service<http::Uri> for Counting<C>
where
    C: tower::Service<http::Uri>,
    C::Future: Send + 'static,
{
    type Response = Counted<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let gauges = [self.account.clone(), self.slot.clone()];
        Box::pin(async move {
            let io = connecting.await?;
            Ok(Counted {
                io,
                _open: Open::new(gauges),
            })
        })
    }
}

/// Counted open from creation to drop.
#[derive(Debug)]
struct Open([Gauge; 2]);

impl Open {
    fn new(gauges: [Gauge; 2]) -> Self {
        for gauge in &gauges {
            gauge.inc();
        }
        Self(gauges)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        for gauge in &self.0 {
            gauge.dec();
        }
    }
}

/// A connection that counts as open until it is dropped.
#[derive(Debug)]
pub struct Counted<T> {
    io: T,
    _open: Open,
}

impl<T: Read + Unpin> Read for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

impl<T: Connection> Connection for Counted<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt as _;

    #[tokio::test]
    async fn a_connection_counts_until_dropped() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (account, slot) = (Gauge::default(), Gauge::default());
        let connector = Counting::new(
            hyper_util::client::legacy::connect::HttpConnector::new(),
            account.clone(),
            slot.clone(),
        );
        let uri: http::Uri = format!("http://{addr}").parse().unwrap();
        let first = connector.clone().oneshot(uri.clone()).await.unwrap();
        let second = connector.oneshot(uri).await.unwrap();
        assert_eq!((account.get(), slot.get()), (2, 2));
        drop(first);
        assert_eq!((account.get(), slot.get()), (1, 1));
        drop(second);
        assert_eq!((account.get(), slot.get()), (0, 0));
    }
}
