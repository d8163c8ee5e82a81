//! HTTP/2 on the wire: the frames of RFC 9113 ([`frame`]) and the HPACK header
//! compression of RFC 7541 ([`hpack`]), as the gateway's stream relay reads and
//! writes them. Nothing here does I/O or keeps connection state beyond HPACK's
//! tables; the gateway's `relay` module drives connections with it.
//!
//! Everything that parses takes untrusted bytes: it never panics, bounds what it
//! allocates, and names the RFC's error code for what it refuses. The fuzz
//! bodies in [`fuzz`] (run in the suite, and by cargo-fuzz in `http2/fuzz`)
//! and the proptests here hold it to that.
//!
//! Start at [`frame::Head::parse`] and [`frame::Frame::parse`], then
//! [`hpack::Decoder::decode`].

#![forbid(unsafe_code)]

pub mod frame;
pub mod fuzz;
pub mod hpack;

pub use frame::{Frame, FrameError, Head, Reason, Settings};
