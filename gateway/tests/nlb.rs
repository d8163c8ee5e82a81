//! PROXY protocol on the agent listener behind a TCP load balancer, over
//! real sockets: v1 and v2 headers from a trusted address are read and the
//! TLS handshake follows; a header from an untrusted address, a missing one,
//! or one that never finishes is refused and counted.

mod common;

use common::*;
use spinlink_gateway::stats::Refusal;
use spinlink_gateway::stats::metrics::ClientResult;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn yaml(pki: &spinlink_tls::dev::DevPki, listener: &str) -> String {
    tls_gateway_yaml(
        pki,
        &format!("upstreams: [{{url: 'http://127.0.0.1:9'}}]\nlistener:\n{listener}"),
    )
}

/// A v2 PROXY header for a TCP/IPv4 client.
fn v2_header(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
    let mut h = spinlink_gateway::listener::proxy_protocol::V2_SIGNATURE.to_vec();
    h.push(0x21); // version 2, PROXY
    h.push(0x11); // AF_INET, STREAM
    h.extend_from_slice(&12u16.to_be_bytes());
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h
}

async fn hello_after(
    addr: std::net::SocketAddr,
    pki: &spinlink_tls::dev::DevPki,
    header: &[u8],
) -> anyhow::Result<()> {
    let mut tcp = TcpStream::connect(addr).await?;
    tcp.write_all(header).await?;
    let channel = agent_a1_over(tcp, pki).await?;
    hello(&channel, &["dev-1"]).await?;
    Ok(())
}

#[tokio::test]
async fn v1_and_v2_headers_from_a_trusted_proxy_are_read() {
    capture_logs();
    let pki = pki();
    let gw = start_gateway(&yaml(
        &pki.pki,
        "  proxyProtocol: true\n  trustedProxies: ['127.0.0.0/8']\n",
    ))
    .await;
    hello_after(
        gw.addr,
        &pki.pki,
        b"PROXY TCP4 203.0.113.7 10.0.0.1 51000 7443\r\n",
    )
    .await
    .unwrap();
    hello_after(
        gw.addr,
        &pki.pki,
        &v2_header([198, 51, 100, 9], 40000, [10, 0, 0, 1], 7443),
    )
    .await
    .unwrap();
    assert_eq!(gw.stats.snapshot().accounts_granted, 2);
    // The connection's own log lines name the client, not the balancer.
    for remote in ["remote=203.0.113.7:51000", "remote=198.51.100.9:40000"] {
        wait_log_line(&["agent connected", remote]).await;
        wait_log_line(&["tunnel::hello: hello ", remote]).await;
    }
    // So does the metric, cut to the client's network.
    let networks = &gw.stats.metrics().client_connections;
    assert_eq!(networks.get("203.0.113.0/24", ClientResult::Accepted), 1);
    assert_eq!(networks.get("198.51.100.0/24", ClientResult::Accepted), 1);
    assert_eq!(networks.get("127.0.0.0/24", ClientResult::Accepted), 0);
    let text = gw.stats.metrics().encode();
    assert!(
        text.contains(
            "spinlink_gateway_client_connections_total{client_network=\"203.0.113.0/24\",result=\"accepted\"} 1"
        ),
        "{text}"
    );
    // Required: a trusted address without a header is refused.
    let result = hello_after(gw.addr, &pki.pki, b"").await;
    assert!(result.is_err(), "no header accepted");
    wait_refusals(&gw.stats, Refusal::ProxyHeaderMissing, 1).await;
    assert_eq!(networks.get("127.0.0.0/24", ClientResult::Refused), 1);
}

#[tokio::test]
async fn header_from_an_untrusted_address_is_refused() {
    let pki = pki();
    let gw = start_gateway(&yaml(
        &pki.pki,
        "  proxyProtocol: true\n  proxyProtocolRequired: false\n  trustedProxies: ['10.0.0.0/8']\n",
    ))
    .await;
    // Direct clients are served when headers are not required...
    hello_after(gw.addr, &pki.pki, b"").await.unwrap();
    // ...but one claiming to be a proxy is not believed.
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    tcp.write_all(b"PROXY TCP4 203.0.113.7 10.0.0.1 51000 7443\r\n")
        .await
        .unwrap();
    assert!(closed_by_peer(&mut tcp).await);
    wait_refusals(&gw.stats, Refusal::UntrustedProxy, 1).await;
    assert_eq!(gw.stats.snapshot().accounts_granted, 1);
}

#[tokio::test]
async fn untrusted_source_is_refused_when_headers_are_required() {
    let pki = pki();
    let gw = start_gateway(&yaml(
        &pki.pki,
        "  proxyProtocol: true\n  trustedProxies: ['10.0.0.0/8']\n",
    ))
    .await;
    assert!(hello_after(gw.addr, &pki.pki, b"").await.is_err());
    wait_refusals(&gw.stats, Refusal::UntrustedSource, 1).await;
    assert_eq!(gw.stats.snapshot().accounts_granted, 0);
}

#[tokio::test]
async fn stalled_and_malformed_headers_are_refused() {
    let pki = pki();
    let gw = start_gateway(&yaml(
        &pki.pki,
        "  proxyProtocol: true\n  trustedProxies: ['127.0.0.1']\n  proxyHeaderTimeoutSeconds: 1\n",
    ))
    .await;
    let mut stalled = TcpStream::connect(gw.addr).await.unwrap();
    stalled.write_all(b"PROXY TCP4 203.0").await.unwrap();
    assert!(closed_by_peer(&mut stalled).await);
    wait_refusals(&gw.stats, Refusal::ProxyHeaderTimeout, 1).await;

    let mut bad = TcpStream::connect(gw.addr).await.unwrap();
    bad.write_all(b"PROXY TCP4 not-an-address 10.0.0.1 1 2\r\n")
        .await
        .unwrap();
    assert!(closed_by_peer(&mut bad).await);
    wait_refusals(&gw.stats, Refusal::ProxyHeaderInvalid, 1).await;
}
