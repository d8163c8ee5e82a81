//! Fuzz target bodies: one plain function per parser, each asserting what
//! must hold for *any* bytes (no panic, and the invariants named on each).
//! `http2/fuzz` (cargo-fuzz) calls them with libFuzzer's inputs; the tests
//! below run them for a bounded time with `spinlink-fuzzing` in the suite.

use bytes::BytesMut;

use crate::frame::{self, Frame, HEAD_LEN, Head};
use crate::hpack::{DecodeError, Decoder, Encoder, Indexing, huffman};

/// A byte stream read as frames, as a connection reads them: every frame
/// either parses or is refused, without a panic; one that parses is written
/// back by the writers and parses to the same frame.
pub fn frames(data: &[u8]) {
    let mut at = 0;
    while let Some(head) = Head::parse(&data[at..]) {
        let start = at + HEAD_LEN;
        let Some(payload) = data.get(start..start + head.len) else {
            return;
        };
        at = start + head.len;
        let Ok(parsed) = Frame::parse(head, payload) else {
            continue;
        };
        let mut out = BytesMut::new();
        match parsed {
            Frame::Data {
                stream,
                end_stream,
                data,
                ..
            } => frame::write_data(&mut out, stream, data, end_stream),
            Frame::Ping { ack, data } => frame::write_ping(&mut out, ack, data),
            Frame::Reset { stream, reason } => frame::write_reset(&mut out, stream, reason),
            Frame::WindowUpdate { stream, increment } => {
                frame::write_window_update(&mut out, stream, increment)
            }
            Frame::GoAway {
                last_stream,
                reason,
                debug,
            } => frame::write_goaway(&mut out, last_stream, reason, debug),
            Frame::SettingsAck => frame::write_settings_ack(&mut out),
            Frame::Settings(s) => s.write(&mut out),
            _ => continue,
        }
        let again = Head::parse(&out).expect("a written head");
        let reparsed = Frame::parse(again, &out[HEAD_LEN..]).expect("a written frame parses");
        match (parsed, reparsed) {
            // Padding is not written back; the data is the same.
            (Frame::Data { data: a, .. }, Frame::Data { data: b, .. }) => assert_eq!(a, b),
            (a, b) => assert_eq!(a, b),
        }
    }
}

/// A header block: decoding any bytes never panics and never grows the
/// table past its limit; the fields it gives never add up to more than the
/// header list limit (RFC 7541 §4.1 accounting), and it refuses a block
/// only where the whole block would pass it, after the same fields a
/// decoder without the bound gives first; a block that decodes, encoded
/// again (with and without Huffman coding) and decoded by a fresh decoder,
/// gives the same fields.
pub fn hpack(data: &[u8]) {
    let limit = 256;
    // Small enough for the fuzzer's inputs to reach (a reference to a full
    // 256-octet entry is 256 of it).
    let max_list = 512;
    let mut d = Decoder::new(limit).with_max_header_list_size(max_list);
    let mut fields = Vec::new();
    let mut list = 0;
    let decoded = d.decode(data, |n, v, i| {
        list += n.len() + v.len() + 32;
        assert!(list <= max_list, "decoded {list} octets past {max_list}");
        fields.push((n.to_vec(), v.to_vec(), i));
    });
    assert!(d.table_size() <= limit);
    let mut whole = Vec::new();
    let mut whole_list = 0;
    let unbounded = Decoder::new(limit)
        .with_max_header_list_size(usize::MAX)
        .decode(data, |n, v, i| {
            whole_list += n.len() + v.len() + 32;
            whole.push((n.to_vec(), v.to_vec(), i));
        });
    match decoded {
        Err(DecodeError::HeaderListTooLarge(at)) => {
            assert_eq!(at, max_list);
            assert!(whole.starts_with(&fields), "refused after other fields");
            if unbounded.is_ok() {
                assert!(whole_list > max_list, "refused a list of {whole_list}");
            }
            return;
        }
        Err(e) => {
            assert_eq!(unbounded, Err(e), "the bound changed the error");
            return;
        }
        Ok(()) => {
            assert_eq!(unbounded, Ok(()));
            assert_eq!(whole, fields);
        }
    }
    for huff in [true, false] {
        let mut e = Encoder::new(limit);
        if !huff {
            e = e.without_huffman();
        }
        let mut out = BytesMut::new();
        e.encode(
            fields.iter().map(|(n, v, i)| (&n[..], &v[..], *i)),
            &mut out,
        );
        let mut again = Vec::new();
        Decoder::new(4096)
            .decode(&out, |n, v, i| again.push((n.to_vec(), v.to_vec(), i)))
            .expect("an encoded block decodes");
        assert_eq!(again.len(), fields.len());
        for (a, b) in fields.iter().zip(&again) {
            assert_eq!((&a.0, &a.1), (&b.0, &b.1));
            // What must never be indexed stays so through a hop.
            if a.2 == Indexing::Never {
                assert_eq!(b.2, Indexing::Never);
            }
        }
    }
}

/// Huffman-coded text: decoding any bytes never panics; text that decodes
/// encodes to the shortest code of itself, which decodes back.
pub fn huffman(data: &[u8]) {
    let mut text = Vec::new();
    if huffman::decode(data, &mut text).is_err() {
        return;
    }
    let mut coded = Vec::new();
    huffman::encode(&text, &mut coded);
    assert_eq!(coded.len(), huffman::encoded_len(&text));
    assert!(
        coded.len() <= data.len(),
        "a canonical code is never longer"
    );
    let mut back = Vec::new();
    huffman::decode(&coded, &mut back).expect("encoded text decodes");
    assert_eq!(back, text);
}

#[cfg(test)]
mod tests {
    use spinlink_fuzzing::Fuzz;

    use super::*;

    fn settings_and_data() -> Vec<u8> {
        let mut out = BytesMut::new();
        frame::Settings {
            max_concurrent_streams: Some(10),
            initial_window_size: Some(1 << 20),
            ..frame::Settings::default()
        }
        .write(&mut out);
        frame::write_data(&mut out, 1, b"hello", true);
        frame::write_ping(&mut out, false, *b"12345678");
        frame::write_window_update(&mut out, 3, 100);
        frame::write_goaway(&mut out, 5, frame::Reason::NO_ERROR, b"bye");
        frame::write_headers(&mut out, 7, &[0x82, 0x86], false, 16_384);
        out.to_vec()
    }

    #[test]
    fn fuzz_frames() {
        Fuzz::new("http2-frames")
            .seeds([settings_and_data()])
            .run(frames);
    }

    #[test]
    fn fuzz_hpack() {
        let mut block = BytesMut::new();
        Encoder::new(4096).encode(
            [
                (
                    &b":path"[..],
                    &b"/spinlink.v1.Tunnel/Relay"[..],
                    Indexing::Indexed,
                ),
                (b"spinlink-token", b"abc", Indexing::Never),
                (b"x-custom", b"value", Indexing::NotIndexed),
            ],
            &mut block,
        );
        // A small HPACK bomb: an entry of 150 octets, then references to it.
        let mut bomb = vec![0x40, 0x01, b'x', 0x7f, 148 - 127];
        bomb.extend_from_slice(&[b'v'; 148]);
        bomb.extend_from_slice(&[0xbe; 8]);
        Fuzz::new("http2-hpack")
            .seeds([
                block.to_vec(),
                crate::hpack::tests::hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
                bomb,
            ])
            .dictionary([&[0x3f, 0xe1, 0x1f][..], &[0x20], &[0x40], &[0x10], &[0xbe]])
            .max_len(1024)
            .run(hpack);
    }

    #[test]
    fn fuzz_huffman() {
        let mut coded = Vec::new();
        huffman::encode(b"www.example.com/custom-value", &mut coded);
        Fuzz::new("http2-huffman")
            .seeds([coded])
            .max_len(256)
            .run(huffman);
    }
}
