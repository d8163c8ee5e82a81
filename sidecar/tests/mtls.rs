//! The tunnel in its production mode: mTLS with a required client
//! certificate that names one of `tunnel.tls.gatewayIdentities`. The
//! development gateway certificate gets in; a client without a certificate
//! does not, nor does an agent's certificate from the same CA, whatever
//! `spinlink-verified-*` headers it sends.

mod common;

use anyhow::Context as _;
use common::*;
use spinlink_proto::headers;
use spinlink_proto::v1::{AssignmentsOpen, AssignmentsUp, assignments_up, relay_down};
use spinlink_tls::dev::{DevPki, dev_agent_identity};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const NOT_GATEWAY: &str = r#"spinlink_sidecar_tunnel_refused_total{reason="not_gateway"}"#;

#[tokio::test]
async fn gateway_certificate_required() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = DevPki::ensure(dir.path(), &[])?;
    let sidecar = start_tls(&pki, dir.path()).await?;

    let mut gateway = tls_client(sidecar.tunnel, &pki, Some("gateway")).await?;
    let mut cache = CacheStream::open(&mut gateway, "prod").await?;
    cache.wait_acked().await?;
    assert!(sidecar.accounts.status("prod").is_some_and(|s| s.online));

    // Without a client certificate the handshake is refused.
    let refused = async {
        let mut anonymous = tls_client(sidecar.tunnel, &pki, None).await?;
        CacheStream::open(&mut anonymous, "other").await
    }
    .await;
    assert!(refused.is_err());
    assert!(sidecar.accounts.status("other").is_none());
    assert_eq!(metric(&sidecar, NOT_GATEWAY).await?, 0.0);

    drop(cache);
    sidecar.stop().await?;
    assert!(dir.path().join("s.db").exists());
    Ok(())
}

#[tokio::test]
async fn an_agent_certificate_of_the_same_ca_is_refused_and_counted() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = DevPki::ensure(dir.path(), &["a1"])?;
    let sidecar = start_tls(&pki, dir.path()).await?;

    // Straight at the tunnel port with the agent's own certificate: it
    // chains to the client CA, so the handshake completes, but no stream
    // gets further — not even to make up an account of its own.
    let mut agent = tls_client(sidecar.tunnel, &pki, Some("agent-a1")).await?;
    let refused = CacheStream::open_as(
        &mut agent,
        "evil-account",
        &dev_agent_identity("a1"),
        1,
        &[],
    )
    .await
    .err()
    .expect("a cache stream over an agent's certificate was served");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("tunnel.tls.gatewayIdentities"),
        "{refused:?}"
    );
    assert!(sidecar.accounts.status("evil-account").is_none());
    assert!(
        sidecar.accounts.list().is_empty(),
        "{:?}",
        sidecar.accounts.list()
    );
    assert_eq!(metric(&sidecar, NOT_GATEWAY).await?, 1.0);
    sidecar.stop().await
}

#[tokio::test]
async fn forged_verified_headers_over_an_agent_certificate_change_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = DevPki::ensure(dir.path(), &["a1", "attacker"])?;
    let sidecar = start_tls(&pki, dir.path()).await?;

    // The real agent's streams, carried by the gateway.
    let mut gateway = tls_client(sidecar.tunnel, &pki, Some("gateway")).await?;
    let mut cache = CacheStream::open(&mut gateway, "dev").await?;
    cache.wait_acked().await?;
    let mut relay = RelayStream::open(&mut gateway, "dev").await?;
    wait_status(&sidecar, "dev", |s| s.online && s.relay).await?;

    // Another agent's certificate, headers claiming the real agent's
    // identity and account: its relay, cache and assignments streams are
    // all refused before they are read.
    let mut attacker = tls_client(sidecar.tunnel, &pki, Some("agent-attacker")).await?;
    let relay_refused = RelayStream::open_as(&mut attacker, "dev", IDENTITY)
        .await
        .err()
        .expect("a forged relay stream was served");
    assert_eq!(relay_refused.code(), tonic::Code::PermissionDenied);
    let cache_refused = CacheStream::open_as(&mut attacker, "dev", IDENTITY, 1, &[])
        .await
        .err()
        .expect("a forged cache stream was served");
    assert_eq!(cache_refused.code(), tonic::Code::PermissionDenied);
    let (up, rx) = mpsc::channel(1);
    up.send(AssignmentsUp {
        msg: Some(assignments_up::Msg::Open(AssignmentsOpen {
            agent_id: "a1".into(),
            zone: String::new(),
        })),
    })
    .await?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let md = request.metadata_mut();
    md.insert(headers::VERIFIED_IDENTITY, IDENTITY.parse()?);
    md.insert(headers::VERIFIED_AGENT, "a1".parse()?);
    md.insert(headers::VERIFIED_ACCOUNTS, r#"["*"]"#.parse()?);
    let assignments_refused = attacker
        .assignments(request)
        .await
        .expect_err("forged assignments were served");
    assert_eq!(assignments_refused.code(), tonic::Code::PermissionDenied);
    assert_eq!(metric(&sidecar, NOT_GATEWAY).await?, 3.0);

    // The account is as the real agent left it, and its relay is the real
    // agent's: a relayed request reaches it.
    let status = sidecar.accounts.status("dev").expect("dev");
    assert_eq!(
        (status.agent_identity.as_str(), status.cache_streams),
        (IDENTITY, 1)
    );
    let http = http();
    let log = spawn_request(
        &http,
        "GET",
        &sidecar.url("/accounts/dev/api/v1/namespaces/demo/pods/p/log"),
        &[],
        "",
    );
    let relay_down::Msg::Head(req) = relay.next().await? else {
        anyhow::bail!("the real agent's relay got no request head");
    };
    assert_eq!(req.path, "/api/v1/namespaces/demo/pods/p/log");
    drop(relay);
    // Its stream gone, the request fails as any whose agent went away.
    assert_eq!(log.await??.status, 503);
    drop(up);
    drop(cache);
    sidecar.stop().await
}

/// The certificate the tunnel serves to a gateway's handshake now.
async fn served_certificate(
    addr: std::net::SocketAddr,
    pki: &DevPki,
) -> anyhow::Result<rustls::pki_types::CertificateDer<'static>> {
    use spinlink_tls::config::{ALPN_H2, ClientFiles, client_config};
    let config = client_config(
        ClientFiles {
            ca: &pki.ca_cert(),
            identity: Some((&pki.cert("gateway"), &pki.key("gateway"))),
        },
        &[ALPN_H2],
    )?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect("localhost".try_into()?, tcp)
        .await?;
    let certs = tls.get_ref().1.peer_certificates().unwrap_or_default();
    Ok(certs
        .first()
        .cloned()
        .context("no certificate")?
        .into_owned())
}

/// Certificate rotation without a restart: a renewed tunnel certificate
/// written over the old one (as cert-manager rewrites a mounted Secret) is
/// what the next handshakes get, within the reload interval, and the
/// expiry gauge follows it.
#[tokio::test]
async fn a_renewed_tunnel_certificate_is_served_without_a_restart() -> anyhow::Result<()> {
    use spinlink_tls::dev::{DevCa, Leaf};
    let dir = tempfile::tempdir()?;
    let pki = DevPki::ensure(dir.path(), &[])?;
    let sidecar = start_tls(&pki, dir.path()).await?;
    let before = served_certificate(sidecar.tunnel, &pki).await?;

    let renewed = DevCa::load(dir.path())?.issue(
        &Leaf::server("spinlink-sidecar")
            .with_dns("localhost")
            .with_uri(&spinlink_tls::dev::dev_sidecar_identity()),
    )?;
    renewed.write(dir.path(), "sidecar")?;
    let want = spinlink_tls::pem::load_certs(&pki.cert("sidecar"))?.remove(0);
    assert_ne!(before, want);
    let deadline = tokio::time::Instant::now()
        + spinlink_sidecar::tls_reload::RELOAD_INTERVAL
        + std::time::Duration::from_secs(10);
    loop {
        let served = served_certificate(sidecar.tunnel, &pki).await?;
        if served == want {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still the old certificate"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // The gateway's streams go on over the new certificate.
    let mut gateway = tls_client(sidecar.tunnel, &pki, Some("gateway")).await?;
    let mut cache = CacheStream::open(&mut gateway, "prod").await?;
    cache.wait_acked().await?;
    drop(cache);
    sidecar.stop().await?;
    Ok(())
}
