//! The listener's path for a connection when an `ingress` is configured.
//!
//! TLS starts lazily: the ClientHello's SNI picks the configuration. A name
//! no ingress server claims, when the gateway has its own `tls`, gets exactly
//! the agent path (client certificate required at the handshake, HTTP/2,
//! [`crate::tunnel`]). Everything else is an ingress connection: the SNI
//! server's certificate and client-certificate settings
//! ([`crate::ingress::tls`]), ALPN `h2` and `http/1.1`, HTTP/1.1 (with
//! upgrades) or HTTP/2, each request to [`Ingress::handle`] — except
//! `/spinlink.v1.` paths no location claims, which go to the tunnel if the
//! connection carries a verified agent identity, and are refused
//! (`Unauthenticated`) if not.

use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use spinlink_tls::binding::connection_binding;
use spinlink_tls::identity::identity_from_cert;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::LazyConfigAcceptor;

use super::activity::{Activity, GuardedBody};
use super::send_timeout::SendTimed;
use super::{Connection, DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_KEEPALIVE_TIMEOUT, Prefixed};
use crate::ingress::tls::ClientVerify;
use crate::ingress::{ConnInfo, Ingress};
use crate::stats::Refusal;
use crate::tunnel::{self, ConnPeer, ControlSlot};

/// Largest request header block on ingress connections: browsers carry
/// cookies (nginx's `large_client_header_buffers` allows 4 × 8 KiB lines).
pub const INGRESS_MAX_HEADER_LIST_SIZE: u32 = 64 * 1024;

/// HTTP/2 streams a client without an agent's identity may have open at
/// once on an ingress connection: nginx's `http2_max_concurrent_streams`
/// default (the listener's `maxConcurrentStreams`, sized for agents, when
/// lower).
pub const INGRESS_MAX_CONCURRENT_STREAMS: u32 = 128;

/// What the gateway holds of one such stream's answer that the client has
/// not taken yet (hyper's default, which a verified agent keeps, is 400
/// KiB): with the stream bound, at most 8 MiB per connection for a client
/// that stops reading, until `send_timeout` ends it. nginx holds 8 × 4 KiB
/// (`proxy_buffers`) per request in memory.
const INGRESS_MAX_SEND_BUF: usize = 64 * 1024;

/// Path prefix of the agent tunnel's gRPC methods.
const TUNNEL_PREFIX: &str = "/spinlink.v1.";

impl Connection {
    pub(super) async fn serve_ingress(
        self,
        ingress: Arc<Ingress>,
        stream: Prefixed<TcpStream>,
        local_port: u16,
    ) {
        let remote = self.remote;
        if !ingress.is_tls() {
            let conn = ConnInfo::new(remote, local_port, None, None, ClientVerify::None, None);
            return self.serve_http(ingress, stream, conn, None).await;
        }
        // No ClientHello read ahead here: every handshake is a stranger's,
        // within its network's budget and the strangers' share.
        if let Err(reason) = self.settings.admit_handshake(remote.ip(), false).await {
            return self.refuse(reason, remote);
        }
        let agent_tls = self.tls.clone();
        let handshake = async {
            let start =
                LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
            let sni = start.client_hello().server_name().map(str::to_owned);
            let claimed = sni
                .as_deref()
                .and_then(|n| ingress.find_server(n))
                .is_some();
            if let (Some(agent), false) = (&agent_tls, claimed) {
                let config = agent.acceptor().config().clone();
                return Ok((start.into_stream(config).await?, sni, None));
            }
            let Some((i, tls)) = ingress.tls_for(sni.as_deref()) else {
                return Err(std::io::Error::other("no ingress server with certificates"));
            };
            Ok((start.into_stream(tls.config.clone()).await?, sni, Some(i)))
        };
        let (tls, sni, server) =
            match tokio::time::timeout(self.settings.handshake_timeout, handshake).await {
                Ok(Ok(done)) => done,
                Ok(Err(e)) => {
                    self.handshake_failed(remote);
                    tracing::info!(%remote, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    self.shared.stats.metrics().handshake(false);
                    return self.refuse(Refusal::HandshakeTimeout, remote);
                }
            };
        self.handshake_ok(remote);
        let Some(server) = server else {
            // Not an ingress name: today's agent connection.
            if let Some(life) = self.serve_agent(Box::new(tls), remote, None) {
                life.await;
            }
            return;
        };
        let (_, session) = tls.get_ref();
        let chain = session.peer_certificates().map(<[_]>::to_vec);
        let verify = ingress.verify(server, chain.as_deref());
        // A verified certificate that names an agent may use the tunnel.
        let identity = match (&verify, chain.as_deref().and_then(|c| c.first())) {
            (ClientVerify::Success, Some(leaf)) => {
                identity_from_cert(leaf, &self.sources).ok().flatten()
            }
            _ => None,
        };
        let peer = match identity {
            Some(identity) => match connection_binding(session) {
                Ok(binding) => Some(ConnPeer {
                    identity: Some(identity.into()),
                    binding,
                    remote,
                    control: ControlSlot::default(),
                }),
                Err(e) => {
                    tracing::warn!(%remote, error = %e, "no connection binding; no tunnel");
                    None
                }
            },
            None => None,
        };
        let conn = ConnInfo::new(
            remote,
            local_port,
            sni,
            Some(server),
            verify,
            chain.as_deref(),
        );
        self.serve_http(ingress, tls, conn, peer).await;
    }

    async fn serve_http<I>(
        self,
        ingress: Arc<Ingress>,
        io: I,
        conn: ConnInfo,
        peer: Option<ConnPeer>,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let remote = conn.remote;
        let io = SendTimed::new(io, ingress.send_timeout(), self.shared.stats.clone());
        let control = peer.as_ref().map(|p| p.control.clone());
        let conn = Arc::new(conn);
        let peer = peer.map(Arc::new);
        let shared = self.shared.clone();
        let tunnel_served = !shared.upstreams.is_empty();
        // Browsers and API clients get nginx's bounds; a verified agent the
        // listener's, sized for its many streams, and hyper's buffer.
        let stranger = peer.is_none();
        let activity = Activity::new();
        let streams = activity.clone();
        let service =
            hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let ingress = ingress.clone();
                let conn = conn.clone();
                let peer = peer.clone();
                let shared = shared.clone();
                let guard = streams.open();
                async move {
                    let to_tunnel = tunnel_served
                        && req.uri().path().starts_with(TUNNEL_PREFIX)
                        && !ingress.claims(&req, &conn);
                    let response = if !to_tunnel {
                        ingress.handle(req, &conn).await?
                    } else if let Some(peer) = &peer {
                        tunnel::handle(shared, peer, req).await
                    } else {
                        tunnel::status::unauthenticated(
                            "the agent tunnel needs a verified client certificate",
                        )
                    };
                    // The answer's body as it is, beside the guard: no
                    // second box around the one it has.
                    Ok::<_, crate::ingress::NoAnswer>(response.map(|body| GuardedBody {
                        inner: body,
                        _guard: guard,
                    }))
                }
            });
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.settings.handshake_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(DEFAULT_KEEPALIVE_INTERVAL)
            .keep_alive_timeout(DEFAULT_KEEPALIVE_TIMEOUT)
            .max_concurrent_streams(self.settings.max_concurrent_streams)
            .max_header_list_size(INGRESS_MAX_HEADER_LIST_SIZE);
        if stranger {
            builder
                .http2()
                .max_concurrent_streams(
                    self.settings
                        .max_concurrent_streams
                        .min(INGRESS_MAX_CONCURRENT_STREAMS),
                )
                .max_send_buf_size(INGRESS_MAX_SEND_BUF);
        }
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
        let mut conn = std::pin::pin!(conn);
        let result = tokio::select! {
            result = conn.as_mut() => Some(result),
            () = self.shutdown.cancelled() => {
                if let Some(control) = &control {
                    tunnel::send_reconnect(control, "draining", self.settings.drain_grace);
                }
                None
            }
            () = activity.idle(self.settings.idle_timeout) => {
                self.shared.stats.refuse(Refusal::Idle);
                None
            }
        };
        let result = match result {
            Some(result) => result,
            None => {
                conn.as_mut().graceful_shutdown();
                tokio::select! {
                    result = conn.as_mut() => result,
                    () = self.hard.cancelled() => Ok(()),
                }
            }
        };
        if let Err(e) = result {
            tracing::debug!(%remote, error = %e, "ingress connection ended");
        }
    }
}
