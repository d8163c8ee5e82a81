//! HPACK (RFC 7541): the [`Decoder`] every connection keeps for the header
//! blocks it receives, and the [`Encoder`] for those it sends.
//!
//! The decoder takes untrusted input: integers are bounded, every string
//! length is checked against the block, indices against the tables, table
//! size updates against the limit this side announced and allowed only at
//! the start of a block (§4.2). Any violation is a [`DecodeError`], which
//! HTTP/2 turns into a COMPRESSION_ERROR for the whole connection: after a
//! bad block the two sides' tables can no longer be trusted to agree.
//!
//! It also bounds what a block decodes to. An indexed field is one octet
//! on the wire and up to a whole table entry decoded, so a 64 KiB block of
//! references to one 4 KiB entry is a quarter of a gigabyte of fields. The
//! decoder counts the header list as RFC 9113 §6.5.2 does (name, value and
//! 32 octets per field, RFC 7541 §4.1) and stops with
//! [`DecodeError::HeaderListTooLarge`] at the first field that would pass
//! [`Decoder::with_max_header_list_size`], before copying or delivering it.
//! Stopping inside a block leaves the table out of step with the peer's,
//! so that too ends the connection (RFC 9113 §10.5.1 allows skipping the
//! rest of a header section only when the connection is closed).

pub mod huffman;
pub mod table;

use std::borrow::Cow;

use bytes::{BufMut, BytesMut};

use self::table::{Dynamic, STATIC};

/// Largest integer accepted in a header block: more than any length or index
/// a bounded header list can need, far from overflowing.
const MAX_INTEGER: usize = 1 << 24;

/// Why a header block could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The block ends inside an integer or a string.
    #[error("header block truncated")]
    Truncated,
    /// An integer larger than any the decoder accepts.
    #[error("integer too large")]
    IntegerTooLarge,
    /// An index beyond the static and dynamic tables (or 0).
    #[error("table index {0} out of range")]
    BadIndex(usize),
    /// A Huffman-coded string that does not decode.
    #[error("{0}")]
    Huffman(#[from] huffman::HuffmanError),
    /// A dynamic table size update above the announced limit.
    #[error("table size update to {0} above the limit")]
    SizeUpdateTooLarge(usize),
    /// A dynamic table size update after the first field of a block.
    #[error("table size update after a header field")]
    SizeUpdateMisplaced,
    /// The block decodes to a header list larger than this limit (§4.1
    /// accounting); decoding stopped at the field that would pass it, so
    /// the table may be out of step with the peer's.
    #[error("header list larger than {0} octets")]
    HeaderListTooLarge(usize),
}

/// Decodes an integer with an `prefix`-bit prefix from the start of `buf`
/// (§5.1); returns it and the bytes it took.
fn decode_integer(buf: &[u8], prefix: u8) -> Result<(usize, usize), DecodeError> {
    let mask = (1u16 << prefix) as usize - 1;
    let first = *buf.first().ok_or(DecodeError::Truncated)?;
    let mut value = usize::from(first) & mask;
    if value < mask {
        return Ok((value, 1));
    }
    let mut shift = 0u32;
    for (i, &b) in buf[1..].iter().enumerate() {
        // Four continuation octets reach 2^28; more is an overlong encoding.
        if shift > 21 {
            return Err(DecodeError::IntegerTooLarge);
        }
        value += usize::from(b & 0x7f) << shift;
        if value > MAX_INTEGER {
            return Err(DecodeError::IntegerTooLarge);
        }
        if b & 0x80 == 0 {
            return Ok((value, i + 2));
        }
        shift += 7;
    }
    Err(DecodeError::Truncated)
}

/// Decodes a string literal from the start of `buf` (§5.2), if it is at
/// most `max` octets long; returns it and the bytes it took. A longer one is
/// [`DecodeError::HeaderListTooLarge`] (with `limit`), found before it is
/// copied: a plain string by its length, a Huffman-coded one as soon as its
/// text passes `max`.
fn decode_string(
    buf: &[u8],
    max: usize,
    limit: usize,
) -> Result<(Cow<'_, [u8]>, usize), DecodeError> {
    let huffman = buf.first().ok_or(DecodeError::Truncated)? & 0x80 != 0;
    let (len, used) = decode_integer(buf, 7)?;
    let end = used.checked_add(len).ok_or(DecodeError::Truncated)?;
    let raw = buf.get(used..end).ok_or(DecodeError::Truncated)?;
    if huffman {
        let mut out = Vec::new();
        if !huffman::decode_within(raw, &mut out, max)? {
            return Err(DecodeError::HeaderListTooLarge(limit));
        }
        Ok((Cow::Owned(out), end))
    } else if raw.len() > max {
        Err(DecodeError::HeaderListTooLarge(limit))
    } else {
        Ok((Cow::Borrowed(raw), end))
    }
}

/// How a received field was represented, which a proxy must keep for
/// sensitive fields (§7.1.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Indexing {
    /// Indexed, or a literal added to the table.
    Indexed,
    /// A literal not added to the table.
    NotIndexed,
    /// A literal that must never be indexed by any hop.
    Never,
}

/// Largest header list a [`Decoder`] decodes unless told otherwise
/// ([`Decoder::with_max_header_list_size`]). RFC 9113 leaves
/// SETTINGS_MAX_HEADER_LIST_SIZE unlimited by default; a decoder of untrusted
/// input cannot be, and 64 KiB is what Envoy accepts by default
/// (`max_request_headers_kb`: 60) with room for the 32 octets per field.
pub const DEFAULT_MAX_HEADER_LIST_SIZE: usize = 64 * 1024;

/// The receiving side's HPACK state for one connection.
///
/// Memory: the table holds at most the announced `limit` of names and
/// values (the peer's entries, evicted oldest first). While decoding a
/// block, the decoder itself holds at most one field's copy: a name taken
/// from the table (at most `limit`) and a Huffman-decoded string (at most
/// what is left of the header list limit). What the callback is given adds
/// up to at most the header list limit, however the block was written.
#[derive(Debug, Clone)]
pub struct Decoder {
    table: Dynamic,
    /// The SETTINGS_HEADER_TABLE_SIZE this side announced: the most a size
    /// update may ask for.
    limit: usize,
    /// The most one block may decode to: the sum, over its fields, of name,
    /// value and 32 (§4.1; RFC 9113 §6.5.2).
    max_list: usize,
}

impl Decoder {
    /// A decoder whose peer may use a table of up to `limit` octets (what
    /// this side announces as SETTINGS_HEADER_TABLE_SIZE), decoding header
    /// lists of up to [`DEFAULT_MAX_HEADER_LIST_SIZE`].
    pub fn new(limit: usize) -> Self {
        Self {
            table: Dynamic::new(limit),
            limit,
            max_list: DEFAULT_MAX_HEADER_LIST_SIZE,
        }
    }

    /// Decodes blocks only up to a header list of `max` octets (what this
    /// side announces as SETTINGS_MAX_HEADER_LIST_SIZE); a larger one is
    /// [`DecodeError::HeaderListTooLarge`].
    #[must_use]
    pub fn with_max_header_list_size(mut self, max: usize) -> Self {
        self.max_list = max;
        self
    }

    /// The most one block may decode to.
    pub fn max_header_list_size(&self) -> usize {
        self.max_list
    }

    /// Octets in the dynamic table now.
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    fn lookup(&self, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
        match index {
            0 => Err(DecodeError::BadIndex(0)),
            i if i <= STATIC.len() => {
                let (n, v) = STATIC[i - 1];
                Ok((n.as_bytes(), v.as_bytes()))
            }
            i => self
                .table
                .get(i - STATIC.len() - 1)
                .ok_or(DecodeError::BadIndex(i)),
        }
    }

    /// Decodes one complete header block (HEADERS plus its CONTINUATIONs),
    /// calling `field` with every name and value in order.
    ///
    /// A block that decodes is decoded whole, so the table stays in step
    /// with the peer's even when the caller refuses the fields. One whose
    /// header list would pass the limit stops at the first field that
    /// would, before it is copied or given to `field`: the fields given
    /// never add up to more than the limit. Any error leaves the table
    /// unreliable; the connection must end (COMPRESSION_ERROR, or for
    /// [`DecodeError::HeaderListTooLarge`] whatever code the caller
    /// chooses).
    pub fn decode<F>(&mut self, block: &[u8], mut field: F) -> Result<(), DecodeError>
    where
        F: FnMut(&[u8], &[u8], Indexing),
    {
        let max_list = self.max_list;
        let too_large = DecodeError::HeaderListTooLarge(max_list);
        // Octets of the header list so far, never more than `max_list`.
        let mut list = 0usize;
        let mut at = 0;
        let mut fields_seen = false;
        while at < block.len() {
            let rest = &block[at..];
            let first = rest[0];
            if first & 0x80 != 0 {
                // Indexed field (§6.1).
                let (index, used) = decode_integer(rest, 7)?;
                let (name, value) = self.lookup(index)?;
                list += name.len() + value.len() + table::ENTRY_OVERHEAD;
                if list > max_list {
                    return Err(too_large);
                }
                field(name, value, Indexing::Indexed);
                at += used;
                fields_seen = true;
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3).
                if fields_seen {
                    return Err(DecodeError::SizeUpdateMisplaced);
                }
                let (size, used) = decode_integer(rest, 5)?;
                if size > self.limit {
                    return Err(DecodeError::SizeUpdateTooLarge(size));
                }
                self.table.set_max_size(size);
                at += used;
            } else {
                // Literal (§6.2): with incremental indexing (01), never
                // indexed (0001) or without indexing (0000).
                let (prefix, indexing) = if first & 0x40 != 0 {
                    (6, Indexing::Indexed)
                } else if first & 0x10 != 0 {
                    (4, Indexing::Never)
                } else {
                    (4, Indexing::NotIndexed)
                };
                let (index, mut used) = decode_integer(rest, prefix)?;
                // What the name and value may still take of the list.
                let room = (max_list - list)
                    .checked_sub(table::ENTRY_OVERHEAD)
                    .ok_or(too_large)?;
                let name: Cow<'_, [u8]> = if index == 0 {
                    let (name, n) = decode_string(&rest[used..], room, max_list)?;
                    used += n;
                    name
                } else {
                    let name = self.lookup(index)?.0;
                    if name.len() > room {
                        return Err(too_large);
                    }
                    // Copied: the insertion below may evict the entry.
                    Cow::Owned(name.to_vec())
                };
                let (value, n) = decode_string(&rest[used..], room - name.len(), max_list)?;
                used += n;
                list += name.len() + value.len() + table::ENTRY_OVERHEAD;
                field(&name, &value, indexing);
                if indexing == Indexing::Indexed {
                    self.table.insert(&name, &value);
                }
                at += used;
                fields_seen = true;
            }
        }
        Ok(())
    }
}

/// Appends an integer with a `prefix`-bit prefix; `flags` fills the bits
/// above the prefix in the first octet (§5.1).
fn encode_integer(out: &mut BytesMut, value: usize, prefix: u8, flags: u8) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        out.put_u8(flags | value as u8);
        return;
    }
    out.put_u8(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.put_u8((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.put_u8(rest as u8);
}

/// Appends a string literal (§5.2), with `huffman` Huffman-coded when that
/// is shorter.
fn encode_string(out: &mut BytesMut, s: &[u8], huffman: bool) {
    let coded = if huffman {
        huffman::encoded_len(s)
    } else {
        usize::MAX
    };
    if coded < s.len() {
        encode_integer(out, coded, 7, 0x80);
        let mut v = Vec::with_capacity(coded);
        huffman::encode(s, &mut v);
        out.put_slice(&v);
    } else {
        encode_integer(out, s.len(), 7, 0);
        out.put_slice(s);
    }
}

/// The sending side's HPACK state for one connection.
#[derive(Debug, Clone)]
pub struct Encoder {
    table: Dynamic,
    /// The most this encoder will use whatever the peer allows; 0 never
    /// indexes (no memory kept per connection).
    cap: usize,
    /// A size update owed at the start of the next block.
    pending_update: Option<usize>,
    /// Whether literals are Huffman-coded when that is shorter.
    huffman: bool,
}

impl Encoder {
    /// An encoder using a dynamic table of at most `cap` octets (and never
    /// more than the peer's SETTINGS_HEADER_TABLE_SIZE, 4,096 until it says).
    pub fn new(cap: usize) -> Self {
        let max = cap.min(crate::frame::DEFAULT_HEADER_TABLE_SIZE as usize);
        Self {
            table: Dynamic::new(max),
            cap,
            // A peer expects 4,096 until told; a smaller table is announced.
            pending_update: (max != crate::frame::DEFAULT_HEADER_TABLE_SIZE as usize)
                .then_some(max),
            huffman: true,
        }
    }

    /// Sends literals as they are: cheaper for both ends where bytes on the
    /// wire matter less than CPU (a local network, fields that are indexed
    /// after their first use).
    #[must_use]
    pub fn without_huffman(mut self) -> Self {
        self.huffman = false;
        self
    }

    /// Applies the peer's SETTINGS_HEADER_TABLE_SIZE.
    pub fn set_peer_limit(&mut self, peer: u32) {
        let max = self.cap.min(peer as usize);
        if max != self.table.max_size() {
            self.table.set_max_size(max);
            self.pending_update = Some(max);
        }
    }

    /// Encodes one header block of `fields` into `out`.
    pub fn encode<'a, I>(&mut self, fields: I, out: &mut BytesMut)
    where
        I: IntoIterator<Item = (&'a [u8], &'a [u8], Indexing)>,
    {
        if let Some(size) = self.pending_update.take() {
            encode_integer(out, size, 5, 0x20);
        }
        for (name, value, indexing) in fields {
            self.encode_field(name, value, indexing, out);
        }
    }

    fn encode_field(&mut self, name: &[u8], value: &[u8], indexing: Indexing, out: &mut BytesMut) {
        let (s_exact, s_name) = table::find_static(name, value);
        if let (Some(i), true) = (s_exact, indexing != Indexing::Never) {
            return encode_integer(out, i, 7, 0x80);
        }
        // The dynamic table is searched only when the static one has no
        // exact match.
        let (d_exact, d_name) = if self.table.is_empty() {
            (None, None)
        } else {
            self.table.find(name, value)
        };
        let dyn_index = |i: usize| i + STATIC.len() + 1;
        if let (Some(i), true) = (d_exact, indexing != Indexing::Never) {
            return encode_integer(out, dyn_index(i), 7, 0x80);
        }
        let name_index = s_name.or(d_name.map(dyn_index));
        let size = name.len() + value.len() + table::ENTRY_OVERHEAD;
        // Index what is likely to repeat and small enough not to flush the
        // table; never what the sender marked sensitive.
        let (prefix, flags) = match indexing {
            Indexing::Never => (4, 0x10),
            Indexing::Indexed if size <= self.table.max_size() / 2 => (6, 0x40),
            _ => (4, 0x00),
        };
        encode_integer(out, name_index.unwrap_or(0), prefix, flags);
        if name_index.is_none() {
            encode_string(out, name, self.huffman);
        }
        encode_string(out, value, self.huffman);
        if flags == 0x40 {
            self.table.insert(name, value);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
