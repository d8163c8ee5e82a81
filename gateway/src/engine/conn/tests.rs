//! The connection driver against a scripted peer over an in-memory pipe.

use std::sync::Mutex;
use std::time::Duration;

use bytes::{BufMut, Bytes};
use spinlink_http2::frame::{flag, kind, write_data, write_headers, write_ping, write_reset};
use spinlink_http2::hpack::{self, Encoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;

use super::*;
use crate::engine::link::Sink;
use crate::engine::link::tests::Recorder;

const WAIT: Duration = Duration::from_secs(10);

fn local(max_streams: u32) -> Local {
    Local {
        max_concurrent_streams: max_streams,
        stream_window: frame::DEFAULT_WINDOW,
        conn_window: frame::DEFAULT_WINDOW,
        max_header_list_size: 16 * 1024,
        header_table_size: 4096,
        keepalive: Duration::from_secs(30),
        keepalive_timeout: Duration::from_secs(10),
        preface_timeout: None,
    }
}

/// A server role that routes every stream to one recorder.
struct TestServer {
    sink: Arc<Recorder>,
    glitches_allowed: u32,
    glitches: Arc<Mutex<Vec<Glitch>>>,
    signal: Arc<Mutex<Signal>>,
    refused: Arc<Mutex<Vec<StreamRefused>>>,
}

impl Role for TestServer {
    const SIDE: Side = Side::Server;

    fn open(&mut self, link: &Arc<Link>, id: u32, fields: Fields, end: bool) -> InStream {
        let route = Route {
            sink: self.sink.clone(),
            id,
        };
        link.accept(id, Some(route.clone()));
        self.sink.headers(id, fields, end);
        InStream::new(Target::Route(route), frame::DEFAULT_WINDOW).recv_closed(end)
    }

    fn glitch(&mut self, glitch: Glitch) -> bool {
        self.glitches.lock().unwrap().push(glitch);
        if self.glitches_allowed == 0 {
            return false;
        }
        self.glitches_allowed -= 1;
        true
    }

    fn refused(&mut self, why: StreamRefused) {
        self.refused.lock().unwrap().push(why);
    }

    fn poll_signal(&mut self, _cx: &mut Context<'_>, _open: usize, _link: &Arc<Link>) -> Signal {
        std::mem::replace(&mut *self.signal.lock().unwrap(), Signal::None)
    }

    fn failure(&self) -> Failure {
        Failure::Cancel
    }
}

/// The agent's end of the pipe.
struct Peer {
    io: DuplexStream,
    enc: Encoder,
    rbuf: BytesMut,
}

impl Peer {
    async fn send(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.unwrap();
    }

    /// Preface and empty SETTINGS; then the server's SETTINGS and its ACK.
    async fn handshake(&mut self) {
        let mut out = BytesMut::from(&frame::PREFACE[..]);
        Settings::default().write(&mut out);
        self.send(&out).await;
        let (h, _) = self.next().await;
        assert_eq!((h.kind, h.flags), (kind::SETTINGS, 0));
        let (h, _) = self.next_not(kind::WINDOW_UPDATE).await;
        assert_eq!((h.kind, h.flags), (kind::SETTINGS, flag::ACK));
    }

    fn head(&mut self, id: u32, path: &str, end: bool) -> BytesMut {
        let fields: [(&[u8], &[u8]); 4] = [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", path.as_bytes()),
            (b"content-type", b"application/grpc"),
        ];
        let mut block = BytesMut::new();
        self.enc.encode(
            fields
                .iter()
                .map(|(n, v)| (*n, *v, hpack::Indexing::Indexed)),
            &mut block,
        );
        let mut out = BytesMut::new();
        write_headers(&mut out, id, &block, end, 16_384);
        out
    }

    async fn open(&mut self, id: u32, end: bool) {
        let h = self.head(id, "/x", end);
        self.send(&h).await;
    }

    async fn next(&mut self) -> (Head, Vec<u8>) {
        self.next_within(WAIT).await
    }

    async fn next_within(&mut self, wait: Duration) -> (Head, Vec<u8>) {
        tokio::time::timeout(wait, async {
            loop {
                if let Some(head) = Head::parse(&self.rbuf)
                    && self.rbuf.len() >= HEAD_LEN + head.len
                {
                    let frame = self.rbuf.split_to(HEAD_LEN + head.len);
                    return (head, frame[HEAD_LEN..].to_vec());
                }
                let n = self.io.read_buf(&mut self.rbuf).await.unwrap();
                assert!(n > 0, "the connection closed");
            }
        })
        .await
        .expect("no frame from the server")
    }

    /// The next frame that is not of type `skip`.
    async fn next_not(&mut self, skip: u8) -> (Head, Vec<u8>) {
        loop {
            let f = self.next().await;
            if f.0.kind != skip {
                return f;
            }
        }
    }

    /// The GOAWAY the server ends with, as its error code.
    async fn goaway(&mut self) -> Reason {
        loop {
            let (h, p) = self.next().await;
            if h.kind == kind::GOAWAY {
                return Reason(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
            }
        }
    }
}

struct Server {
    peer: Peer,
    sink: Arc<Recorder>,
    link: Arc<Link>,
    signal: Arc<Mutex<Signal>>,
    /// What the role was told was refused.
    refused: Arc<Mutex<Vec<StreamRefused>>>,
    /// What the role was charged.
    glitches: Arc<Mutex<Vec<Glitch>>>,
    task: JoinHandle<Result<(), ConnError>>,
}

fn server(local: Local, glitches_allowed: u32) -> Server {
    let (a, b) = tokio::io::duplex(1 << 20);
    let sink = Arc::new(Recorder::default());
    let signal = Arc::new(Mutex::new(Signal::None));
    let link = Link::new(
        Side::Server,
        Arc::from("test"),
        local.preamble(Side::Server),
        Encoder::new(0),
    );
    let refused = Arc::new(Mutex::new(Vec::new()));
    let glitches = Arc::new(Mutex::new(Vec::new()));
    let role = TestServer {
        sink: sink.clone(),
        glitches_allowed,
        glitches: glitches.clone(),
        signal: signal.clone(),
        refused: refused.clone(),
    };
    let conn_link = link.clone();
    let task = tokio::spawn(async move {
        let mut conn = Conn::new(b, conn_link, role, local);
        let r = std::future::poll_fn(|cx| conn.poll_run(cx)).await;
        conn.shut();
        r
    });
    Server {
        peer: Peer {
            io: a,
            enc: Encoder::new(4096),
            rbuf: BytesMut::new(),
        },
        sink,
        link,
        signal,
        refused,
        glitches,
        task,
    }
}

/// HEADERS for stream 1 without END_HEADERS: CONTINUATION must follow.
fn unfinished_header_block() -> BytesMut {
    let mut out = BytesMut::new();
    frame::Head {
        len: 1,
        kind: kind::HEADERS,
        flags: 0,
        stream: 1,
    }
    .write(&mut out);
    out.put_u8(0x82);
    out
}

async fn ended(task: JoinHandle<Result<(), ConnError>>) -> Result<(), ConnError> {
    tokio::time::timeout(6 * WAIT, task)
        .await
        .expect("the connection did not end")
        .unwrap()
}

#[tokio::test]
async fn streams_are_opened_routed_and_their_windows_granted_again() {
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    s.peer.open(1, false).await;
    let mut out = BytesMut::new();
    write_data(&mut out, 1, &[5u8; 16_000], false);
    write_data(&mut out, 1, &[6u8; 16_000], false);
    s.peer.send(&out).await;
    // A quarter of the window consumed (sent on at once): granted again.
    let (h, p) = s.peer.next_not(kind::SETTINGS).await;
    assert_eq!(h.kind, kind::WINDOW_UPDATE);
    let mut got = vec![(h.stream, u32::from_be_bytes(p[..4].try_into().unwrap()))];
    let (h, p) = s.peer.next().await;
    got.push((h.stream, u32::from_be_bytes(p[..4].try_into().unwrap())));
    got.sort();
    assert_eq!(got, [(0, 32_000), (1, 32_000)]);
    let headers = s.sink.headers.lock().unwrap().clone();
    assert_eq!(headers.len(), 1);
    assert_eq!(&headers[0].1[2].1[..], b"/x");
    let data = s.sink.data.lock().unwrap().clone();
    assert_eq!(data.iter().map(|d| d.1.len()).sum::<usize>(), 32_000);
}

#[tokio::test]
async fn held_data_is_granted_again_only_when_the_other_side_credits_it() {
    let mut s = server(local(10), 10);
    *s.sink.accept.lock().unwrap() = Some(0);
    s.peer.handshake().await;
    s.peer.open(1, false).await;
    let mut out = BytesMut::new();
    write_data(&mut out, 1, &[1u8; 16_384], false);
    write_data(&mut out, 1, &[1u8; 16_384], false);
    s.peer.send(&out).await;
    // The connection window comes back (the data is held within the
    // stream's window), the stream's does not.
    let (h, _) = s.peer.next_not(kind::SETTINGS).await;
    assert_eq!((h.kind, h.stream), (kind::WINDOW_UPDATE, 0));
    tokio::time::sleep(Duration::from_millis(50)).await;
    while let Ok((h, _)) = tokio::time::timeout(Duration::from_millis(50), s.peer.next()).await {
        assert_eq!(
            (h.kind, h.stream),
            (kind::WINDOW_UPDATE, 0),
            "stream window granted early"
        );
    }
    s.link.credit(1, 32_768);
    let (h, p) = s.peer.next().await;
    assert_eq!((h.kind, h.stream), (kind::WINDOW_UPDATE, 1));
    assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), 32_768);
}

#[tokio::test]
async fn http1_on_the_port_is_not_a_preface() {
    let mut s = server(local(10), 10);
    s.peer.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(matches!(ended(s.task).await, Err(ConnError::Preface)));
}

#[tokio::test]
async fn the_first_frame_must_be_settings() {
    let mut s = server(local(10), 10);
    let mut out = BytesMut::from(&frame::PREFACE[..]);
    write_ping(&mut out, false, [0; 8]);
    s.peer.send(&out).await;
    assert_eq!(s.peer.goaway().await, Reason::PROTOCOL_ERROR);
    assert!(matches!(
        ended(s.task).await,
        Err(ConnError::Protocol(Reason::PROTOCOL_ERROR, _))
    ));
}

#[tokio::test]
async fn an_interrupted_header_block_is_a_protocol_error() {
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    let mut out = unfinished_header_block();
    write_ping(&mut out, false, [0; 8]);
    s.peer.send(&out).await;
    assert_eq!(s.peer.goaway().await, Reason::PROTOCOL_ERROR);
}

#[tokio::test]
async fn an_endless_header_block_is_cut_off() {
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    let mut out = unfinished_header_block();
    for _ in 0..5 {
        frame::Head {
            len: 16_000,
            kind: kind::CONTINUATION,
            flags: 0,
            stream: 1,
        }
        .write(&mut out);
        out.put_slice(&[0x82; 16_000]);
    }
    s.peer.send(&out).await;
    assert_eq!(s.peer.goaway().await, Reason::ENHANCE_YOUR_CALM);
}

#[tokio::test]
async fn a_header_block_that_does_not_decode_is_a_compression_error() {
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    let mut out = BytesMut::new();
    write_headers(&mut out, 1, &[0x80], false, 16_384);
    s.peer.send(&out).await;
    assert_eq!(s.peer.goaway().await, Reason::COMPRESSION_ERROR);
}

/// HEADERS and CONTINUATIONs for stream 1 carrying an HPACK bomb: one
/// 2,000-octet field indexed, then referred to in one octet each, about
/// 2 KiB of header list per octet of block.
fn hpack_bomb(enc: &mut Encoder) -> BytesMut {
    let value = vec![b'a'; 2000];
    let mut block = BytesMut::new();
    enc.encode(
        std::iter::repeat_n(
            (&b"x-bomb"[..], &value[..], hpack::Indexing::Indexed),
            60_000,
        ),
        &mut block,
    );
    assert!(block.len() <= MAX_HEADER_BLOCK);
    let mut out = BytesMut::new();
    write_headers(&mut out, 1, &block, false, 16_384);
    out
}

#[tokio::test]
async fn an_hpack_bomb_ends_the_connection_with_enhance_your_calm() {
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    let bomb = hpack_bomb(&mut s.peer.enc);
    s.peer.send(&bomb).await;
    assert_eq!(s.peer.goaway().await, Reason::ENHANCE_YOUR_CALM);
    assert!(matches!(
        ended(s.task).await,
        Err(ConnError::Offence(Offence::HeaderListTooLarge))
    ));
    assert!(
        s.sink.headers.lock().unwrap().is_empty(),
        "no stream was opened with it"
    );
}

#[tokio::test]
async fn a_header_list_just_over_the_limit_ends_the_connection() {
    // One field of 16,385 octets with its 32: one past the limit. A stream
    // reset would leave the peer free to send it again, and the decoder
    // stopped inside the block, so the connection cannot go on.
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    let value = vec![b'v'; 16 * 1024 + 1 - 32 - 5];
    let mut block = BytesMut::new();
    s.peer.enc.encode(
        [(&b"x-big"[..], &value[..], hpack::Indexing::NotIndexed)],
        &mut block,
    );
    let mut out = BytesMut::new();
    write_headers(&mut out, 1, &block, false, 16_384);
    s.peer.send(&out).await;
    assert_eq!(s.peer.goaway().await, Reason::ENHANCE_YOUR_CALM);
}

#[tokio::test]
async fn a_settings_change_past_the_maximum_window_is_a_flow_control_error() {
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    s.peer.open(1, false).await;
    let mut out = BytesMut::new();
    // Stream 1's send window to exactly 2^31−1, then one more by SETTINGS.
    frame::write_window_update(&mut out, 1, frame::MAX_WINDOW - frame::DEFAULT_WINDOW);
    Settings {
        initial_window_size: Some(frame::DEFAULT_WINDOW + 1),
        ..Settings::default()
    }
    .write(&mut out);
    s.peer.send(&out).await;
    assert_eq!(s.peer.goaway().await, Reason::FLOW_CONTROL_ERROR);
    assert!(matches!(
        ended(s.task).await,
        Err(ConnError::Offence(Offence::WindowOverflow))
    ));
}

fn with_preface_timeout(secs: u64) -> Local {
    Local {
        preface_timeout: Some(Duration::from_secs(secs)),
        ..local(10)
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_that_sends_no_preface_is_closed_at_the_timeout() {
    // Nothing at all, and the preface without its SETTINGS.
    for preface in [&b""[..], frame::PREFACE] {
        let mut s = server(with_preface_timeout(10), 10);
        let start = Instant::now();
        s.peer.send(preface).await;
        assert!(matches!(
            ended(s.task).await,
            Err(ConnError::PrefaceTimeout(t)) if t == Duration::from_secs(10)
        ));
        let waited = start.elapsed();
        assert!(waited >= Duration::from_secs(10) && waited < Duration::from_secs(11));
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_that_sent_its_preface_outlives_the_timeout() {
    let mut s = server(with_preface_timeout(10), 10);
    s.peer.handshake().await;
    tokio::time::advance(Duration::from_secs(20)).await;
    let mut out = BytesMut::new();
    write_ping(&mut out, false, *b"stillup!");
    s.peer.send(&out).await;
    let (h, p) = s.peer.next().await;
    assert_eq!((h.kind, &p[..]), (kind::PING, &b"stillup!"[..]));
    assert!(!s.task.is_finished());
}

#[tokio::test]
async fn data_past_the_stream_window_resets_the_stream_and_tells_the_other_side() {
    let mut s = server(local(10), 10);
    *s.sink.accept.lock().unwrap() = Some(0);
    s.peer.handshake().await;
    s.peer.open(1, false).await;
    let mut out = BytesMut::new();
    for _ in 0..5 {
        write_data(&mut out, 1, &[0u8; 16_000], false);
    }
    s.peer.send(&out).await;
    loop {
        let (h, p) = s.peer.next().await;
        if h.kind == kind::RST_STREAM {
            assert_eq!(h.stream, 1);
            assert_eq!(
                Reason(u32::from_be_bytes(p[..4].try_into().unwrap())),
                Reason::FLOW_CONTROL_ERROR
            );
            break;
        }
    }
    // The failure is told before the RST_STREAM is written.
    assert_eq!(*s.sink.fails.lock().unwrap(), [(1, Failure::Cancel)]);
}

#[tokio::test]
async fn pings_are_answered_with_their_data() {
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    let mut out = BytesMut::new();
    write_ping(&mut out, false, *b"abcdefgh");
    s.peer.send(&out).await;
    let (h, p) = s.peer.next().await;
    assert_eq!(
        (h.kind, h.flags, &p[..]),
        (kind::PING, flag::ACK, &b"abcdefgh"[..])
    );
}

#[tokio::test]
async fn rapid_resets_close_the_connection() {
    let mut s = server(local(100), 3);
    s.peer.handshake().await;
    for id in [1u32, 3, 5, 7] {
        s.peer.open(id, false).await;
        let mut out = BytesMut::new();
        write_reset(&mut out, id, Reason::CANCEL);
        s.peer.send(&out).await;
    }
    // Each reset is told before the GOAWAY is written.
    assert_eq!(s.peer.goaway().await, Reason::ENHANCE_YOUR_CALM);
    assert_eq!(
        s.sink.fails.lock().unwrap().len(),
        4,
        "every reset stream's other half told"
    );
}

/// One attack of each kind, alone on a connection with a budget of 8: the
/// ninth glitch ends it with GOAWAY `ENHANCE_YOUR_CALM`, and the role was
/// charged for each of that kind.
#[tokio::test]
async fn every_kind_of_useless_frame_spends_the_budget() {
    // Frames that each cost one glitch; stream 1 is open for those that
    // need a stream.
    type Attack = (Glitch, fn(&mut BytesMut));
    let attacks: [Attack; 7] = [
        // MadeYouReset: a WINDOW_UPDATE of 0 makes this side reset.
        (Glitch::StreamError, |out| {
            frame::Head {
                len: 4,
                kind: kind::WINDOW_UPDATE,
                flags: 0,
                stream: 1,
            }
            .write(out);
            out.put_u32(0);
        }),
        (Glitch::EmptyData, |out| write_data(out, 1, b"", false)),
        (Glitch::Priority, |out| {
            frame::Head {
                len: 5,
                kind: kind::PRIORITY,
                flags: 0,
                stream: 1,
            }
            .write(out);
            out.put_slice(&[0, 0, 0, 0, 16]);
        }),
        (Glitch::TinyWindowUpdate, |out| {
            frame::write_window_update(out, 0, 1)
        }),
        (Glitch::Settings, |out| Settings::default().write(out)),
        (Glitch::Ping, |out| write_ping(out, false, [7; 8])),
        (Glitch::UnknownFrame, |out| {
            frame::Head {
                len: 3,
                kind: 0xEE,
                flags: 0,
                stream: 0,
            }
            .write(out);
            out.put_slice(b"abc");
        }),
    ];
    for (glitch, write) in attacks {
        let mut s = server(local(100), 8);
        s.peer.handshake().await;
        s.peer.open(1, false).await;
        let mut out = BytesMut::new();
        for i in 0..9u32 {
            if glitch == Glitch::StreamError {
                // Each on a stream of its own: a reset stream is gone.
                let id = 3 + 2 * i;
                let head = s.peer.head(id, "/x", false);
                out.extend_from_slice(&head);
                let mut frame = BytesMut::new();
                write(&mut frame);
                frame[5..9].copy_from_slice(&id.to_be_bytes());
                out.extend_from_slice(&frame);
            } else {
                write(&mut out);
            }
        }
        s.peer.send(&out).await;
        assert_eq!(
            s.peer.goaway().await,
            Reason::ENHANCE_YOUR_CALM,
            "{glitch:?}"
        );
        assert!(
            matches!(
                ended(s.task).await,
                Err(ConnError::Offence(Offence::Glitches))
            ),
            "{glitch:?}"
        );
        let charged = s.glitches.lock().unwrap().clone();
        assert_eq!(charged.len(), 9, "{glitch:?}: {charged:?}");
        assert!(
            charged.iter().all(|g| *g == glitch),
            "{glitch:?}: {charged:?}"
        );
    }
}

/// What an honest peer does — its preface SETTINGS, large WINDOW_UPDATEs,
/// DATA with payload, a stream ended by END_STREAM — costs nothing.
#[tokio::test]
async fn honest_frames_cost_nothing() {
    // A budget of one: the PING that tells when the rest was read.
    let mut s = server(local(100), 1);
    s.peer.handshake().await;
    s.peer.open(1, false).await;
    let mut out = BytesMut::new();
    frame::write_window_update(&mut out, 0, 1 << 20);
    write_data(&mut out, 1, b"\0\0\0\0\x01x", false);
    write_data(&mut out, 1, b"", true);
    write_ping(&mut out, false, [1; 8]);
    s.peer.send(&out).await;
    loop {
        let (h, _) = s.peer.next().await;
        assert_ne!(h.kind, kind::GOAWAY);
        if h.kind == kind::PING {
            break;
        }
    }
    assert_eq!(*s.glitches.lock().unwrap(), [Glitch::Ping]);
    assert!(!s.task.is_finished());
}

#[tokio::test]
async fn streams_past_the_limit_are_refused() {
    let mut s = server(local(2), 10);
    s.peer.handshake().await;
    for id in [1u32, 3, 5] {
        s.peer.open(id, false).await;
    }
    let (h, p) = s.peer.next().await;
    assert_eq!((h.kind, h.stream), (kind::RST_STREAM, 5));
    assert_eq!(
        Reason(u32::from_be_bytes(p[..4].try_into().unwrap())),
        Reason::REFUSED_STREAM
    );
    assert_eq!(s.sink.headers.lock().unwrap().len(), 2);
    assert_eq!(*s.refused.lock().unwrap(), [StreamRefused::Limit]);
}

#[tokio::test]
async fn after_goaway_new_streams_are_refused_and_the_connection_ends_when_idle() {
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    s.peer.open(1, false).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    *s.signal.lock().unwrap() = Signal::GoAway;
    s.link.wake();
    let (h, p) = s.peer.next().await;
    assert_eq!(h.kind, kind::GOAWAY);
    assert_eq!(
        u32::from_be_bytes(p[..4].try_into().unwrap()),
        1,
        "last stream 1"
    );
    s.peer.open(3, false).await;
    let (h, _) = s.peer.next().await;
    assert_eq!((h.kind, h.stream), (kind::RST_STREAM, 3));
    assert_eq!(*s.refused.lock().unwrap(), [StreamRefused::GoingAway]);
    // Stream 1 finishes both ways; then the connection ends.
    let mut out = BytesMut::new();
    write_data(&mut out, 1, b"", true);
    s.peer.send(&out).await;
    s.link.headers(1, grpc_status_fields(0, "", true), true);
    assert!(ended(s.task).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_answering_pings_is_dropped() {
    let mut s = server(local(10), 10);
    s.peer.handshake().await;
    s.peer.open(1, false).await;
    // 30 s to the PING, 10 more without its answer.
    let (h, _) = s.peer.next_within(Duration::from_secs(60)).await;
    assert_eq!(h.kind, kind::PING);
    assert!(matches!(
        ended(s.task).await,
        Err(ConnError::KeepaliveTimeout)
    ));
    assert_eq!(*s.sink.fails.lock().unwrap(), [(1, Failure::Cancel)]);
}

use crate::engine::link::grpc_status_fields;

/// The client side: answers routed to whoever opened the stream.
struct TestClient {
    outcomes: Arc<Mutex<Vec<bool>>>,
}

impl Role for TestClient {
    const SIDE: Side = Side::Client;

    fn open(&mut self, _: &Arc<Link>, _: u32, _: Fields, _: bool) -> InStream {
        unreachable!()
    }

    fn answered(&mut self, ok: bool) {
        self.outcomes.lock().unwrap().push(ok);
    }

    fn poll_signal(&mut self, _: &mut Context<'_>, _: usize, _: &Arc<Link>) -> Signal {
        Signal::None
    }

    fn failure(&self) -> Failure {
        Failure::Unavailable("upstream stream broke".into())
    }
}

/// A client connection to a sidecar played by the test: its link, the
/// outcomes its role was told, the sidecar's end, the task, a recorder for
/// the routes and a request head.
#[allow(clippy::type_complexity)]
fn client() -> (
    Arc<Link>,
    Arc<Mutex<Vec<bool>>>,
    DuplexStream,
    JoinHandle<Result<(), ConnError>>,
    Arc<Recorder>,
    Fields,
) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let l = local(0);
    let link = Link::new(
        Side::Client,
        Arc::from("t"),
        l.preamble(Side::Client),
        Encoder::new(4096),
    );
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let role = TestClient {
        outcomes: outcomes.clone(),
    };
    let conn_link = link.clone();
    let task = tokio::spawn(async move {
        let mut conn = Conn::new(b, conn_link, role, l);
        let r = std::future::poll_fn(|cx| conn.poll_run(cx)).await;
        conn.shut();
        r
    });
    let head = vec![
        (Bytes::from_static(b":method"), Bytes::from_static(b"POST")),
        (Bytes::from_static(b":path"), Bytes::from_static(b"/x")),
    ];
    (link, outcomes, a, task, Arc::new(Recorder::default()), head)
}

#[tokio::test]
async fn a_client_routes_answers_skips_informational_heads_and_reopens_after_goaway() {
    let (link, outcomes, a, task, sink, head) = client();
    let open = |id| {
        link.open(
            &head,
            true,
            Route {
                sink: sink.clone(),
                id,
            },
        )
    };
    assert_eq!(open(10), Some(1));
    assert_eq!(open(11), Some(3));
    let mut sidecar = Peer {
        io: a,
        enc: Encoder::new(4096),
        rbuf: BytesMut::new(),
    };
    // The preface, SETTINGS, WINDOW_UPDATE and both HEADERS arrive.
    let mut preface = [0u8; 24];
    sidecar.io.read_exact(&mut preface).await.unwrap();
    assert_eq!(&preface, frame::PREFACE);
    let mut out = BytesMut::new();
    Settings::default().write(&mut out);
    let mut block = BytesMut::new();
    sidecar.enc.encode(
        [(&b":status"[..], &b"100"[..], hpack::Indexing::Indexed)],
        &mut block,
    );
    write_headers(&mut out, 1, &block, false, 16_384);
    let mut block = BytesMut::new();
    sidecar.enc.encode(
        [(&b":status"[..], &b"200"[..], hpack::Indexing::Indexed)],
        &mut block,
    );
    write_headers(&mut out, 1, &block, false, 16_384);
    write_data(&mut out, 1, b"answer", true);
    // Stream 3 was never processed.
    frame::write_goaway(&mut out, 1, Reason::NO_ERROR, b"");
    sidecar.send(&out).await;
    tokio::time::timeout(WAIT, async {
        while sink.fails.lock().unwrap().is_empty() || sink.data.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    let heads = sink.headers.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "the 100 head is not relayed");
    assert_eq!((heads[0].0, &heads[0].1[0].1[..]), (10, &b"200"[..]));
    assert_eq!(*sink.data.lock().unwrap(), [(10, b"answer".to_vec(), true)]);
    assert_eq!(
        *sink.fails.lock().unwrap(),
        [(
            11,
            Failure::Unavailable("upstream closing; reopen the stream".into())
        )]
    );
    assert!(!link.is_usable(), "no new streams after GOAWAY");
    assert_eq!(*outcomes.lock().unwrap(), [true, false]);
    task.abort();
}

/// A stream the agent's side cancels before the sidecar answered says
/// nothing about the sidecar: it is reset towards the sidecar but not
/// counted as a failure (outlier ejection would otherwise let one agent
/// resetting its own streams take a sidecar away from every tenant).
#[tokio::test]
async fn a_stream_the_other_side_cancels_is_not_the_peers_failure() {
    let (link, outcomes, a, task, sink, head) = client();
    let route = |id| Route {
        sink: sink.clone(),
        id,
    };
    assert_eq!(link.open(&head, false, route(10)), Some(1));
    assert_eq!(link.open(&head, false, route(11)), Some(3));
    let mut sidecar = Peer {
        io: a,
        enc: Encoder::new(4096),
        rbuf: BytesMut::new(),
    };
    let mut preface = [0u8; 24];
    sidecar.io.read_exact(&mut preface).await.unwrap();
    let mut out = BytesMut::new();
    Settings::default().write(&mut out);
    sidecar.send(&out).await;
    // The agent's side gives up on stream 1: the sidecar sees it reset.
    Sink::fail(&*link, 1, Failure::Cancel);
    let (h, p) = sidecar.next_not(kind::SETTINGS).await;
    let (h, p) = if h.kind == kind::HEADERS || h.kind == kind::WINDOW_UPDATE {
        sidecar.next_not(kind::HEADERS).await
    } else {
        (h, p)
    };
    assert_eq!((h.kind, h.stream), (kind::RST_STREAM, 1), "{h:?}");
    assert_eq!(
        Reason(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
        Reason::CANCEL
    );
    // The sidecar resets stream 3 itself: that one is its failure.
    // A PING after it: its answer says everything before it was handled.
    let mut out = BytesMut::new();
    write_reset(&mut out, 3, Reason::INTERNAL_ERROR);
    write_ping(&mut out, false, [3; 8]);
    sidecar.send(&out).await;
    loop {
        let (h, _) = sidecar.next().await;
        if h.kind == kind::PING {
            break;
        }
    }
    assert_eq!(
        *outcomes.lock().unwrap(),
        [false],
        "only the sidecar's reset counts"
    );
    task.abort();
}

fn block(fields: &[(&str, &[u8])]) -> Fields {
    fields
        .iter()
        .map(|(n, v)| {
            (
                Bytes::copy_from_slice(n.as_bytes()),
                Bytes::copy_from_slice(v),
            )
        })
        .collect()
}

/// RFC 9113 §8.2 and §8.3, each rule broken once in an otherwise valid
/// request head, response head or trailer block.
#[test]
fn header_blocks_are_checked_as_rfc_9113_requires() {
    let request = |extra: &[(&str, &[u8])]| {
        let mut f = vec![
            (":method", &b"POST"[..]),
            (":scheme", b"https"),
            (":path", b"/spinlink.v1.Tunnel/Relay"),
            (":authority", b"gateway"),
            ("content-type", b"application/grpc"),
        ];
        f.extend_from_slice(extra);
        block(&f)
    };
    assert!(valid_fields(&request(&[]), Side::Server, true));
    // Every byte but NUL, CR and LF, at every place of a word.
    let mut all: Vec<u8> = (1..=255u8).filter(|b| !b"\r\n".contains(b)).collect();
    for shift in 0..8 {
        all.rotate_left(shift);
        assert!(valid_fields(
            &request(&[("x-all", &all)]),
            Side::Server,
            true
        ));
    }
    assert!(valid_fields(
        &request(&[("te", b"trailers"), ("x-token_1!#$%&'*+-.^`|~", b"a\tb ~")]),
        Side::Server,
        true
    ));
    for (name, value) in [
        ("Content-Length", &b"1"[..]),
        ("x-Upper", b"1"),
        ("x token", b"1"),
        ("x:colon", b"1"),
        ("x\u{e9}", b"1"),
        ("", b"1"),
        ("connection", b"close"),
        ("keep-alive", b"1"),
        ("proxy-connection", b"1"),
        ("transfer-encoding", b"chunked"),
        ("upgrade", b"h2c"),
        ("te", b"gzip"),
        ("x-nul", b"a\0b"),
        ("x-cr", b"a\rb"),
        ("x-lf", b"a\nb"),
        ("x-long-lf", &[b"x".repeat(100), b"\n".to_vec()].concat()),
        (
            "x-word-cr",
            &[b"x".repeat(11), b"\r".to_vec(), b"x".repeat(20)].concat(),
        ),
        ("x-word-nul", &[b"\0".to_vec(), b"x".repeat(15)].concat()),
        ("x-word-lf", &[b"x".repeat(23), b"\n".to_vec()].concat()),
        (":status", b"200"),
        (":protocol", b"websocket"),
    ] {
        assert!(
            !valid_fields(&request(&[(name, value)]), Side::Server, true),
            "{name:?}: {:?} accepted",
            String::from_utf8_lossy(value)
        );
    }
    // Pseudo fields first, each once, `:path` not empty.
    let head = |f: &[(&str, &[u8])]| valid_fields(&block(f), Side::Server, true);
    assert!(!head(&[
        (":method", b"GET"),
        ("accept", b"*/*"),
        (":scheme", b"https"),
        (":path", b"/"),
    ]));
    assert!(!head(&[(":method", b"GET"), (":scheme", b"https")]));
    assert!(!head(&[
        (":method", b"GET"),
        (":method", b"GET"),
        (":scheme", b"https"),
        (":path", b"/"),
    ]));
    assert!(!head(&[
        (":method", b"GET"),
        (":scheme", b"https"),
        (":path", b"")
    ]));
    // A response head has `:status` and nothing a request has.
    let response = |f: &[(&str, &[u8])]| valid_fields(&block(f), Side::Client, true);
    assert!(response(&[
        (":status", b"200"),
        ("content-type", b"application/grpc")
    ]));
    assert!(!response(&[("content-type", b"application/grpc")]));
    assert!(!response(&[(":status", b"200"), (":path", b"/")]));
    // Trailers carry no pseudo field.
    assert!(valid_fields(
        &block(&[("grpc-status", b"0")]),
        Side::Client,
        false
    ));
    assert!(!valid_fields(
        &block(&[(":status", b"200"), ("grpc-status", b"0")]),
        Side::Client,
        false
    ));
}

#[test]
fn spans_past_the_inline_ones_keep_their_order() {
    let mut spans = Spans::default();
    let n = Spans::INLINE * 2 + 3;
    for i in 0..n {
        spans.push((i, i + 1, i + 2));
    }
    let seen: Vec<usize> = spans.iter().map(|s| s.0).collect();
    assert_eq!(seen, (0..n).collect::<Vec<_>>());
}
