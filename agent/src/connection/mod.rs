//! The connection to the gateway and what is bound to it: [`connect`] makes the
//! one TLS connection ([`connector`]), [`session::Session`] says `Hello` on it
//! and keeps the channel tokens it was granted. TLS sessions outlive the
//! connection ([`sessions`]): a reconnect resumes, which the gateway admits
//! first in a storm.

pub mod connector;
pub mod session;
pub mod sessions;

use std::time::Duration;

use rustls::pki_types::ServerName;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_tls::config::{ALPN_H2, ClientFiles, client_config_with_key_password};
use tonic::transport::{Channel, Endpoint};

use crate::config::GatewayConfig;
use crate::{Error, Result};
use connector::Connector;

/// How long dialling (TCP + TLS) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Dials the gateway: one TCP connection (TCP_NODELAY), TLS with the agent's
/// client certificate and ALPN h2 (or h2c when `insecure`), HTTP/2 keepalive
/// on (`gateway.keepaliveIntervalSeconds`, `keepaliveTimeoutSeconds`). The returned client carries every RPC over that one connection and
/// never dials another: once it breaks, every call fails and the caller
/// starts over (tokens are bound to the connection).
pub async fn connect(gateway: &GatewayConfig) -> Result<TunnelClient<Channel>> {
    connect_with_sessions(gateway, None).await
}

/// As [`connect`], keeping TLS sessions in `sessions` instead of the
/// process's store for these files ([`sessions::store`]); for simulations
/// that run many agents in one process, each with its own.
pub async fn connect_with_sessions(
    gateway: &GatewayConfig,
    store: Option<std::sync::Arc<dyn rustls::client::ClientSessionStore>>,
) -> Result<TunnelClient<Channel>> {
    let url_error = |message: String| Error::GatewayUrl {
        url: gateway.url.clone(),
        message,
    };
    let uri: http::Uri = gateway.url.parse().map_err(|e| url_error(format!("{e}")))?;
    let host = uri
        .host()
        .ok_or_else(|| url_error("no host".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let connector = match (uri.scheme_str(), gateway.insecure) {
        (Some("https"), _) => {
            let ca = gateway
                .ca_file
                .as_deref()
                .ok_or_else(|| url_error("https needs gateway.caFile".into()))?;
            let identity = match (&gateway.cert_file, &gateway.key_file) {
                (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
                _ => None,
            };
            let password = gateway.key_password.as_ref().map(|p| p.0.as_str());
            let tls = sessions::client_config(ca, identity, store, || {
                client_config_with_key_password(ClientFiles { ca, identity }, password, &[ALPN_H2])
            })?;
            let name = gateway.server_name.clone().unwrap_or(host);
            let server_name = ServerName::try_from(name)
                .map_err(|e| url_error(format!("TLS server name: {e}")))?;
            Connector::tls(std::sync::Arc::new(tls), server_name)
        }
        (Some("http"), true) => Connector::plaintext(),
        (Some("http"), false) => {
            return Err(url_error("plaintext needs gateway.insecure: true".into()));
        }
        _ => return Err(url_error("scheme must be https".into())),
    };
    let endpoint = Endpoint::from(uri)
        .connect_timeout(DEFAULT_CONNECT_TIMEOUT)
        .http2_keep_alive_interval(Duration::from_secs(gateway.keepalive_interval_seconds))
        .keep_alive_timeout(Duration::from_secs(gateway.keepalive_timeout_seconds))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    let channel = endpoint
        .connect_with_connector(connector)
        .await
        .map_err(Error::Connect)?;
    Ok(TunnelClient::new(channel))
}

/// Puts the stream metadata (account, token) on a stream request.
pub fn stream_request<T>(message: T, account: &str, token: &str) -> Result<tonic::Request<T>> {
    let mut request = tonic::Request::new(message);
    let metadata_error = || Error::Metadata {
        account: account.to_owned(),
    };
    let account_value = account.parse().map_err(|_| metadata_error())?;
    let token_value = token.parse().map_err(|_| metadata_error())?;
    let md = request.metadata_mut();
    md.insert(spinlink_proto::headers::ACCOUNT, account_value);
    md.insert(spinlink_proto::headers::TOKEN, token_value);
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_request_carries_account_and_token() {
        let req = stream_request((), "dev", "tok-123").unwrap();
        let md = req.metadata();
        assert_eq!(md.get(spinlink_proto::headers::ACCOUNT).unwrap(), "dev");
        assert_eq!(md.get(spinlink_proto::headers::TOKEN).unwrap(), "tok-123");
        assert!(stream_request((), "dev", "bad\ntoken").is_err());
    }

    #[tokio::test]
    async fn plaintext_without_insecure_is_refused() {
        let gw = GatewayConfig {
            url: "http://127.0.0.1:1".into(),
            ..GatewayConfig::default()
        };
        let err = connect(&gw).await.unwrap_err().to_string();
        assert!(err.contains("insecure"), "{err}");
    }
}
