//! HPACK's Huffman code (RFC 7541 §5.2, Appendix B). The code is canonical
//! (codes of one length are consecutive and ordered by symbol, shorter codes
//! come first), so the RFC's table is fully described by each symbol's code
//! length: [`LENGTHS`] is Appendix B's `len` column, and the codes are
//! rebuilt from it. The tests check the result against Appendix C's
//! examples and the table's own invariants.

use std::sync::OnceLock;

/// The end-of-string symbol; never valid inside a string.
const EOS: usize = 256;

/// Code length in bits of every symbol 0..=255 and EOS (RFC 7541 Appendix B).
#[rustfmt::skip]
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
];

/// What canonical decoding needs, built once from [`LENGTHS`].
struct Canonical {
    /// Per length L (index L): the first code of that length, left-aligned in
    /// 32 bits, and the index in `symbols` of its symbol.
    first: [(u32, u16); 31],
    /// Per length L: how many codes have that length.
    count: [u16; 31],
    /// Symbols ordered by (length, symbol), which is the order of their codes.
    symbols: [u16; 257],
    /// Code of each symbol (right-aligned), for encoding and tests.
    codes: [u32; 257],
    /// For each 8-bit prefix, the symbol whose code (of at most 8 bits) it
    /// starts with, and that code's length (0: no code that short): the
    /// common characters decode with one lookup.
    fast: [(u8, u8); 256],
}

fn canonical() -> &'static Canonical {
    static TABLE: OnceLock<Canonical> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut order: Vec<usize> = (0..257).collect();
        order.sort_by_key(|&s| (LENGTHS[s], s));
        let mut c = Canonical {
            first: [(u32::MAX, 0); 31],
            count: [0; 31],
            symbols: [0; 257],
            codes: [0; 257],
            fast: [(0, 0); 256],
        };
        let mut code: u32 = 0;
        let mut prev_len = LENGTHS[order[0]];
        for (i, &s) in order.iter().enumerate() {
            let len = LENGTHS[s];
            if i > 0 {
                code = (code + 1) << (len - prev_len);
            }
            prev_len = len;
            c.codes[s] = code;
            c.symbols[i] = s as u16;
            let l = usize::from(len);
            if c.count[l] == 0 {
                c.first[l] = (code << (32 - len), i as u16);
            }
            c.count[l] += 1;
            if len <= 8 {
                let first = (code << (8 - len)) as usize;
                for prefix in first..first + (1 << (8 - len)) {
                    c.fast[prefix] = (s as u8, len);
                }
            }
        }
        c
    })
}

/// Why a Huffman-coded string was refused (all COMPRESSION_ERROR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HuffmanError {
    /// The bits name no symbol, or EOS appeared inside the string.
    #[error("invalid Huffman code")]
    InvalidCode,
    /// The padding was longer than 7 bits or not the EOS prefix (all ones).
    #[error("invalid Huffman padding")]
    InvalidPadding,
}

/// Appends the decoding of `src` to `out`.
pub fn decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    decode_within(src, out, usize::MAX).map(|_| ())
}

/// Appends the decoding of `src` to `out`, but never more than `max` bytes:
/// `Ok(false)` as soon as the text would be longer (what was appended is
/// then a prefix of it). The shortest code is 5 bits, so the text is at
/// most 8/5 of `src`; `max` bounds it before that is allocated.
pub fn decode_within(src: &[u8], out: &mut Vec<u8>, max: usize) -> Result<bool, HuffmanError> {
    let c = canonical();
    let start = out.len();
    out.reserve((src.len() + src.len() / 2).min(max));
    // Bits not yet decoded, left-aligned in `acc`; `n` of them are valid.
    // Below them `acc` holds zeros or the string's next bits, never others.
    let mut acc: u64 = 0;
    let mut n: u32 = 0;
    // The next byte of `src` not yet in `acc`.
    let mut next = 0;
    loop {
        if n <= 56 {
            if let Some(word) = src.get(next..).and_then(<[u8]>::first_chunk::<8>) {
                // Eight bytes at once; the whole ones that fit are counted,
                // the bits of the one cut off are its own (loaded again).
                let fit = (64 - n) / 8;
                acc |= u64::from_be_bytes(*word) >> n;
                n += fit * 8;
                next += fit as usize;
            } else {
                while let Some(&b) = src.get(next).filter(|_| n <= 56) {
                    acc |= u64::from(b) << (56 - n);
                    n += 8;
                    next += 1;
                }
            }
        }
        // Short codes while at least eight bits are loaded: one lookup each,
        // no other check that the bits are there.
        while n >= 8 {
            let (sym, len) = c.fast[(acc >> 56) as usize];
            if len == 0 {
                break;
            }
            if out.len() - start == max {
                return Ok(false);
            }
            out.push(sym);
            acc <<= len;
            n -= u32::from(len);
        }
        // A long code, or the end of the string, is looked at with every
        // bit there is loaded.
        if n <= 56 && next < src.len() {
            continue;
        }
        if n == 0 {
            return Ok(true);
        }
        let (sym, len) = c.fast[(acc >> 56) as usize];
        if len != 0 && u32::from(len) <= n {
            if out.len() - start == max {
                return Ok(false);
            }
            out.push(sym);
            acc <<= len;
            n -= u32::from(len);
            continue;
        }
        let top = (acc >> 32) as u32;
        let mut found = None;
        for len in 5..=30u32 {
            let l = len as usize;
            if c.count[l] == 0 {
                continue;
            }
            let (first, index) = c.first[l];
            let code = top >> (32 - len);
            let first_code = first >> (32 - len);
            if code >= first_code && code - first_code < u32::from(c.count[l]) {
                found = Some((len, usize::from(index) + (code - first_code) as usize));
                break;
            }
        }
        match found {
            Some((len, i)) if len <= n => {
                let sym = usize::from(c.symbols[i]);
                if sym == EOS {
                    return Err(HuffmanError::InvalidCode);
                }
                if out.len() - start == max {
                    return Ok(false);
                }
                out.push(sym as u8);
                acc <<= len;
                n -= len;
            }
            // What is left is shorter than any code it could start: it must
            // be padding, at most 7 bits, all ones (the start of EOS).
            _ => {
                let mask = (!0u64) << (64 - n);
                if n > 7 || acc & mask != mask {
                    return Err(HuffmanError::InvalidPadding);
                }
                return Ok(true);
            }
        }
    }
}

/// The Huffman-coded length of `src` in bytes.
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src
        .iter()
        .map(|&b| usize::from(LENGTHS[usize::from(b)]))
        .sum();
    bits.div_ceil(8)
}

/// Appends the Huffman coding of `src` to `out`, padded with ones.
pub fn encode(src: &[u8], out: &mut Vec<u8>) {
    let c = canonical();
    let mut acc: u64 = 0;
    let mut n: u32 = 0;
    for &b in src {
        let len = u32::from(LENGTHS[usize::from(b)]);
        acc = (acc << len) | u64::from(c.codes[usize::from(b)]);
        n += len;
        while n >= 8 {
            n -= 8;
            out.push((acc >> n) as u8);
        }
    }
    if n > 0 {
        let pad = 8 - n;
        out.push(((acc << pad) as u8) | ((1u8 << pad) - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hpack::tests::hex;

    /// RFC 7541 Appendix C.4 and C.6: Huffman-coded literals.
    const EXAMPLES: &[(&str, &str)] = &[
        ("www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
        ("no-cache", "a8eb 1064 9cbf"),
        ("custom-key", "25a8 49e9 5ba9 7d7f"),
        ("custom-value", "25a8 49e9 5bb8 e8b4 bf"),
        ("302", "6402"),
        ("private", "aec3 771a 4b"),
        (
            "Mon, 21 Oct 2013 20:13:21 GMT",
            "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
        ),
        (
            "https://www.example.com",
            "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
        ),
        ("307", "640e ff"),
        (
            "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            "94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        ),
        ("gzip", "9bd9 ab"),
    ];

    #[test]
    fn rfc_examples_decode_and_encode() {
        for (text, coded) in EXAMPLES {
            let coded = hex(coded);
            let mut out = Vec::new();
            decode(&coded, &mut out).unwrap();
            assert_eq!(out, text.as_bytes(), "decoding {text:?}");
            let mut enc = Vec::new();
            encode(text.as_bytes(), &mut enc);
            assert_eq!(enc, coded, "encoding {text:?}");
            assert_eq!(encoded_len(text.as_bytes()), coded.len());
        }
    }

    #[test]
    fn the_code_is_complete_and_eos_is_all_ones() {
        // Kraft's equality: a complete prefix code.
        let sum: f64 = LENGTHS.iter().map(|&l| 2f64.powi(-i32::from(l))).sum();
        assert!((sum - 1.0).abs() < 1e-12, "{sum}");
        assert_eq!(canonical().codes[EOS], 0x3fff_ffff);
        assert_eq!(LENGTHS[EOS], 30);
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        let mut enc = Vec::new();
        encode(&all, &mut enc);
        let mut dec = Vec::new();
        decode(&enc, &mut dec).unwrap();
        assert_eq!(dec, all);
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        // 'a' is 00011 (5 bits); padding with zeros is not the EOS prefix.
        assert_eq!(
            decode(&[0b0001_1000], &mut Vec::new()),
            Err(HuffmanError::InvalidPadding)
        );
        // A whole byte of ones after a complete symbol is 8 bits of padding.
        assert_eq!(
            decode(&[0b0001_1111, 0xff], &mut Vec::new()),
            Err(HuffmanError::InvalidPadding)
        );
        // EOS itself (30 ones) inside the string.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut Vec::new()),
            Err(HuffmanError::InvalidCode)
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_round_trip(data in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let mut enc = Vec::new();
            encode(&data, &mut enc);
            let mut dec = Vec::new();
            decode(&enc, &mut dec).unwrap();
            proptest::prop_assert_eq!(dec, data);
        }

        #[test]
        fn decoding_garbage_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = decode(&data, &mut Vec::new());
        }

        /// The decoder (eight bytes loaded at a time, table lookups) agrees
        /// with one that reads a bit at a time and looks the code up among
        /// all symbols, on anything: strings and garbage alike.
        #[test]
        fn decoding_agrees_with_a_bit_at_a_time_decoder(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            text in proptest::collection::vec(proptest::num::u8::ANY, 0..100),
        ) {
            let mut coded = Vec::new();
            encode(&text, &mut coded);
            for src in [&data, &coded] {
                let mut out = Vec::new();
                let got = decode(src, &mut out).map(|()| out);
                proptest::prop_assert_eq!(got, bit_by_bit(src));
            }
        }
    }

    fn bit_by_bit(src: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let c = canonical();
        let mut out = Vec::new();
        let (mut code, mut len) = (0u32, 0u8);
        for i in 0..src.len() * 8 {
            code = (code << 1) | u32::from((src[i / 8] >> (7 - i % 8)) & 1);
            len += 1;
            if let Some(sym) = (0..=EOS).find(|&s| LENGTHS[s] == len && c.codes[s] == code) {
                if sym == EOS {
                    return Err(HuffmanError::InvalidCode);
                }
                out.push(sym as u8);
                (code, len) = (0, 0);
            }
        }
        if len > 7 || code != (1 << len) - 1 {
            return Err(HuffmanError::InvalidPadding);
        }
        Ok(out)
    }
}
