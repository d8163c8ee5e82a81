//! nginx's `send_timeout` for ingress connections: a client that takes
//! nothing the gateway writes for that long is cut off.
//!
//! The answer to a request is written as the client reads it; one that
//! stops reading (its TCP window shut) would otherwise hold its connection,
//! its stream and — through the answer's body — an upstream connection and
//! the upstream's worker for as long as it likes, since the upstream's read
//! timeout only runs while the answer is being read. As nginx times the
//! client "between two successive write operations", the timer runs only
//! while a write waits on the socket: armed when one first finds the
//! socket full, dropped by the next write that takes any bytes, so a
//! connection whose writes go through never arms it. When it fires the
//! write fails with `TimedOut`, the HTTP engine ends the connection, and
//! the refusal is counted as `send_timeout`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::stats::{Refusal, Stats};

/// An ingress connection's transport with its writes timed.
pub(super) struct SendTimed<I> {
    io: I,
    timeout: Duration,
    /// Running while a write waits on a full socket.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    stats: Arc<Stats>,
}

impl<I> SendTimed<I> {
    pub(super) fn new(io: I, timeout: Duration, stats: Arc<Stats>) -> Self {
        Self {
            io,
            timeout,
            stalled: None,
            stats,
        }
    }

    /// What a write that returned `poll` comes to: made progress (the timer
    /// dropped), or waits — failing once it has waited for the timeout.
    #[inline]
    fn timed<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            if self.stalled.is_some() {
                self.stalled = None;
            }
            return poll;
        }
        self.waiting(cx).map(Err)
    }

    /// A write waits: the timer started if it is not running, and the
    /// error once it has run out.
    #[cold]
    fn waiting(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(stalled.as_mut().poll(cx));
        self.stats.refuse(Refusal::SendTimeout);
        Poll::Ready(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client took nothing written for send_timeout ({timeout:?})"),
        ))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for SendTimed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for SendTimed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.timed(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.timed(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.timed(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_shutdown(cx);
        self.timed(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// Writes wait on a peer that reads nothing; the wait ends the
    /// connection after the timeout and is counted. A peer that reads, however slowly
    /// between writes, is never cut off.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_waits_for_the_timeout_fails_and_is_counted() {
        let stats = Arc::new(Stats::default());
        let (near, mut far) = tokio::io::duplex(64);
        let mut timed = SendTimed::new(near, Duration::from_secs(60), stats.clone());
        let refusals = || stats.metrics().refusals(Refusal::SendTimeout);

        // The peer reads each write, an hour apart: no timer runs between
        // writes that go through.
        for _ in 0..3 {
            timed.write_all(&[7; 64]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            let mut got = [0; 64];
            far.read_exact(&mut got).await.unwrap();
        }
        assert_eq!(refusals(), 0);

        // The peer stops reading: the pipe fills, the write waits, and
        // fails once it has waited 60 s (not before).
        timed.write_all(&[7; 64]).await.unwrap();
        let started = tokio::time::Instant::now();
        let e = timed.write_all(&[7; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert_eq!(refusals(), 1);

        // Progress drops the timer: a write that waits 59 s, then goes
        // through, leaves a fresh 60 s for the next wait.
        let (near, mut far) = tokio::io::duplex(64);
        let mut timed = SendTimed::new(near, Duration::from_secs(60), stats.clone());
        timed.write_all(&[7; 64]).await.unwrap();
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(59)).await;
            let mut got = [0; 64];
            far.read_exact(&mut got).await.unwrap();
            far
        });
        timed.write_all(&[7; 64]).await.unwrap();
        let _far = reader.await.unwrap();
        let started = tokio::time::Instant::now();
        let e = timed.write_all(&[7; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert_eq!(refusals(), 2);
    }
}
