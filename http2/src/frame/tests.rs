use proptest::prelude::*;

use super::*;

fn parse_one(bytes: &[u8]) -> Result<Frame<'_>, FrameError> {
    let head = Head::parse(bytes).expect("a whole head");
    Frame::parse(head, &bytes[HEAD_LEN..HEAD_LEN + head.len])
}

#[test]
fn written_frames_parse_back() {
    let mut out = BytesMut::new();
    write_data(&mut out, 1, b"hello", true);
    assert_eq!(
        parse_one(&out),
        Ok(Frame::Data {
            stream: 1,
            end_stream: true,
            data: b"hello",
            flow_len: 5
        })
    );
    let mut out = BytesMut::new();
    write_ping(&mut out, true, *b"12345678");
    assert_eq!(
        parse_one(&out),
        Ok(Frame::Ping {
            ack: true,
            data: *b"12345678"
        })
    );
    let mut out = BytesMut::new();
    write_window_update(&mut out, 3, 1000);
    assert_eq!(
        parse_one(&out),
        Ok(Frame::WindowUpdate {
            stream: 3,
            increment: 1000
        })
    );
    let mut out = BytesMut::new();
    write_reset(&mut out, 5, Reason::CANCEL);
    assert_eq!(
        parse_one(&out),
        Ok(Frame::Reset {
            stream: 5,
            reason: Reason::CANCEL
        })
    );
    let mut out = BytesMut::new();
    write_goaway(&mut out, 7, Reason::NO_ERROR, b"bye");
    assert_eq!(
        parse_one(&out),
        Ok(Frame::GoAway {
            last_stream: 7,
            reason: Reason::NO_ERROR,
            debug: b"bye"
        })
    );
    let settings = Settings {
        max_concurrent_streams: Some(100),
        initial_window_size: Some(1 << 20),
        max_frame_size: Some(16_384),
        ..Settings::default()
    };
    let mut out = BytesMut::new();
    settings.write(&mut out);
    assert_eq!(parse_one(&out), Ok(Frame::Settings(settings)));
    let mut out = BytesMut::new();
    write_settings_ack(&mut out);
    assert_eq!(parse_one(&out), Ok(Frame::SettingsAck));
}

#[test]
fn long_header_blocks_are_split_into_continuations() {
    let block = vec![7u8; 40_000];
    let mut out = BytesMut::new();
    write_headers(&mut out, 9, &block, true, 16_384);
    let mut at = 0;
    let mut got = Vec::new();
    let mut kinds = Vec::new();
    while at < out.len() {
        let head = Head::parse(&out[at..]).unwrap();
        let frame = Frame::parse(head, &out[at + HEAD_LEN..at + HEAD_LEN + head.len]).unwrap();
        match frame {
            Frame::Headers {
                stream: 9,
                end_stream: true,
                end_headers,
                block,
            } => {
                kinds.push(("headers", end_headers));
                got.extend_from_slice(block);
            }
            Frame::Continuation {
                stream: 9,
                end_headers,
                block,
            } => {
                kinds.push(("continuation", end_headers));
                got.extend_from_slice(block);
            }
            other => panic!("unexpected {other:?}"),
        }
        at += HEAD_LEN + head.len;
    }
    assert_eq!(got, block);
    assert_eq!(
        kinds,
        [
            ("headers", false),
            ("continuation", false),
            ("continuation", true)
        ]
    );
}

#[test]
fn padding_and_priority_are_removed() {
    // HEADERS, PADDED|PRIORITY|END_HEADERS, stream 1: pad 2, dep 0 weight 16,
    // block "ab", 2 bytes of padding.
    let bytes = [
        0,
        0,
        10,
        kind::HEADERS,
        flag::PADDED | flag::PRIORITY | flag::END_HEADERS,
        0,
        0,
        0,
        1, //
        2,
        0,
        0,
        0,
        0,
        16,
        b'a',
        b'b',
        0,
        0,
    ];
    assert_eq!(
        parse_one(&bytes),
        Ok(Frame::Headers {
            stream: 1,
            end_stream: false,
            end_headers: true,
            block: b"ab"
        })
    );
    // DATA with padding counts the whole payload for flow control.
    let bytes = [
        0,
        0,
        4,
        kind::DATA,
        flag::PADDED,
        0,
        0,
        0,
        1,
        1,
        b'x',
        b'y',
        0,
    ];
    assert_eq!(
        parse_one(&bytes),
        Ok(Frame::Data {
            stream: 1,
            end_stream: false,
            data: b"xy",
            flow_len: 4
        })
    );
}

#[test]
fn rfc_violations_get_the_rfc_error() {
    let conn = |r| move |e: FrameError| matches!(e, FrameError::Connection(x, _) if x == r);
    let cases: &[(&[u8], Reason)] = &[
        // DATA on stream 0.
        (
            &[0, 0, 0, kind::DATA, 0, 0, 0, 0, 0],
            Reason::PROTOCOL_ERROR,
        ),
        // Padding longer than the payload.
        (
            &[0, 0, 2, kind::DATA, flag::PADDED, 0, 0, 0, 1, 5, 0],
            Reason::PROTOCOL_ERROR,
        ),
        // SETTINGS on a stream; of a bad length; ACK with a payload.
        (
            &[0, 0, 0, kind::SETTINGS, 0, 0, 0, 0, 1],
            Reason::PROTOCOL_ERROR,
        ),
        (
            &[0, 0, 5, kind::SETTINGS, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Reason::FRAME_SIZE_ERROR,
        ),
        (
            &[
                0,
                0,
                6,
                kind::SETTINGS,
                flag::ACK,
                0,
                0,
                0,
                0,
                0,
                1,
                0,
                0,
                0,
                0,
            ],
            Reason::FRAME_SIZE_ERROR,
        ),
        // SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1; ENABLE_PUSH 2; MAX_FRAME_SIZE too small.
        (
            &[0, 0, 6, kind::SETTINGS, 0, 0, 0, 0, 0, 0, 4, 0x80, 0, 0, 0],
            Reason::FLOW_CONTROL_ERROR,
        ),
        (
            &[0, 0, 6, kind::SETTINGS, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 2],
            Reason::PROTOCOL_ERROR,
        ),
        (
            &[0, 0, 6, kind::SETTINGS, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 1],
            Reason::PROTOCOL_ERROR,
        ),
        // PING of 7 bytes; on a stream.
        (
            &[0, 0, 7, kind::PING, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Reason::FRAME_SIZE_ERROR,
        ),
        (
            &[0, 0, 8, kind::PING, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            Reason::PROTOCOL_ERROR,
        ),
        // WINDOW_UPDATE of 0 on the connection; of 3 bytes.
        (
            &[0, 0, 4, kind::WINDOW_UPDATE, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Reason::PROTOCOL_ERROR,
        ),
        (
            &[0, 0, 3, kind::WINDOW_UPDATE, 0, 0, 0, 0, 0, 0, 0, 1],
            Reason::FRAME_SIZE_ERROR,
        ),
        // RST_STREAM on stream 0; PUSH_PROMISE at all; GOAWAY too short.
        (
            &[0, 0, 4, kind::RST_STREAM, 0, 0, 0, 0, 0, 0, 0, 0, 8],
            Reason::PROTOCOL_ERROR,
        ),
        (
            &[0, 0, 0, kind::PUSH_PROMISE, 0, 0, 0, 0, 1],
            Reason::PROTOCOL_ERROR,
        ),
        (
            &[0, 0, 4, kind::GOAWAY, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Reason::FRAME_SIZE_ERROR,
        ),
        // CONTINUATION on stream 0.
        (
            &[0, 0, 0, kind::CONTINUATION, 0, 0, 0, 0, 0],
            Reason::PROTOCOL_ERROR,
        ),
    ];
    for (bytes, reason) in cases {
        let err = parse_one(bytes).expect_err("accepted");
        assert!(conn(*reason)(err), "{bytes:?}: {err:?}, wanted {reason}");
    }
    // Stream-scoped errors.
    let e = parse_one(&[0, 0, 4, kind::PRIORITY, 0, 0, 0, 0, 1, 0, 0, 0, 0]).unwrap_err();
    assert_eq!(
        e,
        FrameError::Stream(1, Reason::FRAME_SIZE_ERROR, "PRIORITY not 5 bytes")
    );
    let e = parse_one(&[0, 0, 5, kind::PRIORITY, 0, 0, 0, 0, 3, 0, 0, 0, 3, 16]).unwrap_err();
    assert!(matches!(
        e,
        FrameError::Stream(3, Reason::PROTOCOL_ERROR, _)
    ));
    let e = parse_one(&[0, 0, 4, kind::WINDOW_UPDATE, 0, 0, 0, 0, 3, 0, 0, 0, 0]).unwrap_err();
    assert!(matches!(
        e,
        FrameError::Stream(3, Reason::PROTOCOL_ERROR, _)
    ));
    // Unknown frame types are ignored; the reserved stream bit is cleared.
    assert_eq!(
        parse_one(&[0, 0, 1, 0xfa, 0, 0, 0, 0, 0, 9]),
        Ok(Frame::Unknown)
    );
    assert_eq!(
        Head::parse(&[0, 0, 0, 0, 0, 0x80, 0, 0, 1]).unwrap().stream,
        1
    );
}

proptest! {
    #[test]
    fn any_bytes_parse_or_are_refused_without_panic(bytes in proptest::collection::vec(any::<u8>(), 9..64)) {
        let head = Head::parse(&bytes).unwrap();
        let payload = &bytes[HEAD_LEN..];
        let len = head.len.min(payload.len());
        let head = Head { len, ..head };
        let _ = Frame::parse(head, &payload[..len]);
    }

    #[test]
    fn heads_round_trip(len in 0usize..(1 << 24), kind in any::<u8>(), flags in any::<u8>(), stream in 0u32..(1 << 31)) {
        let head = Head { len, kind, flags, stream };
        let mut out = BytesMut::new();
        head.write(&mut out);
        prop_assert_eq!(Head::parse(&out), Some(head));
    }
}
