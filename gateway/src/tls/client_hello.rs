//! Just enough of a TLS ClientHello to find the session ticket it offers
//! (RFC 8446 §4.2.11, `pre_shared_key`), read before the handshake starts so
//! that admission can tell a returning agent from a stranger
//! ([`crate::listener`]). Nothing here is trusted: the ticket is only worth
//! something once [`super::tickets::Tickets::is_ours`] opened it, and the
//! bytes go to rustls unchanged either way.

/// TLS record header: type, legacy version, length.
pub const RECORD_HEADER_LEN: usize = 5;
/// Largest TLS plaintext record (RFC 8446 §5.1).
pub const MAX_RECORD_LEN: usize = 1 << 14;
const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_PRE_SHARED_KEY: u16 = 41;

/// What the bytes read so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Peek<'a> {
    /// The first record is not complete yet: read more.
    Incomplete,
    /// A ClientHello offering this ticket (the first PSK identity).
    Ticket(&'a [u8]),
    /// No ticket: none offered, not a ClientHello, a hello spread over
    /// several records, or malformed (rustls will say why).
    None,
}

/// Looks at the first TLS record in `buf`.
pub fn peek(buf: &[u8]) -> Peek<'_> {
    let Some(header) = buf.get(..RECORD_HEADER_LEN) else {
        // Too short to judge; but not a handshake record at all ends it early.
        return match buf.first() {
            Some(&t) if t != CONTENT_HANDSHAKE => Peek::None,
            _ => Peek::Incomplete,
        };
    };
    if header[0] != CONTENT_HANDSHAKE {
        return Peek::None;
    }
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len > MAX_RECORD_LEN {
        return Peek::None;
    }
    let Some(record) = buf.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len) else {
        return Peek::Incomplete;
    };
    ticket(record).map_or(Peek::None, Peek::Ticket)
}

/// A cursor over bytes that fails (`None`) past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }

    /// A vector with a one- or two-byte length.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// The first PSK identity of the ClientHello in `record`, a handshake
/// record's payload.
fn ticket(record: &[u8]) -> Option<&[u8]> {
    let mut r = Reader(record);
    if r.u8()? != HANDSHAKE_CLIENT_HELLO {
        return None;
    }
    // A hello longer than this record is split over several: no ticket
    // is looked for, and the connection is admitted as a stranger.
    let len = r.u24()?;
    let hello = r.take(len)?;
    let mut h = Reader(hello);
    h.take(2 + 32)?; // legacy_version, random
    h.vec8()?; // legacy_session_id
    h.vec16()?; // cipher_suites
    h.vec8()?; // legacy_compression_methods
    let mut extensions = Reader(h.vec16()?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let body = extensions.vec16()?;
        if kind == EXTENSION_PRE_SHARED_KEY {
            let mut psk = Reader(body);
            let mut identities = Reader(psk.vec16()?);
            let identity = identities.vec16()?;
            return (!identity.is_empty()).then_some(identity);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello record with `extensions`, each `(type, body)`.
    fn hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut ext = Vec::new();
        for (kind, body) in extensions {
            ext.extend_from_slice(&kind.to_be_bytes());
            ext.extend_from_slice(&(body.len() as u16).to_be_bytes());
            ext.extend_from_slice(body);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0]); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![HANDSHAKE_CLIENT_HELLO];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![CONTENT_HANDSHAKE, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    fn psk(identity: &[u8]) -> Vec<u8> {
        let mut ids = Vec::new();
        ids.extend_from_slice(&(identity.len() as u16).to_be_bytes());
        ids.extend_from_slice(identity);
        ids.extend_from_slice(&[0, 0, 0, 0]); // obfuscated age
        let mut body = (ids.len() as u16).to_be_bytes().to_vec();
        body.extend_from_slice(&ids);
        body.extend_from_slice(&[0, 33, 32]); // binders: one of 32 bytes
        body.extend_from_slice(&[0; 32]);
        body
    }

    #[test]
    fn finds_the_ticket_after_other_extensions() {
        let rec = hello(&[(0, vec![0, 0]), (41, psk(b"the ticket"))]);
        assert_eq!(peek(&rec), Peek::Ticket(b"the ticket"));
        // Followed by more bytes (the rest of the flight): still found.
        let mut more = rec.clone();
        more.extend_from_slice(b"trailing");
        assert_eq!(peek(&more), Peek::Ticket(b"the ticket"));
    }

    #[test]
    fn every_prefix_is_incomplete_and_no_psk_is_none() {
        let rec = hello(&[(41, psk(b"t"))]);
        for n in 0..rec.len() {
            assert_eq!(peek(&rec[..n]), Peek::Incomplete, "prefix {n}");
        }
        assert_eq!(peek(&hello(&[(0, vec![0, 0])])), Peek::None);
        assert_eq!(peek(b"GET / HTTP/1.1\r\n"), Peek::None);
    }

    #[test]
    fn malformed_hellos_are_none_never_a_panic() {
        let rec = hello(&[(0, vec![1, 2, 3]), (41, psk(b"ticket"))]);
        // Every single-byte change, and every truncation of the record's
        // payload with the header's length fixed up to match.
        for i in 0..rec.len() {
            for delta in [1u8, 0x80, 0xff] {
                let mut bad = rec.clone();
                bad[i] = bad[i].wrapping_add(delta);
                let _ = peek(&bad);
            }
        }
        for n in RECORD_HEADER_LEN..rec.len() {
            let mut cut = rec[..n].to_vec();
            let len = (n - RECORD_HEADER_LEN) as u16;
            cut[3..5].copy_from_slice(&len.to_be_bytes());
            assert_eq!(peek(&cut), Peek::None, "cut at {n}");
        }
    }
}
