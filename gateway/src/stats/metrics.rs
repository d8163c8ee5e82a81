//! The gateway's Prometheus metrics ([`Metrics`]), registered once and
//! exported by the admin port in the text exposition format. Label values come
//! from closed sets ([`Refusal`], [`AuthFailure`], the configured upstream
//! URLs), never from what a peer sends, so the series count stays bounded;
//! the one label derived from a peer, the client's network, is capped
//! ([`ClientNetworks`]).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

pub use super::client_networks::{ClientNetworks, ClientResult};

/// Why a connection, handshake, `Hello` or stream was turned away before it
/// was served (label `reason` of `spinlink_gateway_refusals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// `listener.maxConnections` connections were already open.
    MaxConnections,
    /// The handshake token bucket (`listener.handshakesPerSecond`) was empty.
    HandshakeRate,
    /// The client's network (its /24 or /64) used up its own handshake
    /// budget (`listener.handshakesPerSecondPerSource`).
    HandshakeSourceRate,
    /// A PROXY header from an address outside `listener.trustedProxies`.
    UntrustedProxy,
    /// No PROXY header from outside `trustedProxies` while one is required.
    UntrustedSource,
    /// A trusted proxy sent no PROXY header although one is required.
    ProxyHeaderMissing,
    /// A PROXY header that does not parse.
    ProxyHeaderInvalid,
    /// The PROXY header did not arrive within its timeout.
    ProxyHeaderTimeout,
    /// The TLS handshake did not finish within `listener.handshakeTimeoutSeconds`.
    HandshakeTimeout,
    /// The identity called `Hello` faster than `listener.helloPerSecond`.
    HelloRate,
    /// A `Hello` request larger than `listener.maxHelloBytes`.
    HelloTooLarge,
    /// A `Hello` request that breaks a structural bound (too many accounts),
    /// or one of its accounts that is empty or offered twice.
    HelloInvalid,
    /// The identity already has `listener.maxStreamsPerIdentity` streams open.
    IdentityStreams,
    /// A stream past the connection's `listener.maxConcurrentStreams`
    /// (HTTP/2 `REFUSED_STREAM`).
    ConnectionStreams,
    /// A stream opened after the gateway's GOAWAY on that connection (drain
    /// or maximum age; HTTP/2 `REFUSED_STREAM`, the agent retries elsewhere).
    GoingAway,
    /// The account is served by another identity.
    AccountOwned,
    /// The policy does not let the identity serve the account.
    Policy,
    /// The connection was idle for `listener.idleTimeoutSeconds`.
    Idle,
    /// The connection broke the HTTP/2 protocol: not HTTP/2 at all (e.g.
    /// HTTP/1.1 on the HTTP/2 port), a bad preface or frame, or a peer that
    /// stopped answering keepalive PINGs.
    Protocol,
    /// The connection sent no HTTP/2 preface and SETTINGS within
    /// `listener.prefaceTimeoutSeconds` of its TLS handshake.
    PrefaceTimeout,
    /// A header block decoded past the 16 KiB header list limit (an HPACK
    /// bomb); the connection got GOAWAY `ENHANCE_YOUR_CALM`.
    HeaderListTooLarge,
    /// A WINDOW_UPDATE or SETTINGS_INITIAL_WINDOW_SIZE that took a send
    /// window past 2^31−1; the connection got GOAWAY `FLOW_CONTROL_ERROR`.
    WindowOverflow,
    /// The connection's misbehaviour budget ran out (resets, streams reset
    /// for its fault, frames that do no work; by kind in
    /// `spinlink_gateway_h2_glitches_total`): GOAWAY `ENHANCE_YOUR_CALM`.
    Glitches,
    /// The gateway's buffers were over `listener.maxBufferedBytes` and the
    /// connection held among the most: GOAWAY `ENHANCE_YOUR_CALM`.
    MemoryBudget,
    /// The identity cancelled more carried streams before their answer
    /// than `listener.cancelsPerSecond` allows: GOAWAY `ENHANCE_YOUR_CALM`.
    Cancels,
    /// An ingress client took nothing the gateway wrote for the ingress's
    /// `send_timeout`: the connection was closed.
    SendTimeout,
}

impl Refusal {
    /// Every reason, for tests and dashboards.
    pub const ALL: [Refusal; 26] = [
        Self::MaxConnections,
        Self::HandshakeRate,
        Self::HandshakeSourceRate,
        Self::UntrustedProxy,
        Self::UntrustedSource,
        Self::ProxyHeaderMissing,
        Self::ProxyHeaderInvalid,
        Self::ProxyHeaderTimeout,
        Self::HandshakeTimeout,
        Self::HelloRate,
        Self::HelloTooLarge,
        Self::HelloInvalid,
        Self::IdentityStreams,
        Self::ConnectionStreams,
        Self::GoingAway,
        Self::AccountOwned,
        Self::Policy,
        Self::Idle,
        Self::Protocol,
        Self::PrefaceTimeout,
        Self::HeaderListTooLarge,
        Self::WindowOverflow,
        Self::Glitches,
        Self::MemoryBudget,
        Self::Cancels,
        Self::SendTimeout,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxConnections => "max_connections",
            Self::HandshakeRate => "handshake_rate",
            Self::HandshakeSourceRate => "handshake_source_rate",
            Self::UntrustedProxy => "untrusted_proxy",
            Self::UntrustedSource => "untrusted_source",
            Self::ProxyHeaderMissing => "proxy_header_missing",
            Self::ProxyHeaderInvalid => "proxy_header_invalid",
            Self::ProxyHeaderTimeout => "proxy_header_timeout",
            Self::HandshakeTimeout => "handshake_timeout",
            Self::HelloRate => "hello_rate",
            Self::HelloTooLarge => "hello_too_large",
            Self::HelloInvalid => "hello_invalid",
            Self::IdentityStreams => "identity_streams",
            Self::ConnectionStreams => "connection_streams",
            Self::GoingAway => "going_away",
            Self::AccountOwned => "account_owned",
            Self::Policy => "policy",
            Self::Idle => "idle",
            Self::Protocol => "protocol",
            Self::PrefaceTimeout => "preface_timeout",
            Self::HeaderListTooLarge => "header_list_too_large",
            Self::WindowOverflow => "window_overflow",
            Self::Glitches => "glitches",
            Self::Cancels => "cancels",
            Self::SendTimeout => "send_timeout",
            Self::MemoryBudget => "memory_budget",
        }
    }
}

/// Why authentication failed (label `reason` of
/// `spinlink_gateway_auth_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthFailure {
    /// The TLS handshake failed: no, expired or foreign client certificate,
    /// or not TLS at all.
    Handshake,
    /// The verified certificate names no identity.
    NoIdentity,
    /// A stream without a `spinlink-token` (or `spinlink-account`) header.
    TokenMissing,
    /// A token that is not of this format (or of an unknown version), or a
    /// stream with more than one token or account header.
    TokenMalformed,
    /// A token whose MAC does not match this connection, identity and account.
    TokenMismatch,
    /// A token past its expiry.
    TokenExpired,
    /// A `Hello` on a connection without a client certificate whose
    /// bootstrap JWT is missing or invalid.
    BootstrapJwt,
}

impl AuthFailure {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Handshake => "handshake",
            Self::NoIdentity => "no_identity",
            Self::TokenMissing => "token_missing",
            Self::TokenMalformed => "token_malformed",
            Self::TokenMismatch => "token_mismatch",
            Self::TokenExpired => "token_expired",
            Self::BootstrapJwt => "bootstrap_jwt",
        }
    }
}

/// Label set `{reason=...}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason.
    pub reason: &'static str,
}

/// Label set `{kind=...}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct KindLabel {
    /// The kind.
    pub kind: &'static str,
}

/// Label set `{result="ok"|"failed"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `failed`.
    pub result: &'static str,
}

/// Label set `{upstream=URL}` (a configured upstream).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct UpstreamLabel {
    /// The upstream's configured URL.
    pub upstream: String,
}

/// Label set `{direction="up"|"down"}`: up is agent → sidecar.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DirectionLabel {
    /// `up` or `down`.
    pub direction: &'static str,
}

/// A gauge holding a float.
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric the gateway exports, with the registry that names them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// TCP connections accepted.
    pub connections: Counter,
    /// Agent connections open now.
    pub connections_open: Gauge,
    /// TLS handshakes by result.
    pub handshakes: Family<ResultLabel, Counter>,
    /// Of the successful handshakes, those that resumed a session from a
    /// ticket (cheap: no certificate exchange or verification).
    pub handshakes_resumed: Counter,
    /// Authentication failures by reason.
    pub auth_failures: Family<ReasonLabel, Counter>,
    /// Channel tokens issued by `Hello`.
    pub tokens_issued: Counter,
    /// Channel tokens issued by a `Hello` for an account the connection
    /// already held: the agent renewing before expiry. Also counted in
    /// `tokens_issued`.
    pub tokens_renewed: Counter,
    /// Refusals by reason.
    pub refusals: Family<ReasonLabel, Counter>,
    /// HTTP/2 misbehaviour charged to agent connections, by kind.
    pub glitches: Family<KindLabel, Counter>,
    /// Streams carried, per upstream.
    pub streams: Family<UpstreamLabel, Counter>,
    /// Streams open now, per upstream.
    pub streams_open: Family<UpstreamLabel, Gauge>,
    /// HTTP/2 connections open now, per upstream instance.
    pub upstream_connections: Family<UpstreamLabel, Gauge>,
    /// Accounts assigned now, per upstream instance (bounded-load routing).
    pub upstream_accounts: Family<UpstreamLabel, Gauge>,
    /// 1 while an upstream instance takes new streams (healthy, not ejected).
    pub upstream_available: Family<UpstreamLabel, Gauge>,
    /// Times an upstream instance was taken out of rotation (failed health
    /// checks or outlier ejection).
    pub upstream_ejections: Family<UpstreamLabel, Counter>,
    /// Upstream instances known now (static, DNS and EndpointSlice).
    pub upstream_instances: Gauge,
    /// Message bytes carried, by direction.
    pub bytes: Family<DirectionLabel, Counter>,
    /// 1 while the gateway drains.
    pub draining: Gauge,
    /// How long the last drain took.
    pub drain_duration: FloatGauge,
    /// Seconds until the serving certificate's notAfter, as of the last
    /// reload check.
    pub cert_expiry: FloatGauge,
    /// The serving certificate's notAfter, Unix seconds: never stale, for
    /// alerts of the form `certificate_not_after_seconds - time() < 7d`.
    pub cert_not_after: Gauge,
    /// Certificate reloads by result.
    pub cert_reloads: Family<ResultLabel, Counter>,
    /// Connections by the real client's network and result (bounded).
    pub client_connections: ClientNetworks,
    /// Bytes agent connections held at the last sweep (frames for their
    /// sockets, data behind windows; `listener.maxBufferedBytes`).
    pub buffered_bytes: Gauge,
    /// `listener.maxBufferedBytes`.
    pub buffer_budget_bytes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("spinlink_gateway");
        let m = Metrics {
            registry: Registry::default(),
            connections: Counter::default(),
            connections_open: Gauge::default(),
            handshakes: Family::default(),
            handshakes_resumed: Counter::default(),
            auth_failures: Family::default(),
            tokens_issued: Counter::default(),
            tokens_renewed: Counter::default(),
            refusals: Family::default(),
            glitches: Family::default(),
            streams: Family::default(),
            streams_open: Family::default(),
            upstream_connections: Family::default(),
            upstream_accounts: Family::default(),
            upstream_available: Family::default(),
            upstream_ejections: Family::default(),
            upstream_instances: Gauge::default(),
            bytes: Family::default(),
            draining: Gauge::default(),
            drain_duration: FloatGauge::default(),
            cert_expiry: FloatGauge::default(),
            cert_not_after: Gauge::default(),
            cert_reloads: Family::default(),
            client_connections: ClientNetworks::default(),
            buffered_bytes: Gauge::default(),
            buffer_budget_bytes: Gauge::default(),
        };
        // Metrics are handles onto shared cells: the clones registered here
        // are the same series the fields update.
        registry.register(
            "connections",
            "TCP connections accepted",
            m.connections.clone(),
        );
        registry.register(
            "connections_open",
            "Agent connections open",
            m.connections_open.clone(),
        );
        registry.register(
            "handshakes",
            "TLS handshakes by result",
            m.handshakes.clone(),
        );
        registry.register(
            "handshakes_resumed",
            "TLS handshakes that resumed a session from a ticket (also counted as ok)",
            m.handshakes_resumed.clone(),
        );
        registry.register(
            "auth_failures",
            "Authentication failures by reason",
            m.auth_failures.clone(),
        );
        registry.register(
            "tokens_issued",
            "Channel tokens issued",
            m.tokens_issued.clone(),
        );
        registry.register(
            "tokens_renewed",
            "Channel tokens issued for an account the connection already held",
            m.tokens_renewed.clone(),
        );
        registry.register(
            "refusals",
            "Connections, handshakes, Hellos and streams refused, by reason",
            m.refusals.clone(),
        );
        registry.register(
            "h2_glitches",
            "HTTP/2 frames and streams that did no work, charged to agent connections, by kind",
            m.glitches.clone(),
        );
        registry.register(
            "streams",
            "Streams carried, per upstream",
            m.streams.clone(),
        );
        registry.register(
            "streams_open",
            "Streams open, per upstream",
            m.streams_open.clone(),
        );
        registry.register(
            "upstream_connections",
            "HTTP/2 connections open, per upstream instance",
            m.upstream_connections.clone(),
        );
        registry.register(
            "upstream_accounts",
            "Accounts assigned, per upstream instance",
            m.upstream_accounts.clone(),
        );
        registry.register(
            "upstream_available",
            "1 while an upstream instance takes new streams",
            m.upstream_available.clone(),
        );
        registry.register(
            "upstream_ejections",
            "Upstream instances taken out of rotation",
            m.upstream_ejections.clone(),
        );
        registry.register(
            "upstream_instances",
            "Upstream instances known",
            m.upstream_instances.clone(),
        );
        registry.register_with_unit(
            "message",
            "Bytes carried between agents and sidecars, by direction",
            Unit::Bytes,
            m.bytes.clone(),
        );
        registry.register("draining", "1 while draining", m.draining.clone());
        registry.register_with_unit(
            "buffered",
            "What agent connections hold for their peers, at the last sweep",
            Unit::Bytes,
            m.buffered_bytes.clone(),
        );
        registry.register_with_unit(
            "buffer_budget",
            "listener.maxBufferedBytes: over it, the connections holding the most end",
            Unit::Bytes,
            m.buffer_budget_bytes.clone(),
        );
        registry.register_with_unit(
            "drain_duration",
            "Duration of the last drain",
            Unit::Seconds,
            m.drain_duration.clone(),
        );
        registry.register_with_unit(
            "certificate_expiry",
            "Time until the serving certificate's notAfter",
            Unit::Seconds,
            m.cert_expiry.clone(),
        );
        registry.register_with_unit(
            "certificate_not_after",
            "The serving certificate's notAfter as a Unix time",
            Unit::Seconds,
            m.cert_not_after.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Certificate reloads by result",
            m.cert_reloads.clone(),
        );
        registry.register(
            "client_connections",
            "Connections by the client's /24 or /64 after PROXY protocol, and result",
            m.client_connections.family(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// The metrics in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts a refusal.
    pub fn refuse(&self, reason: Refusal) {
        self.refusals
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts a glitch charged to an agent connection.
    pub fn glitch(&self, glitch: Glitch) {
        self.glitches
            .get_or_create(&KindLabel {
                kind: glitch.as_str(),
            })
            .inc();
    }

    /// Glitches counted of `glitch`'s kind.
    pub fn glitches(&self, glitch: Glitch) -> u64 {
        self.glitches
            .get(&KindLabel {
                kind: glitch.as_str(),
            })
            .map_or(0, |c| c.get())
    }

    /// Refusals counted for `reason`.
    pub fn refusals(&self, reason: Refusal) -> u64 {
        self.refusals
            .get(&ReasonLabel {
                reason: reason.as_str(),
            })
            .map_or(0, |c| c.get())
    }

    /// Counts an authentication failure.
    pub fn auth_failure(&self, reason: AuthFailure) {
        self.auth_failures
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Authentication failures counted for `reason`.
    pub fn auth_failures(&self, reason: AuthFailure) -> u64 {
        self.auth_failures
            .get(&ReasonLabel {
                reason: reason.as_str(),
            })
            .map_or(0, |c| c.get())
    }

    /// Counts a handshake.
    pub fn handshake(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.handshakes.get_or_create(&ResultLabel { result }).inc();
    }

    /// Counts message bytes, `up` (agent → sidecar) or down.
    pub fn carried(&self, up: bool, n: u64) {
        self.bytes_counter(up).inc_by(n);
    }

    /// The byte counter of one direction, to keep per stream rather than
    /// look up per frame.
    pub fn bytes_counter(&self, up: bool) -> Counter {
        let direction = if up { "up" } else { "down" };
        self.bytes
            .get_or_create(&DirectionLabel { direction })
            .clone()
    }
}

/// A frame that is legal but does no work, or a stream that ends before it
/// did any: each costs the peer a point of its connection's misbehaviour
/// budget (the model of HAProxy's `tune.h2.fe.glitches-threshold`). An
/// honest agent spends a few an hour; a flood of them (rapid reset,
/// MadeYouReset, empty DATA, PRIORITY, tiny WINDOW_UPDATE, SETTINGS or PING
/// floods) spends the budget in a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Glitch {
    /// The peer's RST_STREAM (rapid reset, CVE-2023-44487).
    PeerReset,
    /// A stream this side reset for the peer's fault (MadeYouReset,
    /// CVE-2025-8671: a WINDOW_UPDATE of 0, DATA past the window or after
    /// END_STREAM).
    StreamError,
    /// DATA with no payload and no END_STREAM.
    EmptyData,
    /// PRIORITY (deprecated by RFC 9113; ignored here).
    Priority,
    /// A WINDOW_UPDATE of less than `TINY_WINDOW_UPDATE` octets.
    TinyWindowUpdate,
    /// A SETTINGS frame (not its acknowledgement).
    Settings,
    /// A PING (not its acknowledgement).
    Ping,
    /// A frame of a type this side does not know.
    UnknownFrame,
}

impl Glitch {
    /// Every kind, for tests and dashboards.
    pub const ALL: [Glitch; 8] = [
        Self::PeerReset,
        Self::StreamError,
        Self::EmptyData,
        Self::Priority,
        Self::TinyWindowUpdate,
        Self::Settings,
        Self::Ping,
        Self::UnknownFrame,
    ];

    /// The label value (`kind` of `spinlink_gateway_h2_glitches_total`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PeerReset => "peer_reset",
            Self::StreamError => "stream_error",
            Self::EmptyData => "empty_data",
            Self::Priority => "priority",
            Self::TinyWindowUpdate => "tiny_window_update",
            Self::Settings => "settings",
            Self::Ping => "ping",
            Self::UnknownFrame => "unknown_frame",
        }
    }
}
