//! The PROXY protocol (v1 text and v2 binary) a TCP load balancer puts before
//! the client's bytes to name the client's address. [`parse`] is a pure
//! function over the bytes read so far: it says whether more are needed, that
//! the stream does not start with a PROXY header at all, or what the header
//! says and how many bytes it took. v2 TLVs are skipped; the `LOCAL` command
//! (load balancer health checks) is accepted and names no client.
//!
//! Reference: <https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt>

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The v1 signature.
pub const V1_SIGNATURE: &[u8] = b"PROXY ";
/// The v2 signature.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Longest v1 header, CRLF included (from the specification).
pub const V1_MAX_LEN: usize = 107;
/// Longest v2 header accepted (16-byte fixed part plus addresses and TLVs).
/// The specification allows 64 KiB; load balancers send far less, and a bound
/// keeps the read buffer small.
pub const V2_MAX_LEN: usize = 16 + 2048;
const V2_FIXED_LEN: usize = 16;

/// What a PROXY header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHeader {
    /// v2 `LOCAL`: the proxy's own connection (a health check); the socket
    /// address stands.
    Local,
    /// The proxy does not know or say the client (`UNKNOWN`, `AF_UNSPEC`,
    /// `AF_UNIX`); the socket address stands.
    Unknown,
    /// A proxied TCP or UDP connection.
    Proxied {
        /// The client.
        source: SocketAddr,
        /// The address the client connected to.
        destination: SocketAddr,
    },
}

/// The state of parsing after the bytes read so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse {
    /// Could still be a header: read more.
    Incomplete,
    /// The bytes do not start with a PROXY signature.
    NotProxy,
    /// A complete header of `len` bytes.
    Done {
        /// The header.
        header: ProxyHeader,
        /// Bytes it took; what follows belongs to the client.
        len: usize,
    },
}

/// Why a header is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Longer than the bound for its version.
    #[error("PROXY header too long")]
    TooLong,
    /// A v1 line that is not `PROXY <proto> <src> <dst> <sport> <dport>`.
    #[error("malformed PROXY v1 header: {0}")]
    V1(&'static str),
    /// A v2 version nibble other than 2.
    #[error("unsupported PROXY v2 version {0}")]
    V2Version(u8),
    /// A v2 command other than LOCAL or PROXY.
    #[error("unsupported PROXY v2 command {0}")]
    V2Command(u8),
    /// A v2 address family or protocol this parser does not know.
    #[error("unsupported PROXY v2 family/protocol 0x{0:02x}")]
    V2Family(u8),
    /// A v2 address block shorter than its family needs.
    #[error("PROXY v2 address block too short")]
    V2Short,
}

/// Parses the start of a connection's bytes.
pub fn parse(buf: &[u8]) -> Result<Parse, Error> {
    if buf.is_empty() {
        return Ok(Parse::Incomplete);
    }
    if could_start(buf, V1_SIGNATURE) {
        if buf.len() < V1_SIGNATURE.len() {
            return Ok(Parse::Incomplete);
        }
        return parse_v1(buf);
    }
    if could_start(buf, &V2_SIGNATURE) {
        if buf.len() < V2_FIXED_LEN {
            return Ok(Parse::Incomplete);
        }
        return parse_v2(buf);
    }
    Ok(Parse::NotProxy)
}

/// Whether `buf` agrees with `sig` as far as both go.
fn could_start(buf: &[u8], sig: &[u8]) -> bool {
    let n = buf.len().min(sig.len());
    n > 0 && buf[..n] == sig[..n]
}

fn parse_v1(buf: &[u8]) -> Result<Parse, Error> {
    let window = &buf[..buf.len().min(V1_MAX_LEN)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= V1_MAX_LEN {
            return Err(Error::TooLong);
        }
        if window.contains(&b'\n') {
            return Err(Error::V1("bare LF"));
        }
        return Ok(Parse::Incomplete);
    };
    let line = std::str::from_utf8(&window[..end]).map_err(|_| Error::V1("not ASCII"))?;
    let len = end + 2;
    let mut fields = line.split(' ');
    // The signature ends with the first space, so the first field is "PROXY".
    let _ = fields.next();
    let header = match fields.next() {
        Some("UNKNOWN") => ProxyHeader::Unknown,
        Some(proto @ ("TCP4" | "TCP6")) => {
            let mut next = || fields.next().ok_or(Error::V1("missing field"));
            let (src, dst, sport, dport) = (next()?, next()?, next()?, next()?);
            if fields.next().is_some() {
                return Err(Error::V1("extra field"));
            }
            let (src, dst) = if proto == "TCP4" {
                (
                    IpAddr::V4(src.parse::<Ipv4Addr>().map_err(|_| Error::V1("bad IPv4"))?),
                    IpAddr::V4(dst.parse::<Ipv4Addr>().map_err(|_| Error::V1("bad IPv4"))?),
                )
            } else {
                (
                    IpAddr::V6(src.parse::<Ipv6Addr>().map_err(|_| Error::V1("bad IPv6"))?),
                    IpAddr::V6(dst.parse::<Ipv6Addr>().map_err(|_| Error::V1("bad IPv6"))?),
                )
            };
            ProxyHeader::Proxied {
                source: SocketAddr::new(src, port(sport)?),
                destination: SocketAddr::new(dst, port(dport)?),
            }
        }
        _ => return Err(Error::V1("unknown protocol")),
    };
    Ok(Parse::Done { header, len })
}

/// A decimal port: digits only (no sign), no leading zero, at most 65535.
fn port(s: &str) -> Result<u16, Error> {
    let digits_only = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits_only || (s.len() > 1 && s.starts_with('0')) {
        return Err(Error::V1("bad port"));
    }
    s.parse().map_err(|_| Error::V1("bad port"))
}

fn parse_v2(buf: &[u8]) -> Result<Parse, Error> {
    let ver_cmd = buf[12];
    let (version, command) = (ver_cmd >> 4, ver_cmd & 0x0f);
    if version != 2 {
        return Err(Error::V2Version(version));
    }
    let family = buf[13];
    let body_len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let len = V2_FIXED_LEN + body_len;
    if len > V2_MAX_LEN {
        return Err(Error::TooLong);
    }
    if buf.len() < len {
        return Ok(Parse::Incomplete);
    }
    let body = &buf[V2_FIXED_LEN..len];
    let header = match command {
        0x0 => ProxyHeader::Local,
        0x1 => match family {
            // TCP or UDP over IPv4.
            0x11 | 0x12 => {
                let a = body.get(..12).ok_or(Error::V2Short)?;
                let ip = |i: usize| IpAddr::V4(Ipv4Addr::new(a[i], a[i + 1], a[i + 2], a[i + 3]));
                ProxyHeader::Proxied {
                    source: SocketAddr::new(ip(0), u16::from_be_bytes([a[8], a[9]])),
                    destination: SocketAddr::new(ip(4), u16::from_be_bytes([a[10], a[11]])),
                }
            }
            // TCP or UDP over IPv6.
            0x21 | 0x22 => {
                let a = body.get(..36).ok_or(Error::V2Short)?;
                let ip = |i: usize| {
                    let mut o = [0u8; 16];
                    o.copy_from_slice(&a[i..i + 16]);
                    IpAddr::V6(Ipv6Addr::from(o))
                };
                ProxyHeader::Proxied {
                    source: SocketAddr::new(ip(0), u16::from_be_bytes([a[32], a[33]])),
                    destination: SocketAddr::new(ip(16), u16::from_be_bytes([a[34], a[35]])),
                }
            }
            // AF_UNSPEC, or AF_UNIX stream/datagram: no IP client to name.
            0x00 | 0x31 | 0x32 => ProxyHeader::Unknown,
            other => return Err(Error::V2Family(other)),
        },
        other => return Err(Error::V2Command(other)),
    };
    Ok(Parse::Done { header, len })
}

#[cfg(test)]
mod tests;
