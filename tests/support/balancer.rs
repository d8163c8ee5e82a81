//! A TCP load balancer for the end-to-end tests, standing in for a cloud NLB
//! in front of the gateways: agents see one address. New connections go
//! round-robin to the backends that accept (a refused backend is skipped,
//! as an NLB's failed health check would); bytes are piped both ways; an
//! idle cut, when set, closes connections with no traffic for that long, as
//! an NLB's idle timeout does. Faults for the chaos test: [`Balancer::cut`]
//! resets open connections, [`Balancer::stall`] holds their bytes back for a
//! while (a path that stops forwarding without closing). With PROXY protocol
//! on, each connection to a backend starts with a PROXY v2 header naming the
//! client, as an NLB with proxy protocol v2 enabled sends it. Threads and
//! blocking sockets: the tests are synchronous.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One balancer; stops accepting when dropped.
pub struct Balancer {
    /// Where clients connect.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    backends: Mutex<Vec<SocketAddr>>,
    next: AtomicUsize,
    idle: Option<Duration>,
    proxy_v2: bool,
    stop: AtomicBool,
    /// Open connections per backend address.
    open: Mutex<Vec<(SocketAddr, usize)>>,
    /// Every open connection: id, backend, a handle on the client socket
    /// (to cut it) and until when its bytes are held back.
    live: Mutex<Vec<Live>>,
    ids: AtomicUsize,
}

struct Live {
    id: usize,
    backend: SocketAddr,
    client: TcpStream,
    stalled: Arc<Mutex<Option<Instant>>>,
}

impl Balancer {
    /// Balances over `backends`; `idle` cuts silent connections.
    pub fn start(backends: &[SocketAddr], idle: Option<Duration>) -> Balancer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Balancer::on(listener, backends, idle, false)
    }

    /// Balances what `listener` accepts over `backends`; `proxy_v2` sends
    /// each backend a PROXY v2 header first. Connections to backends are
    /// opened from the calling thread's network namespace (see
    /// `netns::Pod::run`).
    pub fn on(
        listener: TcpListener,
        backends: &[SocketAddr],
        idle: Option<Duration>,
        proxy_v2: bool,
    ) -> Balancer {
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            backends: Mutex::new(backends.to_vec()),
            next: AtomicUsize::new(0),
            idle,
            proxy_v2,
            stop: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
            live: Mutex::new(Vec::new()),
            ids: AtomicUsize::new(0),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let s = s.clone();
                std::thread::spawn(move || s.serve(client));
            }
        });
        Balancer { addr, shared }
    }

    /// Replaces the backends (a scaled or restarted gateway).
    pub fn set_backends(&self, backends: &[SocketAddr]) {
        *self.shared.backends.lock().unwrap() = backends.to_vec();
    }

    /// Resets every open connection (to `backend`, or to all with `None`),
    /// as an NLB losing its flow table would; returns how many were cut.
    pub fn cut(&self, backend: Option<SocketAddr>) -> usize {
        let live = self.shared.live.lock().unwrap();
        let mut n = 0;
        for l in live
            .iter()
            .filter(|l| backend.is_none_or(|b| b == l.backend))
        {
            let _ = l.client.shutdown(Shutdown::Both);
            n += 1;
        }
        n
    }

    /// Holds back the bytes of every open connection (to `backend`, or all)
    /// for `d`: both peers see a path that stops forwarding, not a close.
    /// Returns how many connections are stalled.
    pub fn stall(&self, backend: Option<SocketAddr>, d: Duration) -> usize {
        let until = Instant::now() + d;
        let live = self.shared.live.lock().unwrap();
        let mut n = 0;
        for l in live
            .iter()
            .filter(|l| backend.is_none_or(|b| b == l.backend))
        {
            *l.stalled.lock().unwrap() = Some(until);
            n += 1;
        }
        n
    }

    /// The backends configured now.
    pub fn backends(&self) -> Vec<SocketAddr> {
        self.shared.backends.lock().unwrap().clone()
    }

    /// Open connections to `backend`.
    pub fn open_to(&self, backend: SocketAddr) -> usize {
        self.shared
            .open
            .lock()
            .unwrap()
            .iter()
            .find(|(a, _)| *a == backend)
            .map_or(0, |(_, n)| *n)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

impl Shared {
    fn count(&self, backend: SocketAddr, delta: isize) {
        let mut open = self.open.lock().unwrap();
        match open.iter_mut().find(|(a, _)| *a == backend) {
            Some((_, n)) => *n = n.saturating_add_signed(delta),
            None if delta > 0 => open.push((backend, 1)),
            None => {}
        }
    }

    fn serve(&self, client: TcpStream) {
        let backends = self.backends.lock().unwrap().clone();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let upstream = (0..backends.len()).find_map(|i| {
            let b = backends[(start + i) % backends.len()];
            TcpStream::connect_timeout(&b, Duration::from_secs(2))
                .ok()
                .map(|s| (b, s))
        });
        let Some((backend, mut server)) = upstream else {
            return; // Nothing accepts: the client sees its connection closed.
        };
        if self.proxy_v2
            && let (Ok(from), Ok(to)) = (client.peer_addr(), client.local_addr())
            && server.write_all(&proxy_v2_header(from, to)).is_err()
        {
            return;
        }
        self.count(backend, 1);
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let stalled = Arc::new(Mutex::new(None::<Instant>));
        if let Ok(handle) = client.try_clone() {
            self.live.lock().unwrap().push(Live {
                id,
                backend,
                client: handle,
                stalled: stalled.clone(),
            });
        }
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        // Idle means no bytes either way, so both directions share one clock.
        let born = std::time::Instant::now();
        let last = Arc::new(AtomicUsize::new(0));
        let pipe = move |mut from: TcpStream,
                         mut to: TcpStream,
                         idle: Option<Duration>,
                         last: Arc<AtomicUsize>,
                         stalled: Arc<Mutex<Option<Instant>>>| {
            let _ = from.set_read_timeout(idle.map(|d| d / 4));
            let mut buf = [0u8; 16 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        // A stalled path forwards nothing until the stall ends
                        // (bounded: the stall has a fixed end).
                        let until = *stalled.lock().unwrap();
                        if let Some(until) = until {
                            std::thread::sleep(until.saturating_duration_since(Instant::now()));
                        }
                        last.store(born.elapsed().as_millis() as usize, Ordering::Relaxed);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        let quiet =
                            born.elapsed().as_millis() as usize - last.load(Ordering::Relaxed);
                        if idle.is_some_and(|d| quiet >= d.as_millis() as usize) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            // Either direction ending (or idling out) closes both, as an
            // NLB's reset does.
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        };
        let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let idle = self.idle;
        let last2 = last.clone();
        let stalled2 = stalled.clone();
        let up = std::thread::spawn(move || pipe(c2, s2, idle, last2, stalled2));
        pipe(server, client, idle, last, stalled);
        let _ = up.join();
        self.live.lock().unwrap().retain(|l| l.id != id);
        self.count(backend, -1);
    }
}

/// A PROXY protocol v2 header for a TCP connection from `from` to `to`
/// (both IPv4 or both IPv6), as an NLB sends it.
fn proxy_v2_header(from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x21); // version 2, PROXY
    let mut addrs = Vec::new();
    match (from, to) {
        (SocketAddr::V4(f), SocketAddr::V4(t)) => {
            h.push(0x11); // TCP over IPv4
            addrs.extend_from_slice(&f.ip().octets());
            addrs.extend_from_slice(&t.ip().octets());
        }
        (f, t) => {
            h.push(0x21); // TCP over IPv6
            let v6 = |a: SocketAddr| match a {
                SocketAddr::V4(a) => a.ip().to_ipv6_mapped(),
                SocketAddr::V6(a) => *a.ip(),
            };
            addrs.extend_from_slice(&v6(f).octets());
            addrs.extend_from_slice(&v6(t).octets());
        }
    }
    addrs.extend_from_slice(&from.port().to_be_bytes());
    addrs.extend_from_slice(&to.port().to_be_bytes());
    h.extend_from_slice(&(addrs.len() as u16).to_be_bytes());
    h.extend_from_slice(&addrs);
    h
}
