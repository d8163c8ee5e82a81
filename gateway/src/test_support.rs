//! Stand-ins shared by the gateway's tests and other crates' (feature
//! `test-support`, which only dev-dependencies turn on).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

/// What an upstream stand-in saw: (its connection, counted from 1; the
/// request line) of each request it read, in order.
pub type RequestLog = Arc<Mutex<Vec<(usize, String)>>>;

/// A raw HTTP/1.1 upstream on loopback that answers `ok` to the first
/// request on each connection and keeps the connection open, then reads
/// the next request whole and closes the connection without answering: an
/// idle timeout meeting a request on the wire. Serves until the runtime
/// ends.
pub async fn closing_upstream() -> (SocketAddr, RequestLog) {
    let log = RequestLog::default();
    let seen = log.clone();
    let addr = serve_each(move |s, conn| serve(s, conn, seen.clone())).await;
    (addr, log)
}

/// Listens on a loopback port and runs `handle` on each connection
/// accepted (counted from 1) in a task of its own, until the runtime ends.
async fn serve_each<F, Fut>(handle: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream, usize) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding a loopback port");
    let addr = tcp.local_addr().expect("bound address");
    tokio::spawn(async move {
        let mut conns = 0;
        while let Ok((s, _)) = tcp.accept().await {
            conns += 1;
            tokio::spawn(handle(s, conns));
        }
    });
    addr
}

/// One connection of [`closing_upstream`].
async fn serve(s: tokio::net::TcpStream, conn: usize, seen: RequestLog) {
    let mut s = tokio::io::BufReader::new(s);
    for n in 0.. {
        let Some((first, length)) = read_head(&mut s).await else {
            return;
        };
        let mut body = vec![0; length];
        if s.read_exact(&mut body).await.is_err() {
            return;
        }
        seen.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((conn, first));
        if n > 0
            || s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .is_err()
        {
            return;
        }
    }
}

/// A raw HTTP/1.1 upstream on loopback that reads each request's head and
/// never answers, holding the connection until its client closes it: a
/// server that hangs. Serves until the runtime ends.
pub async fn silent_upstream() -> SocketAddr {
    serve_each(|s, _| async move {
        let mut s = tokio::io::BufReader::new(s);
        if read_head(&mut s).await.is_some() {
            // Whatever else comes is read and dropped until the end.
            let _ = tokio::io::copy(&mut s, &mut tokio::io::sink()).await;
        }
    })
    .await
}

/// A raw HTTP/1.1 upstream on loopback that answers each request for
/// `/raw/<name>` with `answer(name)`'s bytes exactly as given, then closes
/// the connection (an answer read until the close ends there). Serves
/// until the runtime ends.
pub async fn raw_upstream(answer: fn(&str) -> &'static [u8]) -> SocketAddr {
    serve_each(move |s, _| async move {
        let mut s = tokio::io::BufReader::new(s);
        let Some((first, _)) = read_head(&mut s).await else {
            return;
        };
        let name = first
            .split(' ')
            .nth(1)
            .and_then(|p| p.strip_prefix("/raw/"))
            .unwrap_or("");
        let mut s = s.into_inner();
        let _ = s.write_all(answer(name)).await;
        let _ = s.shutdown().await;
    })
    .await
}

/// Reads one request head off `s`: its request line and its
/// `Content-Length` (0 without one); `None` at the connection's end or on
/// an unreadable length.
async fn read_head(s: &mut tokio::io::BufReader<tokio::net::TcpStream>) -> Option<(String, usize)> {
    let (mut first, mut length) = (String::new(), 0);
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).await.unwrap_or(0) == 0 {
            return None;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        if line == "\r\n" {
            return Some((first, length));
        }
        if first.is_empty() {
            first = line.trim_end().to_owned();
        }
    }
}

/// A loopback address where connecting hangs, as to a host that drops
/// packets: a listener that never accepts, its accept queue (of one) filled,
/// so the kernel drops every further SYN and a connect waits for its own
/// timeout. Lasts as long as the value.
pub struct BlackHole {
    addr: SocketAddr,
    _listener: tokio::net::TcpListener,
    _queued: Vec<tokio::net::TcpStream>,
}

impl BlackHole {
    /// Binds it and fills its queue (panics if connecting never hangs).
    pub async fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
        // A backlog of 0: the queue holds one connection, no more.
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut queued = Vec::new();
        for _ in 0..16 {
            let connect = tokio::net::TcpStream::connect(addr);
            match tokio::time::timeout(std::time::Duration::from_millis(500), connect).await {
                Ok(Ok(stream)) => queued.push(stream),
                Ok(Err(e)) => panic!("filling the black hole's queue: {e}"),
                Err(_) => {
                    return Self {
                        addr,
                        _listener: listener,
                        _queued: queued,
                    };
                }
            }
        }
        panic!(
            "connecting to {addr} never hung after {} connections",
            queued.len()
        );
    }

    /// Where connections hang.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A loopback address that refuses connections: a port bound (so no one
/// else takes it) with nothing listening. Lasts as long as the socket.
pub fn refusing_address() -> (SocketAddr, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
    (socket.local_addr().unwrap(), socket)
}
