//! HTTP/2 frames (RFC 9113 §4 and §6): the 9-byte [`Head`], each type's
//! payload checked into a [`Frame`] that borrows from the read buffer, and
//! writers that append frames to an output buffer.
//!
//! A frame that breaks the RFC is refused with the error code and scope the
//! RFC names ([`FrameError`]): a connection error ends the connection with
//! GOAWAY, a stream error resets one stream.

use bytes::{BufMut, BytesMut};

/// What a client sends first on every HTTP/2 connection (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of a frame header.
pub const HEAD_LEN: usize = 9;
/// `SETTINGS_MAX_FRAME_SIZE` until the peer says otherwise, and its least
/// allowed value.
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 16_384;
/// The largest `SETTINGS_MAX_FRAME_SIZE` allowed.
pub const MAX_MAX_FRAME_SIZE: u32 = 16_777_215;
/// Every flow-control window starts here until SETTINGS say otherwise.
pub const DEFAULT_WINDOW: u32 = 65_535;
/// The largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: u32 = 0x7fff_ffff;
/// `SETTINGS_HEADER_TABLE_SIZE` until the peer says otherwise.
pub const DEFAULT_HEADER_TABLE_SIZE: u32 = 4_096;

/// Frame type codes.
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0x0;
    /// HEADERS.
    pub const HEADERS: u8 = 0x1;
    /// PRIORITY (deprecated; parsed and ignored).
    pub const PRIORITY: u8 = 0x2;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 0x4;
    /// PUSH_PROMISE.
    pub const PUSH_PROMISE: u8 = 0x5;
    /// PING.
    pub const PING: u8 = 0x6;
    /// GOAWAY.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    /// DATA, HEADERS: the sender's last frame on the stream.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: an acknowledgement.
    pub const ACK: u8 = 0x1;
    /// HEADERS, CONTINUATION: the header block is complete.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS: padding follows a pad-length octet.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: a priority block precedes the header block fragment.
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS parameter identifiers (RFC 9113 §6.5.2).
pub mod setting {
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    /// SETTINGS_ENABLE_PUSH.
    pub const ENABLE_PUSH: u16 = 0x2;
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// SETTINGS_MAX_FRAME_SIZE.
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// An HTTP/2 error code (RFC 9113 §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reason(pub u32);

impl Reason {
    /// Graceful shutdown, or a stream that is simply done.
    pub const NO_ERROR: Reason = Reason(0x0);
    /// The peer broke the protocol.
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    /// Something failed on this side.
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    /// The peer broke flow control.
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    /// SETTINGS were not acknowledged in time.
    pub const SETTINGS_TIMEOUT: Reason = Reason(0x4);
    /// A frame arrived on a half-closed stream.
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    /// A frame had the wrong size.
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    /// The stream was refused before any processing; safe to retry.
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    /// The stream is no longer wanted.
    pub const CANCEL: Reason = Reason(0x8);
    /// HPACK state cannot be kept.
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    /// A CONNECT tunnel failed.
    pub const CONNECT_ERROR: Reason = Reason(0xa);
    /// The peer is generating excessive load.
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
    /// The transport's security is not enough.
    pub const INADEQUATE_SECURITY: Reason = Reason(0xc);
    /// Use HTTP/1.1 instead.
    pub const HTTP_1_1_REQUIRED: Reason = Reason(0xd);

    /// The RFC's name for the code, for logs.
    pub fn name(self) -> &'static str {
        match self.0 {
            0x0 => "NO_ERROR",
            0x1 => "PROTOCOL_ERROR",
            0x2 => "INTERNAL_ERROR",
            0x3 => "FLOW_CONTROL_ERROR",
            0x4 => "SETTINGS_TIMEOUT",
            0x5 => "STREAM_CLOSED",
            0x6 => "FRAME_SIZE_ERROR",
            0x7 => "REFUSED_STREAM",
            0x8 => "CANCEL",
            0x9 => "COMPRESSION_ERROR",
            0xa => "CONNECT_ERROR",
            0xb => "ENHANCE_YOUR_CALM",
            0xc => "INADEQUATE_SECURITY",
            0xd => "HTTP_1_1_REQUIRED",
            _ => "UNKNOWN",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:#x})", self.name(), self.0)
    }
}

/// A frame the RFC says must be refused, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Ends the connection (GOAWAY with this code).
    #[error("connection error {0}: {1}")]
    Connection(Reason, &'static str),
    /// Ends one stream (RST_STREAM with this code).
    #[error("stream {0} error {1}: {2}")]
    Stream(u32, Reason, &'static str),
}

/// A frame header (RFC 9113 §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Payload length.
    pub len: usize,
    /// Frame type ([`kind`]).
    pub kind: u8,
    /// Flags ([`flag`]).
    pub flags: u8,
    /// Stream identifier (the reserved bit cleared).
    pub stream: u32,
}

impl Head {
    /// Reads a header from the first [`HEAD_LEN`] bytes of `b`; `None` if `b`
    /// is shorter.
    pub fn parse(b: &[u8]) -> Option<Head> {
        let b: &[u8; HEAD_LEN] = b.get(..HEAD_LEN)?.try_into().ok()?;
        Some(Head {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & MAX_WINDOW,
        })
    }

    /// Appends the header to `out`. `len` must fit in 24 bits.
    pub fn write(self, out: &mut BytesMut) {
        out.put_slice(&self.to_bytes());
    }

    /// The header's nine bytes. `len` must fit in 24 bits.
    pub fn to_bytes(self) -> [u8; HEAD_LEN] {
        debug_assert!(self.len <= MAX_MAX_FRAME_SIZE as usize);
        let len = (self.len as u32).to_be_bytes();
        let stream = (self.stream & MAX_WINDOW).to_be_bytes();
        [
            len[1], len[2], len[3], self.kind, self.flags, stream[0], stream[1], stream[2],
            stream[3],
        ]
    }

    fn has(self, f: u8) -> bool {
        self.flags & f != 0
    }
}

/// The parameters of a SETTINGS frame; `None` for those it does not name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub header_table_size: Option<u32>,
    /// SETTINGS_ENABLE_PUSH.
    pub enable_push: Option<bool>,
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: Option<u32>,
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub initial_window_size: Option<u32>,
    /// SETTINGS_MAX_FRAME_SIZE.
    pub max_frame_size: Option<u32>,
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub max_header_list_size: Option<u32>,
}

impl Settings {
    fn parse(payload: &[u8]) -> Result<Settings, FrameError> {
        let mut s = Settings::default();
        for p in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([p[0], p[1]]);
            let v = u32::from_be_bytes([p[2], p[3], p[4], p[5]]);
            match id {
                setting::HEADER_TABLE_SIZE => s.header_table_size = Some(v),
                setting::ENABLE_PUSH => match v {
                    0 | 1 => s.enable_push = Some(v == 1),
                    _ => {
                        return Err(conn(
                            Reason::PROTOCOL_ERROR,
                            "SETTINGS_ENABLE_PUSH not 0 or 1",
                        ));
                    }
                },
                setting::MAX_CONCURRENT_STREAMS => s.max_concurrent_streams = Some(v),
                setting::INITIAL_WINDOW_SIZE => {
                    if v > MAX_WINDOW {
                        return Err(conn(
                            Reason::FLOW_CONTROL_ERROR,
                            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                        ));
                    }
                    s.initial_window_size = Some(v);
                }
                setting::MAX_FRAME_SIZE => {
                    if !(DEFAULT_MAX_FRAME_SIZE..=MAX_MAX_FRAME_SIZE).contains(&v) {
                        return Err(conn(
                            Reason::PROTOCOL_ERROR,
                            "SETTINGS_MAX_FRAME_SIZE out of range",
                        ));
                    }
                    s.max_frame_size = Some(v);
                }
                setting::MAX_HEADER_LIST_SIZE => s.max_header_list_size = Some(v),
                // Unknown settings must be ignored (§6.5.2).
                _ => {}
            }
        }
        Ok(s)
    }

    /// Appends a SETTINGS frame carrying the parameters that are set.
    pub fn write(&self, out: &mut BytesMut) {
        let params = [
            (setting::HEADER_TABLE_SIZE, self.header_table_size),
            (setting::ENABLE_PUSH, self.enable_push.map(u32::from)),
            (setting::MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
            (setting::INITIAL_WINDOW_SIZE, self.initial_window_size),
            (setting::MAX_FRAME_SIZE, self.max_frame_size),
            (setting::MAX_HEADER_LIST_SIZE, self.max_header_list_size),
        ];
        let n = params.iter().filter(|(_, v)| v.is_some()).count();
        Head {
            len: n * 6,
            kind: kind::SETTINGS,
            flags: 0,
            stream: 0,
        }
        .write(out);
        for (id, v) in params {
            if let Some(v) = v {
                out.put_u16(id);
                out.put_u32(v);
            }
        }
    }
}

/// One frame, checked, borrowing its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// DATA; `data` without padding, `flow_len` the whole payload, which is
    /// what flow control counts.
    Data {
        /// Stream.
        stream: u32,
        /// END_STREAM.
        end_stream: bool,
        /// The data, padding removed.
        data: &'a [u8],
        /// Bytes this frame takes from the flow-control windows.
        flow_len: u32,
    },
    /// HEADERS; `block` is the header block fragment.
    Headers {
        /// Stream.
        stream: u32,
        /// END_STREAM.
        end_stream: bool,
        /// END_HEADERS: no CONTINUATION follows.
        end_headers: bool,
        /// The fragment, padding and priority removed.
        block: &'a [u8],
    },
    /// PRIORITY (ignored, as RFC 9113 allows).
    Priority,
    /// RST_STREAM.
    Reset {
        /// Stream.
        stream: u32,
        /// Why.
        reason: Reason,
    },
    /// SETTINGS (not an acknowledgement).
    Settings(Settings),
    /// SETTINGS with ACK.
    SettingsAck,
    /// PING.
    Ping {
        /// Whether this answers our PING.
        ack: bool,
        /// Opaque data, echoed in the answer.
        data: [u8; 8],
    },
    /// GOAWAY.
    GoAway {
        /// The last stream the sender may have processed.
        last_stream: u32,
        /// Why.
        reason: Reason,
        /// Diagnostic data.
        debug: &'a [u8],
    },
    /// WINDOW_UPDATE (0 is the connection).
    WindowUpdate {
        /// Stream, or 0.
        stream: u32,
        /// Added to the window; never 0.
        increment: u32,
    },
    /// CONTINUATION.
    Continuation {
        /// Stream.
        stream: u32,
        /// END_HEADERS.
        end_headers: bool,
        /// The next fragment of the header block.
        block: &'a [u8],
    },
    /// A frame type this endpoint does not know: ignored (§4.1).
    Unknown,
}

fn conn(reason: Reason, why: &'static str) -> FrameError {
    FrameError::Connection(reason, why)
}

/// Strips padding from a PADDED frame's payload.
fn unpad(head: Head, payload: &[u8]) -> Result<&[u8], FrameError> {
    if !head.has(flag::PADDED) {
        return Ok(payload);
    }
    let Some((&pad, rest)) = payload.split_first() else {
        return Err(conn(
            Reason::FRAME_SIZE_ERROR,
            "padded frame without pad length",
        ));
    };
    let pad = usize::from(pad);
    if pad > rest.len() {
        return Err(conn(
            Reason::PROTOCOL_ERROR,
            "padding longer than the payload",
        ));
    }
    Ok(&rest[..rest.len() - pad])
}

impl<'a> Frame<'a> {
    /// Checks `payload` (exactly `head.len` bytes) as a frame of `head`'s
    /// type. A PUSH_PROMISE is refused: the gateway's server side never
    /// accepts one from a client and its client side disables push.
    pub fn parse(head: Head, payload: &'a [u8]) -> Result<Frame<'a>, FrameError> {
        debug_assert_eq!(head.len, payload.len());
        let stream = head.stream;
        let need_stream = |what: &'static str| {
            if stream == 0 {
                Err(conn(Reason::PROTOCOL_ERROR, what))
            } else {
                Ok(())
            }
        };
        let no_stream = |what: &'static str| {
            if stream != 0 {
                Err(conn(Reason::PROTOCOL_ERROR, what))
            } else {
                Ok(())
            }
        };
        match head.kind {
            kind::DATA => {
                need_stream("DATA on stream 0")?;
                let data = unpad(head, payload)?;
                Ok(Frame::Data {
                    stream,
                    end_stream: head.has(flag::END_STREAM),
                    data,
                    flow_len: payload.len() as u32,
                })
            }
            kind::HEADERS => {
                need_stream("HEADERS on stream 0")?;
                let mut block = unpad(head, payload)?;
                if head.has(flag::PRIORITY) {
                    let Some((prio, rest)) = block.split_first_chunk::<5>() else {
                        return Err(conn(Reason::FRAME_SIZE_ERROR, "HEADERS priority truncated"));
                    };
                    let dep = u32::from_be_bytes([prio[0], prio[1], prio[2], prio[3]]) & MAX_WINDOW;
                    if dep == stream {
                        return Err(FrameError::Stream(
                            stream,
                            Reason::PROTOCOL_ERROR,
                            "stream depends on itself",
                        ));
                    }
                    block = rest;
                }
                Ok(Frame::Headers {
                    stream,
                    end_stream: head.has(flag::END_STREAM),
                    end_headers: head.has(flag::END_HEADERS),
                    block,
                })
            }
            kind::PRIORITY => {
                need_stream("PRIORITY on stream 0")?;
                if payload.len() != 5 {
                    return Err(FrameError::Stream(
                        stream,
                        Reason::FRAME_SIZE_ERROR,
                        "PRIORITY not 5 bytes",
                    ));
                }
                let dep = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & MAX_WINDOW;
                if dep == stream {
                    return Err(FrameError::Stream(
                        stream,
                        Reason::PROTOCOL_ERROR,
                        "stream depends on itself",
                    ));
                }
                Ok(Frame::Priority)
            }
            kind::RST_STREAM => {
                need_stream("RST_STREAM on stream 0")?;
                let Ok(code) = <[u8; 4]>::try_from(payload) else {
                    return Err(conn(Reason::FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes"));
                };
                Ok(Frame::Reset {
                    stream,
                    reason: Reason(u32::from_be_bytes(code)),
                })
            }
            kind::SETTINGS => {
                no_stream("SETTINGS on a stream")?;
                if head.has(flag::ACK) {
                    if !payload.is_empty() {
                        return Err(conn(
                            Reason::FRAME_SIZE_ERROR,
                            "SETTINGS ACK with a payload",
                        ));
                    }
                    return Ok(Frame::SettingsAck);
                }
                if !payload.len().is_multiple_of(6) {
                    return Err(conn(
                        Reason::FRAME_SIZE_ERROR,
                        "SETTINGS not a multiple of 6",
                    ));
                }
                Settings::parse(payload).map(Frame::Settings)
            }
            kind::PUSH_PROMISE => Err(conn(Reason::PROTOCOL_ERROR, "PUSH_PROMISE not accepted")),
            kind::PING => {
                no_stream("PING on a stream")?;
                let Ok(data) = <[u8; 8]>::try_from(payload) else {
                    return Err(conn(Reason::FRAME_SIZE_ERROR, "PING not 8 bytes"));
                };
                Ok(Frame::Ping {
                    ack: head.has(flag::ACK),
                    data,
                })
            }
            kind::GOAWAY => {
                no_stream("GOAWAY on a stream")?;
                let Some((fixed, debug)) = payload.split_first_chunk::<8>() else {
                    return Err(conn(
                        Reason::FRAME_SIZE_ERROR,
                        "GOAWAY shorter than 8 bytes",
                    ));
                };
                Ok(Frame::GoAway {
                    last_stream: u32::from_be_bytes([fixed[0], fixed[1], fixed[2], fixed[3]])
                        & MAX_WINDOW,
                    reason: Reason(u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]])),
                    debug,
                })
            }
            kind::WINDOW_UPDATE => {
                let Ok(inc) = <[u8; 4]>::try_from(payload) else {
                    return Err(conn(Reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes"));
                };
                let increment = u32::from_be_bytes(inc) & MAX_WINDOW;
                if increment == 0 {
                    return Err(if stream == 0 {
                        conn(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
                    } else {
                        FrameError::Stream(stream, Reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
                    });
                }
                Ok(Frame::WindowUpdate { stream, increment })
            }
            kind::CONTINUATION => {
                need_stream("CONTINUATION on stream 0")?;
                Ok(Frame::Continuation {
                    stream,
                    end_headers: head.has(flag::END_HEADERS),
                    block: payload,
                })
            }
            _ => Ok(Frame::Unknown),
        }
    }
}

/// Appends a DATA frame. `data` must fit the peer's maximum frame size.
pub fn write_data(out: &mut BytesMut, stream: u32, data: &[u8], end_stream: bool) {
    Head {
        len: data.len(),
        kind: kind::DATA,
        flags: if end_stream { flag::END_STREAM } else { 0 },
        stream,
    }
    .write(out);
    out.put_slice(data);
}

/// Appends a header block as HEADERS and as many CONTINUATION frames as
/// `max_frame` requires.
pub fn write_headers(
    out: &mut BytesMut,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let max_frame = max_frame.max(DEFAULT_MAX_FRAME_SIZE as usize);
    let mut chunks = block.chunks(max_frame);
    let first = chunks.next().unwrap_or(&[]);
    let more = block.len() > first.len();
    let mut flags = if end_stream { flag::END_STREAM } else { 0 };
    if !more {
        flags |= flag::END_HEADERS;
    }
    Head {
        len: first.len(),
        kind: kind::HEADERS,
        flags,
        stream,
    }
    .write(out);
    out.put_slice(first);
    let mut rest = chunks.peekable();
    while let Some(chunk) = rest.next() {
        Head {
            len: chunk.len(),
            kind: kind::CONTINUATION,
            flags: if rest.peek().is_none() {
                flag::END_HEADERS
            } else {
                0
            },
            stream,
        }
        .write(out);
        out.put_slice(chunk);
    }
}

/// Appends an empty SETTINGS frame with ACK.
pub fn write_settings_ack(out: &mut BytesMut) {
    Head {
        len: 0,
        kind: kind::SETTINGS,
        flags: flag::ACK,
        stream: 0,
    }
    .write(out);
}

/// Appends a PING.
pub fn write_ping(out: &mut BytesMut, ack: bool, data: [u8; 8]) {
    Head {
        len: 8,
        kind: kind::PING,
        flags: if ack { flag::ACK } else { 0 },
        stream: 0,
    }
    .write(out);
    out.put_slice(&data);
}

/// Appends a WINDOW_UPDATE (`stream` 0 for the connection). `increment` must
/// be in 1..=2^31-1.
pub fn write_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    debug_assert!(increment > 0 && increment <= MAX_WINDOW);
    Head {
        len: 4,
        kind: kind::WINDOW_UPDATE,
        flags: 0,
        stream,
    }
    .write(out);
    out.put_u32(increment & MAX_WINDOW);
}

/// Appends an RST_STREAM.
pub fn write_reset(out: &mut BytesMut, stream: u32, reason: Reason) {
    Head {
        len: 4,
        kind: kind::RST_STREAM,
        flags: 0,
        stream,
    }
    .write(out);
    out.put_u32(reason.0);
}

/// Appends a GOAWAY.
pub fn write_goaway(out: &mut BytesMut, last_stream: u32, reason: Reason, debug: &[u8]) {
    Head {
        len: 8 + debug.len(),
        kind: kind::GOAWAY,
        flags: 0,
        stream: 0,
    }
    .write(out);
    out.put_u32(last_stream & MAX_WINDOW);
    out.put_u32(reason.0);
    out.put_slice(debug);
}

#[cfg(test)]
mod tests;
