//! The relay: the gateway's own HTTP/2, built for carrying agent streams to
//! sidecars at the frame level.
//!
//! Every HTTP/2 connection — agent-facing ([`server`]) or sidecar-facing
//! ([`client`]) — is one task driving a [`conn::Conn`], and one [`link::Link`]
//! through which anything it sends is encoded, in order, under flow control.
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
pub mod client;
pub mod conn;
pub mod link;
pub mod server;
