//! Fair admission of TLS handshakes, over real sockets behind PROXY
//! protocol: a flood of connects from one client network is held to that
//! network's budget while agents elsewhere get in; agents that come back
//! with a session ticket resume (same identity, no certificate exchange)
//! and are admitted from the share strangers cannot use; a ticket one
//! gateway issued opens at another serving the same material.

mod common;

use std::sync::Arc;

use common::*;
use rustls::client::{ClientSessionMemoryCache, Resumption};
use spinlink_gateway::stats::Refusal;
use spinlink_tls::config::{ALPN_H2, ClientFiles, client_config};
use spinlink_tls::dev::DevPki;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::Channel;

fn yaml(pki: &DevPki, listener: &str) -> String {
    tls_gateway_yaml(
        pki,
        &format!(
            "upstreams: [{{url: 'http://127.0.0.1:9'}}]\nlistener:\n  proxyProtocol: true\n  \
             trustedProxies: ['127.0.0.0/8']\n{listener}"
        ),
    )
}

/// A PROXY v1 header naming `client` as the connection's source.
fn proxy_header(client: &str) -> Vec<u8> {
    format!("PROXY TCP4 {client} 10.0.0.1 51000 7443\r\n").into_bytes()
}

/// Agent a1's TLS client, keeping its sessions across connections as the
/// agent does.
fn agent_a1_config(pki: &DevPki) -> Arc<rustls::ClientConfig> {
    let (ca, cert, key) = (pki.ca_cert(), pki.cert("agent-a1"), pki.key("agent-a1"));
    let mut config = client_config(
        ClientFiles {
            ca: &ca,
            identity: Some((&cert, &key)),
        },
        &[ALPN_H2],
    )
    .unwrap();
    config.resumption = Resumption::store(Arc::new(ClientSessionMemoryCache::new(8)));
    Arc::new(config)
}

/// One connection from `client` (after its PROXY header) with `config`.
async fn dial(
    addr: std::net::SocketAddr,
    client: &str,
    config: &Arc<rustls::ClientConfig>,
) -> anyhow::Result<Channel> {
    let mut tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    tcp.write_all(&proxy_header(client)).await?;
    let tls = TlsConnector::from(config.clone())
        .connect("localhost".try_into()?, tcp)
        .await?;
    one_connection_channel(hyper_util::rt::TokioIo::new(tls)).await
}

/// Connects from `client` and says `Hello` for dev-1: the identity must be
/// a1's, resumed or not.
async fn hello_from(
    addr: std::net::SocketAddr,
    client: &str,
    config: &Arc<rustls::ClientConfig>,
) -> anyhow::Result<Channel> {
    let channel = dial(addr, client, config).await?;
    let granted = hello(&channel, &["dev-1"]).await?.granted;
    anyhow::ensure!(granted.len() == 1, "dev-1 not granted");
    Ok(channel)
}

/// Connects from `client`, sends a ClientHello-sized nothing and leaves:
/// what a flood of unauthenticated connects costs the gateway.
async fn junk_connect(addr: std::net::SocketAddr, client: &str) {
    if let Ok(mut tcp) = TcpStream::connect(addr).await {
        let mut bytes = proxy_header(client);
        bytes.extend_from_slice(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00]);
        let _ = tcp.write_all(&bytes).await;
    }
}

fn resumed(gw: &RunningGateway) -> u64 {
    gw.stats.metrics().handshakes_resumed.get()
}

/// Issue 19: 1,000 connects from one address used to take the one global
/// bucket (and its queue) and refuse the agents of other networks. Now
/// that address gets its network's budget and no more.
#[tokio::test]
async fn a_flood_from_one_network_leaves_other_agents_their_handshakes() {
    let pki = pki();
    // Default admission; the 27 agents share one identity here, whose
    // `Hello` budget would otherwise be the limit.
    let gw = start_gateway(&yaml(&pki.pki, "  helloBurst: 100\n")).await;
    for i in 0..1000 {
        junk_connect(gw.addr, &format!("198.51.100.{}", i % 250 + 1)).await;
    }
    // Past the network's burst, the flood is refused at once, not queued.
    wait_refusals(&gw.stats, Refusal::HandshakeSourceRate, 900).await;
    let config = agent_a1_config(&pki.pki);
    for i in 0..27 {
        hello_from(gw.addr, &format!("203.0.{i}.7"), &config)
            .await
            .unwrap_or_else(|e| panic!("agent {i}: {e:#}"));
    }
    assert_eq!(gw.stats.metrics().refusals(Refusal::HandshakeRate), 0);
}

/// An agent that proved its identity comes back with a session ticket: its
/// handshake resumes (same identity, so `Hello` is granted), and it is
/// admitted from the reserved share after strangers used up theirs.
#[tokio::test]
async fn returning_agents_resume_and_are_admitted_before_strangers() {
    let pki = pki();
    // Four handshakes and no refill: two for strangers, two reserved.
    let gw = start_gateway(&yaml(
        &pki.pki,
        "  handshakesPerSecond: 0.001\n  handshakeBurst: 4\n  handshakeQueueSeconds: 0\n  \
         handshakeReservedPercent: 50\n",
    ))
    .await;
    let config = agent_a1_config(&pki.pki);
    // First time: a stranger, full handshake.
    let first = hello_from(gw.addr, "203.0.113.7", &config).await.unwrap();
    assert_eq!(resumed(&gw), 0);
    drop(first);
    // Strangers from elsewhere take the rest of their share...
    let stranger = agent_a1_config(&pki.pki);
    hello_from(gw.addr, "198.51.100.1", &stranger)
        .await
        .unwrap();
    assert!(
        hello_from(gw.addr, "198.51.100.2", &agent_a1_config(&pki.pki))
            .await
            .is_err(),
        "a third stranger admitted"
    );
    wait_refusals(&gw.stats, Refusal::HandshakeRate, 1).await;
    // ...and the returning agent still gets in, resumed, as itself.
    hello_from(gw.addr, "203.0.113.7", &config).await.unwrap();
    assert_eq!(resumed(&gw), 1);
    // So does the other agent that was once admitted.
    hello_from(gw.addr, "198.51.100.1", &stranger)
        .await
        .unwrap();
    assert_eq!(resumed(&gw), 2);
}

/// A ticket is worth the same at every gateway serving the same TLS
/// material: an agent cut by one gateway's restart resumes at the next.
#[tokio::test]
async fn a_ticket_from_one_gateway_resumes_at_another() {
    let pki = pki();
    let one = start_gateway(&yaml(&pki.pki, "")).await;
    let two = start_gateway(&yaml(&pki.pki, "")).await;
    let config = agent_a1_config(&pki.pki);
    hello_from(one.addr, "203.0.113.7", &config).await.unwrap();
    hello_from(two.addr, "203.0.113.7", &config).await.unwrap();
    assert_eq!((resumed(&one), resumed(&two)), (0, 1));
}

/// A resumed session carries the certificate its ticket was issued for,
/// unchecked by TLS: one that expired since must not get back in.
#[tokio::test]
async fn a_ticket_does_not_outlive_its_certificate() {
    use spinlink_tls::dev::{DevCa, Leaf, dev_agent_identity};
    let pki = pki();
    let gw = start_gateway(&yaml(&pki.pki, "")).await;
    let ca = DevCa::load(pki.dir.path()).unwrap();
    let short = ca
        .issue(
            &Leaf::client("agent-a1")
                .with_uri(&dev_agent_identity("a1"))
                .with_validity(std::time::Duration::from_secs(3)),
        )
        .unwrap();
    let (cert, key) = short.write(pki.dir.path(), "short-a1").unwrap();
    let ca_cert = pki.pki.ca_cert();
    let mut config = client_config(
        ClientFiles {
            ca: &ca_cert,
            identity: Some((&cert, &key)),
        },
        &[ALPN_H2],
    )
    .unwrap();
    config.resumption = Resumption::store(Arc::new(ClientSessionMemoryCache::new(8)));
    let config = Arc::new(config);
    hello_from(gw.addr, "203.0.113.7", &config).await.unwrap();
    // While it is valid, the agent resumes.
    hello_from(gw.addr, "203.0.113.7", &config).await.unwrap();
    assert_eq!(resumed(&gw), 1);
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert!(
        hello_from(gw.addr, "203.0.113.7", &config).await.is_err(),
        "an expired certificate resumed its session"
    );
    assert_eq!(resumed(&gw), 1);
}
