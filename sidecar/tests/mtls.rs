//! The tunnel in its production mode: mTLS with a required client
//! certificate. The development gateway certificate gets in; a client without
//! a certificate does not.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::*;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_sidecar::{Config, Sidecar};
use spinlink_tls::config::{ALPN_H2, ClientFiles, client_config};
use spinlink_tls::dev::DevPki;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

async fn tls_channel(
    addr: SocketAddr,
    pki: &DevPki,
    with_cert: bool,
) -> anyhow::Result<TunnelClient<Channel>> {
    let (cert, key) = (pki.cert("gateway"), pki.key("gateway"));
    let config = client_config(
        ClientFiles {
            ca: &pki.ca_cert(),
            identity: with_cert.then_some((cert.as_path(), key.as_path())),
        },
        &[ALPN_H2],
    )?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await?;
    Ok(TunnelClient::new(channel))
}

#[tokio::test]
async fn gateway_certificate_required() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = DevPki::ensure(dir.path(), &[])?;
    let yaml = format!(
        "tunnel:\n  listen: 127.0.0.1:0\n  tls: {{ certFile: {}, keyFile: {}, clientCaFile: {} }}\nfacade: {{ listen: 127.0.0.1:0 }}\nstore: {{ url: sqlite://{} }}\n",
        pki.cert("sidecar").display(),
        pki.key("sidecar").display(),
        pki.ca_cert().display(),
        dir.path().join("s.db").display(),
    );
    let sidecar = Sidecar::bind(Config::from_yaml_str(&yaml, "mtls.yaml")?).await?;
    let (tunnel, accounts) = (sidecar.tunnel_addr(), sidecar.accounts());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sidecar.run(shutdown.clone()));

    let mut gateway = tls_channel(tunnel, &pki, true).await?;
    let mut cache = CacheStream::open(&mut gateway, "prod").await?;
    cache.wait_acked().await?;
    assert!(accounts.status("prod").is_some_and(|s| s.online));

    // Without a client certificate the handshake is refused.
    let refused = async {
        let mut anonymous = tls_channel(tunnel, &pki, false).await?;
        CacheStream::open(&mut anonymous, "other").await
    }
    .await;
    assert!(refused.is_err());
    assert!(accounts.status("other").is_none());

    drop(cache);
    shutdown.cancel();
    task.await??;
    assert!(dir.path().join("s.db").exists());
    Ok(())
}
