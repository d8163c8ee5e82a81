use bytes::BufMut;
use proptest::prelude::*;

use super::*;

/// Bytes from the RFC's hex notation (white space ignored).
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn decode_all(d: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, DecodeError> {
    let mut out = Vec::new();
    d.decode(block, |n, v, _| {
        out.push((
            String::from_utf8_lossy(n).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    })?;
    Ok(out)
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

/// RFC 7541 C.3 (requests, no Huffman) and C.4 (the same with Huffman): one
/// decoder over three blocks, checking the table in between.
#[test]
fn rfc_request_examples() {
    let blocks = [
        [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        ],
        [
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8286 84be 5886 a8eb 1064 9cbf",
        ],
        [
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ],
    ];
    let expect = [
        pairs(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]),
        pairs(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ]),
        pairs(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]),
    ];
    let sizes = [57, 110, 164];
    for variant in 0..2 {
        let mut d = Decoder::new(4096);
        for (i, ((block, want), size)) in blocks.iter().zip(&expect).zip(sizes).enumerate() {
            let got = decode_all(&mut d, &hex(block[variant])).unwrap();
            assert_eq!(&got, want, "block {i}, variant {variant}");
            assert_eq!(d.table_size(), size, "block {i}, variant {variant}");
        }
    }
}

/// RFC 7541 C.5: responses with a 256-octet table, where entries are evicted.
#[test]
fn rfc_response_examples_with_eviction() {
    let mut d = Decoder::new(4096);
    // The peer shrinks the table first, as C.5 assumes a 256-octet table.
    decode_all(&mut d, &[0x3f, 0xe1, 0x01]).unwrap();
    let date = "Mon, 21 Oct 2013 20:13:21 GMT";
    let b1 = "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d";
    assert_eq!(
        decode_all(&mut d, &hex(b1)).unwrap(),
        pairs(&[
            (":status", "302"),
            ("cache-control", "private"),
            ("date", date),
            ("location", "https://www.example.com"),
        ])
    );
    assert_eq!(d.table_size(), 222);
    assert_eq!(
        decode_all(&mut d, &hex("4803 3330 37c1 c0bf")).unwrap(),
        pairs(&[
            (":status", "307"),
            ("cache-control", "private"),
            ("date", date),
            ("location", "https://www.example.com"),
        ])
    );
    assert_eq!(d.table_size(), 222);
    let b3 = "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e 3d31";
    assert_eq!(
        decode_all(&mut d, &hex(b3)).unwrap(),
        pairs(&[
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ("location", "https://www.example.com"),
            ("content-encoding", "gzip"),
            (
                "set-cookie",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
            ),
        ])
    );
    assert_eq!(d.table_size(), 215);
}

#[test]
fn malformed_blocks_are_refused() {
    let mut d = Decoder::new(4096);
    // Index 0, and an index beyond both tables.
    assert_eq!(decode_all(&mut d, &[0x80]), Err(DecodeError::BadIndex(0)));
    assert_eq!(decode_all(&mut d, &[0xbe]), Err(DecodeError::BadIndex(62)));
    // A literal whose value runs past the block.
    assert_eq!(
        decode_all(&mut d, &[0x40, 0x01, b'a', 0x05, b'x']),
        Err(DecodeError::Truncated)
    );
    // An integer that never ends, and one too long.
    assert_eq!(
        decode_all(&mut d, &[0xff, 0xff]),
        Err(DecodeError::Truncated)
    );
    assert_eq!(
        decode_all(&mut d, &[0xff, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]),
        Err(DecodeError::IntegerTooLarge)
    );
    // A size update above what this side announced, and one after a field.
    let mut d = Decoder::new(100);
    assert_eq!(
        decode_all(&mut d, &[0x3f, 0x46]),
        Err(DecodeError::SizeUpdateTooLarge(101))
    );
    assert_eq!(
        decode_all(&mut d, &[0x82, 0x20]),
        Err(DecodeError::SizeUpdateMisplaced)
    );
    assert!(decode_all(&mut d, &[0x20, 0x82]).is_ok());
}

#[test]
fn sensitive_fields_stay_never_indexed() {
    let mut e = Encoder::new(4096);
    let mut out = BytesMut::new();
    e.encode(
        [(&b"spinlink-token"[..], &b"secret"[..], Indexing::Never)],
        &mut out,
    );
    let mut d = Decoder::new(4096);
    let mut seen = Vec::new();
    d.decode(&out, |_, _, i| seen.push(i)).unwrap();
    assert_eq!(seen, [Indexing::Never]);
    assert_eq!(d.table_size(), 0, "a sensitive field was indexed");
}

#[test]
fn a_zero_capacity_encoder_keeps_no_table_and_says_so() {
    let mut e = Encoder::new(0);
    let mut out = BytesMut::new();
    e.encode([(&b"x-a"[..], &b"1"[..], Indexing::Indexed)], &mut out);
    // A size update to 0 first, then a literal without indexing.
    assert_eq!(out[0], 0x20);
    let mut d = Decoder::new(4096);
    decode_all(&mut d, &out).unwrap();
    assert_eq!(d.table_size(), 0);
}

/// The HPACK bomb: one literal adding a ~4 KiB entry to the table, then a
/// block's worth of one-octet references to it. 64 KiB on the wire would
/// decode to about 260 MB of fields.
fn bomb(value_len: usize, block_len: usize) -> Vec<u8> {
    let mut block = BytesMut::new();
    // Literal with incremental indexing, new name (§6.2.1).
    block.put_u8(0x40);
    encode_string(&mut block, b"x-bomb", false);
    encode_string(&mut block, &vec![b'a'; value_len], false);
    // Index 62: the newest dynamic entry (§6.1).
    if block_len > block.len() {
        block.resize(block_len, 0xbe);
    }
    block.to_vec()
}

/// What the decoder gives its caller before it stops: bytes copied out, as
/// the gateway copies every name and value, and the §4.1 list size.
fn decode_counting(d: &mut Decoder, block: &[u8]) -> (Result<(), DecodeError>, usize, usize) {
    let mut copied = Vec::new();
    let mut list = 0;
    let r = d.decode(block, |n, v, _| {
        list += n.len() + v.len() + 32;
        copied.extend_from_slice(n);
        copied.extend_from_slice(v);
    });
    (r, copied.len(), list)
}

#[test]
fn an_hpack_bomb_stops_at_the_header_list_limit() {
    const LIMIT: usize = 16 * 1024;
    let block = bomb(4000, 64 * 1024);
    let mut d = Decoder::new(4096).with_max_header_list_size(LIMIT);
    let (r, copied, list) = decode_counting(&mut d, &block);
    assert_eq!(r, Err(DecodeError::HeaderListTooLarge(LIMIT)));
    // Four fields of 4,038 fit; the fifth would pass the limit and is
    // neither copied nor given.
    assert!(list <= LIMIT, "the decoder gave {list} octets of fields");
    assert_eq!(list, 4 * (6 + 4000 + 32));
    assert!(copied <= LIMIT, "{copied} bytes copied out");
}

#[test]
fn a_header_list_at_the_limit_decodes_and_one_octet_more_does_not() {
    // Two fields: a 100-octet literal (138 with its overhead) and a
    // reference to it (138 more).
    let mut block = bomb(94, 0);
    block.push(0xbe);
    let exact = 2 * (6 + 94 + 32);
    let mut d = Decoder::new(4096).with_max_header_list_size(exact);
    assert_eq!(decode_counting(&mut d, &block).0, Ok(()));
    let mut d = Decoder::new(4096).with_max_header_list_size(exact - 1);
    let (r, _, list) = decode_counting(&mut d, &block);
    assert_eq!(r, Err(DecodeError::HeaderListTooLarge(exact - 1)));
    assert_eq!(list, exact / 2, "the first field only");
}

#[test]
fn an_oversized_literal_is_refused_before_it_is_decoded() {
    const LIMIT: usize = 1024;
    // A plain value and a Huffman-coded one, each longer than the limit.
    let mut plain = BytesMut::new();
    plain.put_u8(0x00);
    encode_string(&mut plain, b"x-big", false);
    encode_string(&mut plain, &[b'a'; 2000], false);
    let mut coded = BytesMut::new();
    coded.put_u8(0x00);
    encode_string(&mut coded, b"x-big", false);
    encode_string(&mut coded, &[b'a'; 2000], true);
    assert!(coded.len() < 2000, "Huffman-coded");
    // A name from the table that alone passes what is left.
    let mut named = BytesMut::new();
    named.put_u8(0x40);
    encode_string(&mut named, &[b'n'; 900], false);
    encode_string(&mut named, b"", false);
    // Literal with incremental indexing, name from entry 62 (the one above).
    named.put_u8(0x40 | 62);
    encode_string(&mut named, b"", false);
    for block in [&plain[..], &coded[..], &named[..]] {
        let mut d = Decoder::new(4096).with_max_header_list_size(LIMIT);
        let (r, copied, list) = decode_counting(&mut d, block);
        assert_eq!(r, Err(DecodeError::HeaderListTooLarge(LIMIT)));
        assert!(list <= LIMIT && copied <= LIMIT);
    }
    // Decoded Huffman text stops at what it may take.
    let mut text = Vec::new();
    let mut raw = Vec::new();
    huffman::encode(&[b'a'; 2000], &mut raw);
    assert_eq!(huffman::decode_within(&raw, &mut text, 100), Ok(false));
    assert!(text.len() <= 100 && text.capacity() <= 2 * 100);
}

fn field() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, u8)> {
    (
        prop_oneof![
            Just(b":path".to_vec()),
            Just(b"content-type".to_vec()),
            Just(b"x-custom".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..20),
        ],
        prop_oneof![
            Just(b"application/grpc".to_vec()),
            Just(b"/".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..300),
        ],
        0u8..3,
    )
}

proptest! {
    /// Whatever an encoder sends, a decoder reads back exactly, block after
    /// block, whatever table sizes the two sides settle on.
    #[test]
    fn encoder_and_decoder_stay_in_step(
        blocks in proptest::collection::vec(proptest::collection::vec(field(), 0..12), 1..12),
        cap in prop_oneof![Just(0usize), Just(256), Just(4096)],
        peer in prop_oneof![Just(0u32), Just(100), Just(4096), Just(65536)],
    ) {
        let mut e = Encoder::new(cap);
        e.set_peer_limit(peer.min(4096));
        let mut d = Decoder::new(4096);
        for fields in &blocks {
            let mut out = BytesMut::new();
            let indexing = |k: u8| match k {
                0 => Indexing::Indexed,
                1 => Indexing::NotIndexed,
                _ => Indexing::Never,
            };
            e.encode(fields.iter().map(|(n, v, k)| (&n[..], &v[..], indexing(*k))), &mut out);
            let mut got = Vec::new();
            d.decode(&out, |n, v, _| got.push((n.to_vec(), v.to_vec()))).unwrap();
            let want: Vec<_> = fields.iter().map(|(n, v, _)| (n.clone(), v.clone())).collect();
            prop_assert_eq!(got, want);
            prop_assert!(d.table_size() <= cap);
        }
    }

    /// Garbage never panics and never grows the table past the limit.
    #[test]
    fn garbage_never_panics(block in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut d = Decoder::new(256);
        let _ = d.decode(&block, |_, _, _| {});
        prop_assert!(d.table_size() <= 256);
    }
}
