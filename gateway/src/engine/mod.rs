//! The engine: the gateway's own HTTP/2, built for carrying agent streams to
//! sidecars at the frame level. It knows connections and streams, not what
//! they carry: the agent-facing side ([`crate::tunnel::server`]) and the
//! sidecar-facing side ([`crate::upstream::client`]) plug in as a
//! [`conn::Role`], and the engine names neither.
//!
//! Every HTTP/2 connection is one task driving a [`conn::Conn`], and one
//! [`link::Link`] through which anything it sends is encoded, in order,
//! under flow control.
//! A carried stream is two halves, one on each connection, each knowing the
//! other's link and id ([`link::Route`]): a task reading a DATA frame from
//! its socket writes it straight into the other connection's link, within
//! the windows that peer granted, and wakes that connection's task to write
//! it out. There is no task, channel or buffer per stream, and no copy of a
//! message beyond the one into the outgoing buffer; an idle connection holds
//! neither a read nor a write buffer.
//!
//! Flow control is per stream end to end: a DATA frame that does not fit the
//! receiving peer's window waits in its stream's queue at the other link,
//! and the sending side does not grant its own peer that window again until
//! the data has left ([`link::Sink::credit`]). So a stalled account holds at
//! most one stream window in the gateway, and the others go on.
//!
//! [`bridge`] connects a stream to in-process `http` code: the gateway's own
//! gRPC answers (`Hello`) and the requests it makes itself (health checks,
//! tunnel streams of ingress connections). The wire format is
//! `spinlink-http2`'s.

pub mod bridge;
pub mod budget;
pub mod conn;
pub mod link;
pub mod messages;

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// A map keyed by stream id.
pub type StreamMap<V> = HashMap<u32, V, StreamIds>;

/// Hashing for stream ids: one multiply instead of SipHash, keyed per map
/// at random so a peer choosing its stream ids cannot choose collisions.
#[derive(Debug, Clone, Copy)]
pub struct StreamIds {
    key: u64,
}

impl Default for StreamIds {
    fn default() -> Self {
        Self {
            key: rand::random(),
        }
    }
}

impl BuildHasher for StreamIds {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher(self.key)
    }
}

/// See [`StreamIds`].
#[derive(Debug, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        // The high bits carry the multiply's mixing; hashbrown uses both ends.
        self.0 ^ (self.0 >> 29)
    }
}
