use std::sync::Mutex;

use spinlink_http2::frame::{HEAD_LEN, Head, Settings};
use spinlink_http2::hpack::Decoder;

use super::*;

/// A source that records what the link tells it.
#[derive(Default)]
pub(crate) struct Recorder {
    pub credits: Mutex<Vec<(u32, usize)>>,
    pub fails: Mutex<Vec<(u32, Failure)>>,
    pub data: Mutex<Vec<(u32, Vec<u8>, bool)>>,
    pub headers: Mutex<Vec<(u32, Fields, bool)>>,
    /// What `data` reports as sent at once (None: all of it).
    pub accept: Mutex<Option<usize>>,
}

impl Sink for Recorder {
    fn headers(&self, id: u32, fields: Fields, end: bool) {
        self.headers.lock().unwrap().push((id, fields, end));
    }
    fn data(&self, id: u32, data: &[u8], end: bool) -> usize {
        self.data.lock().unwrap().push((id, data.to_vec(), end));
        self.accept
            .lock()
            .unwrap()
            .map_or(data.len(), |n| n.min(data.len()))
    }
    fn fail(&self, id: u32, failure: Failure) {
        self.fails.lock().unwrap().push((id, failure));
    }
    fn credit(&self, id: u32, n: usize) {
        self.credits.lock().unwrap().push((id, n));
    }
}

/// Every frame in `buf`, as (head, payload).
pub(crate) fn frames(buf: &[u8]) -> Vec<(Head, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(head) = Head::parse(&buf[at..]) {
        let start = at + HEAD_LEN;
        out.push((head, buf[start..start + head.len].to_vec()));
        at = start + head.len;
    }
    assert_eq!(at, buf.len(), "a partial frame");
    out
}

fn server() -> Arc<Link> {
    Link::new(
        Side::Server,
        Arc::from("test"),
        BytesMut::new(),
        Encoder::new(0),
    )
}

fn client() -> Arc<Link> {
    Link::new(
        Side::Client,
        Arc::from("test"),
        BytesMut::new(),
        Encoder::new(4096),
    )
}

fn take(link: &Link) -> Vec<(Head, Vec<u8>)> {
    frames(&link.lock().take_buf(BytesMut::new()))
}

fn decode(block: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    Decoder::new(4096)
        .decode(block, |n, v, _| {
            out.push((
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            ))
        })
        .unwrap();
    out
}

fn route(r: &Arc<Recorder>, id: u32) -> Route {
    Route {
        sink: r.clone(),
        id,
    }
}

#[test]
fn data_within_the_windows_goes_out_at_once_in_frames_of_the_peer_size() {
    let link = server();
    link.accept(1, None);
    let sent = link.data(1, &vec![7u8; 40_000], false);
    assert_eq!(sent, 40_000);
    let f = take(&link);
    // 65,535 window, 16,384 frames: three DATA frames.
    assert_eq!(
        f.iter().map(|(h, _)| (h.kind, h.len)).collect::<Vec<_>>(),
        [(0, 16_384), (0, 16_384), (0, 7_232)]
    );
}

#[test]
fn data_past_the_window_waits_and_is_credited_to_its_source_as_it_leaves() {
    let link = server();
    let src = Arc::new(Recorder::default());
    link.accept(1, Some(route(&src, 9)));
    let sent = link.data(1, &vec![1u8; 70_000], false);
    assert_eq!(sent, 65_535, "only the default window goes at once");
    take(&link);
    // The stream window opens, but the connection window is still spent.
    let mut d = Deliver::default();
    link.lock().window_update(1, 10_000, &mut d).unwrap();
    d.run();
    assert!(take(&link).is_empty());
    assert!(src.credits.lock().unwrap().is_empty());
    let mut d = Deliver::default();
    link.lock().window_update(0, 100_000, &mut d).unwrap();
    d.run();
    let f = take(&link);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].0.len, 70_000 - 65_535);
    assert_eq!(*src.credits.lock().unwrap(), [(9, 70_000 - 65_535)]);
}

#[test]
fn trailers_and_the_end_wait_behind_queued_data() {
    let link = server();
    link.accept(1, None);
    link.headers(
        1,
        vec![(Bytes::from_static(b":status"), Bytes::from_static(b"200"))],
        false,
    );
    link.data(1, &vec![0u8; 70_000], false);
    link.headers(1, grpc_status_fields(0, "", false), true);
    let kinds: Vec<u8> = take(&link).iter().map(|(h, _)| h.kind).collect();
    assert_eq!(
        kinds,
        [1, 0, 0, 0, 0],
        "trailers went before the queued data"
    );
    let mut d = Deliver::default();
    link.lock().window_update(0, 10_000, &mut d).unwrap();
    link.lock().window_update(1, 10_000, &mut d).unwrap();
    let f = take(&link);
    assert_eq!(
        f.iter().map(|(h, _)| h.kind).collect::<Vec<_>>(),
        [0, 1],
        "the rest of the data, then the trailers"
    );
    assert_eq!(f[1].0.flags & flag_end(), flag_end());
    let mut ended = Vec::new();
    link.lock().take_ended(&mut ended);
    assert_eq!(
        ended,
        [Ended {
            id: 1,
            reset: false
        }]
    );
}

fn flag_end() -> u8 {
    spinlink_http2::frame::flag::END_STREAM
}

#[test]
fn a_server_stream_failing_before_its_head_gets_a_trailers_only_unavailable() {
    let link = server();
    link.accept(3, None);
    link.fail(3, Failure::Unavailable("upstream instance gone".into()));
    let f = take(&link);
    assert_eq!(f.len(), 1);
    let fields = decode(&f[0].1);
    assert_eq!(fields[0], (":status".into(), "200".into()));
    assert!(fields.contains(&("grpc-status".into(), "14".into())));
    assert!(fields.contains(&("grpc-message".into(), "upstream instance gone".into())));
    // After a head, the same failure is trailers.
    let link = server();
    link.accept(5, None);
    link.headers(
        5,
        vec![(Bytes::from_static(b":status"), Bytes::from_static(b"200"))],
        false,
    );
    take(&link);
    link.fail(5, Failure::Unavailable("x".into()));
    let fields = decode(&take(&link)[0].1);
    assert_eq!(fields[0], ("grpc-status".into(), "14".into()));
    // A cancel is a reset, and the stream is gone.
    let link = server();
    link.accept(7, None);
    link.fail(7, Failure::Cancel);
    let f = take(&link);
    assert_eq!((f[0].0.kind, f[0].1.clone()), (3, vec![0, 0, 0, 8]));
    assert_eq!(link.data(7, b"late", false), 4, "dropped, fully credited");
    assert!(take(&link).is_empty());
}

#[test]
fn client_streams_get_odd_increasing_ids_within_the_peer_limit() {
    let link = client();
    let src = Arc::new(Recorder::default());
    let head = vec![
        (Bytes::from_static(b":method"), Bytes::from_static(b"POST")),
        (Bytes::from_static(b":path"), Bytes::from_static(b"/x")),
    ];
    let mut d = Deliver::default();
    link.lock()
        .apply_settings(
            &Settings {
                max_concurrent_streams: Some(2),
                ..Settings::default()
            },
            &mut d,
        )
        .unwrap();
    assert_eq!(link.open(&head, false, route(&src, 1)), Some(1));
    assert_eq!(link.open(&head, false, route(&src, 2)), Some(3));
    assert_eq!(
        link.open(&head, false, route(&src, 3)),
        None,
        "past the limit"
    );
    assert!(!link.is_usable());
    let mut opened = Vec::new();
    link.lock().take_opened(&mut opened);
    assert_eq!(opened.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 3]);
    // Closing hands back every source to tell.
    let routes = link.close();
    assert_eq!(routes.len(), 2);
    assert_eq!(link.open(&head, false, route(&src, 4)), None);
}

#[test]
fn a_larger_initial_window_may_not_take_a_stream_window_past_the_maximum() {
    let link = server();
    link.accept(1, None);
    let mut d = Deliver::default();
    // 65,535 + (2^31 − 1 − 65,535): the stream's window is at the maximum.
    link.lock()
        .window_update(1, frame::MAX_WINDOW - frame::DEFAULT_WINDOW, &mut d)
        .unwrap();
    let settings = |n| Settings {
        initial_window_size: Some(n),
        ..Settings::default()
    };
    // No change is fine; one octet more is past 2^31 − 1 (RFC 9113 §6.9.2).
    assert_eq!(
        link.lock()
            .apply_settings(&settings(frame::DEFAULT_WINDOW), &mut d),
        Ok(())
    );
    assert_eq!(
        link.lock()
            .apply_settings(&settings(frame::DEFAULT_WINDOW + 1), &mut d),
        Err(WindowOverflow)
    );
}

#[test]
fn a_smaller_initial_window_can_make_a_stream_window_negative() {
    let link = server();
    link.accept(1, None);
    link.data(1, &[0u8; 60_000], false);
    take(&link);
    let mut d = Deliver::default();
    // 65,535 → 1,000: the stream is now 59,000 over.
    link.lock()
        .apply_settings(
            &Settings {
                initial_window_size: Some(1_000),
                ..Settings::default()
            },
            &mut d,
        )
        .unwrap();
    link.lock().window_update(0, 1_000_000, &mut d).unwrap();
    assert_eq!(
        link.data(1, b"more", false),
        0,
        "nothing fits a negative window"
    );
    link.lock().window_update(1, 58_999, &mut d).unwrap();
    assert!(take(&link).is_empty(), "still below 0");
    link.lock().window_update(1, 5, &mut d).unwrap();
    assert_eq!(take(&link)[0].1, b"more");
}

#[test]
fn windows_past_two_to_the_31_are_refused() {
    let link = server();
    link.accept(1, None);
    let mut d = Deliver::default();
    assert_eq!(
        link.lock()
            .window_update(0, spinlink_http2::frame::MAX_WINDOW, &mut d),
        Err(WindowOverflow)
    );
    assert_eq!(
        link.lock()
            .window_update(1, spinlink_http2::frame::MAX_WINDOW, &mut d),
        Err(WindowOverflow)
    );
}

#[test]
fn tokens_are_never_put_in_the_hpack_table() {
    let link = client();
    let src = Arc::new(Recorder::default());
    let head = vec![
        (Bytes::from_static(b":path"), Bytes::from_static(b"/x")),
        (
            Bytes::from_static(b"spinlink-token"),
            Bytes::from_static(b"secret"),
        ),
        (Bytes::from_static(b"x-repeat"), Bytes::from_static(b"v")),
    ];
    link.open(&head, true, route(&src, 1));
    let f = take(&link);
    let mut d = Decoder::new(4096);
    let mut kinds = Vec::new();
    d.decode(&f[0].1, |n, _, i| kinds.push((n.to_vec(), i)))
        .unwrap();
    assert!(kinds.contains(&(b"spinlink-token".to_vec(), Indexing::Never)));
    assert!(kinds.contains(&(b"x-repeat".to_vec(), Indexing::Indexed)));
    // Both ends' tables hold x-repeat (and :path), never the token.
    assert!(d.table_size() > 0 && d.table_size() < 100);
}

#[test]
fn sinks_wake_the_task_once_per_poll() {
    let link = server();
    link.accept(1, None);
    let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    struct Count(Arc<std::sync::atomic::AtomicUsize>);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let waker = std::task::Waker::from(Arc::new(Count(woken.clone())));
    link.register(&waker);
    link.data(1, b"a", false);
    link.data(1, b"b", false);
    link.credit(1, 5);
    assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The task's next poll registers again and looks at the shared state.
    link.register(&waker);
    link.lock().begin_poll();
    link.data(1, b"c", false);
    assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A buffer written to the end, as a connection's writer leaves it.
fn written(capacity: usize, len: usize) -> BytesMut {
    use bytes::Buf as _;
    let mut buf = BytesMut::with_capacity(capacity);
    buf.extend_from_slice(&vec![7; len]);
    buf.advance(len);
    buf
}

#[test]
fn a_written_buffer_is_reused_in_place_by_the_next_one_started_on_its_thread() {
    std::thread::spawn(|| {
        let buf = written(WRITE_CHUNK, 500);
        let start = buf.as_ptr() as usize - 500;
        recycle(buf);
        let kept = spare().expect("kept");
        assert!(kept.is_empty());
        assert!(kept.capacity() >= WRITE_CHUNK);
        assert_eq!(
            kept.as_ptr() as usize,
            start,
            "the same allocation, from its start"
        );
        assert!(spare().is_none(), "handed out once");
        // Other threads keep their own.
        recycle(written(WRITE_CHUNK, 10));
        std::thread::spawn(|| assert!(spare().is_none()))
            .join()
            .unwrap();
        assert!(spare().is_some());
    })
    .join()
    .unwrap();
}

#[test]
fn a_buffer_still_shared_or_too_large_is_not_reused_in_place() {
    std::thread::spawn(|| {
        // Part of it handed on and still held: the spare is another
        // allocation, and the held bytes stay as they were.
        let mut buf = BytesMut::with_capacity(WRITE_CHUNK);
        buf.extend_from_slice(b"held elsewhere");
        let held = buf.split().freeze();
        recycle(buf);
        let mut kept = spare().expect("kept");
        kept.extend_from_slice(&[0; 64]);
        assert_eq!(&held[..], b"held elsewhere");
        assert_ne!(kept.as_ptr(), held.as_ptr());

        // A buffer grown past the bound is freed, not kept.
        recycle(written(SPARE_MAX * 2, 100));
        assert!(spare().is_none());

        // At most SPARES are kept.
        for _ in 0..SPARES + 3 {
            recycle(written(WRITE_CHUNK, 1));
        }
        assert_eq!(std::iter::from_fn(spare).count(), SPARES);
    })
    .join()
    .unwrap();
}
