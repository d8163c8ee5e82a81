//! A TCP balancer in the benchmark process, standing in for a cloud NLB in
//! front of the gateways: agents see one address, new connections go
//! round-robin to the backends that accept (a refused backend is skipped, as
//! an NLB's failed health check would) and bytes are piped both ways.
//!
//! The end-to-end tests have one in `tests/support/balancer.rs`, with faults
//! for the chaos test, built on blocking sockets and two threads per
//! connection. This one is asynchronous: 1,000 agent connections would be
//! 2,000 threads there, competing with the gateways under measurement for
//! the same two cores.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long dialling one backend may take before the next is tried.
pub const BACKEND_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A running balancer; it stops accepting and closes every connection it
/// carries when dropped.
pub struct Balancer {
    /// Where clients connect.
    pub addr: SocketAddr,
    open: Arc<AtomicUsize>,
    stop: watch::Sender<bool>,
}

impl Balancer {
    /// Listens on an ephemeral loopback port and balances over `backends`.
    /// Must be called within a tokio runtime.
    pub async fn start(backends: Vec<SocketAddr>) -> std::io::Result<Balancer> {
        Self::start_with(backends, false).await
    }

    /// As [`Balancer::start`]; with `proxy_protocol`, each backend connection
    /// starts with a PROXY v2 header, as an NLB's does, naming a client
    /// address of its own network: `10.a.b.1` from a counter, one /24 per
    /// connection, standing in for agents in many clusters' networks (on
    /// loopback every agent would otherwise be one source).
    pub async fn start_with(
        backends: Vec<SocketAddr>,
        proxy_protocol: bool,
    ) -> std::io::Result<Balancer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let open = Arc::new(AtomicUsize::new(0));
        let backends: Arc<[SocketAddr]> = backends.into();
        let next = Arc::new(AtomicUsize::new(0));
        let counter = open.clone();
        let mut accept_stop = stopped.clone();
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    _ = accept_stop.changed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => client,
                        // Out of descriptors or a reset before accept: the
                        // client retries, as it would against an NLB.
                        Err(_) => continue,
                    },
                };
                let start = next.fetch_add(1, Ordering::Relaxed);
                let header = proxy_protocol.then(|| proxy_v2_header(start));
                tokio::spawn(pipe(
                    client,
                    header,
                    backends.clone(),
                    start,
                    counter.clone(),
                    stopped.clone(),
                ));
            }
        });
        Ok(Balancer { addr, open, stop })
    }

    /// Connections piped now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// The first backend from `start` on (round-robin) that accepts.
async fn dial(backends: &[SocketAddr], start: usize) -> Option<TcpStream> {
    for i in 0..backends.len() {
        let b = backends[(start + i) % backends.len()];
        if let Ok(Ok(s)) =
            tokio::time::timeout(BACKEND_CONNECT_TIMEOUT, TcpStream::connect(b)).await
        {
            return Some(s);
        }
    }
    None
}

/// Pipes `client` to a backend until either side closes (or the balancer
/// stops); nothing accepting closes the client's connection at once.
async fn pipe(
    mut client: TcpStream,
    header: Option<Vec<u8>>,
    backends: Arc<[SocketAddr]>,
    start: usize,
    open: Arc<AtomicUsize>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(mut server) = dial(&backends, start).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    if let Some(header) = header {
        use tokio::io::AsyncWriteExt;
        if server.write_all(&header).await.is_err() {
            return;
        }
    }
    open.fetch_add(1, Ordering::Relaxed);
    tokio::select! {
        _ = stop.changed() => {}
        // Either side ending (or failing) closes both, as an NLB's reset does.
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
    }
    open.fetch_sub(1, Ordering::Relaxed);
}

/// A PROXY v2 header for connection `n`: TCP over IPv4 from `10.a.b.1`
/// (`a.b` the counter), to a fixed destination.
fn proxy_v2_header(n: usize) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x21); // version 2, PROXY
    h.push(0x11); // TCP over IPv4
    h.extend_from_slice(&12u16.to_be_bytes());
    h.extend_from_slice(&[10, (n >> 8) as u8, n as u8, 1]);
    h.extend_from_slice(&[127, 0, 0, 1]);
    h.extend_from_slice(&40000u16.to_be_bytes());
    h.extend_from_slice(&443u16.to_be_bytes());
    h
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An echo server on loopback that answers each read with `tag` and the
    /// bytes read.
    async fn echo(tag: u8) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let mut out = vec![tag];
                        out.extend_from_slice(&buf[..n]);
                        if s.write_all(&out).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    /// A loopback port nothing listens on: connecting is refused.
    async fn refused() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    }

    async fn roundtrip(addr: SocketAddr) -> u8 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 3];
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf[1..], b"hi");
        buf[0]
    }

    #[tokio::test]
    async fn round_robin_skips_a_refusing_backend_and_closes_on_drop() {
        let a = echo(b'a').await;
        let b = echo(b'b').await;
        let dead = refused().await;
        let bal = Balancer::start(vec![a, dead, b]).await.unwrap();
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(roundtrip(bal.addr).await);
        }
        // Every connection reached a live backend, and both were used.
        assert!(seen.contains(&b'a') && seen.contains(&b'b'), "{seen:?}");

        let mut held = TcpStream::connect(bal.addr).await.unwrap();
        held.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 2];
        held.read_exact(&mut buf).await.unwrap();
        drop(bal);
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), held.read_to_end(&mut rest))
            .await
            .expect("the balancer closed its connections")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn nothing_accepting_closes_the_client() {
        let dead = refused().await;
        let bal = Balancer::start(vec![dead]).await.unwrap();
        let mut c = TcpStream::connect(bal.addr).await.unwrap();
        let mut buf = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf))
            .await
            .expect("closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
        assert_eq!(bal.open(), 0);
    }
}
