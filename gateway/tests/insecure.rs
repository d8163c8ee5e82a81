//! The insecure (h2c, development) listener and shutdown: identity comes from
//! the `spinlink-dev-identity` header, tokens still bind to the connection,
//! and `run` returns once shutdown is signalled.

mod common;

use common::*;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use tokio::net::TcpStream;
use tonic::Code;
use tonic::transport::Channel;

async fn h2c_channel(addr: std::net::SocketAddr) -> Channel {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    one_connection_channel(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap()
}

fn insecure_yaml(upstream: &str) -> String {
    format!(
        "insecure: true\nlisten: 127.0.0.1:0\nshutdownGraceSeconds: 1\n\
         policy: [{{identities: ['dev-agent'], accounts: ['dev-*']}}]\n\
         upstreams: [{{url: '{upstream}'}}]\n"
    )
}

fn dev_identity<T>(mut r: tonic::Request<T>) -> tonic::Request<T> {
    r.metadata_mut()
        .insert("spinlink-dev-identity", "dev-agent".parse().unwrap());
    r
}

#[tokio::test]
async fn insecure_listener_takes_identity_from_header() {
    let sidecar = FakeSidecar::plain().await;
    let gw = start_gateway(&insecure_yaml(&sidecar.url())).await;
    let channel = h2c_channel(gw.addr).await;
    let mut client = TunnelClient::new(channel.clone());

    // Without the header nobody is named.
    let err = client
        .hello(spinlink_proto::v1::HelloRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    let resp = client
        .hello(dev_identity(tonic::Request::new(
            spinlink_proto::v1::HelloRequest {
                agent_id: "dev".into(),
                accounts: vec![account("dev-1"), account("prod")],
                ..Default::default()
            },
        )))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.granted.len(), 1);
    let token = resp.granted[0].token.clone();

    let (_tx, mut down) = open_cache(&channel, |s| {
        dev_identity(with_metadata(s, "dev-1", &token))
    })
    .await
    .unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 1);
    let seen = sidecar.streams();
    assert_eq!(seen[0].headers["spinlink-verified-identity"], "dev-agent");
    assert!(seen[0].headers.get("spinlink-dev-identity").is_none());

    // Another connection: the token is worthless there too.
    let other = h2c_channel(gw.addr).await;
    let err = open_cache(&other, |s| dev_identity(with_metadata(s, "dev-1", &token)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn run_returns_after_shutdown_within_grace() {
    let sidecar = FakeSidecar::plain().await;
    let mut gw = start_gateway(&insecure_yaml(&sidecar.url())).await;
    let channel = h2c_channel(gw.addr).await;
    let token = {
        let mut client = TunnelClient::new(channel.clone());
        client
            .hello(dev_identity(tonic::Request::new(
                spinlink_proto::v1::HelloRequest {
                    accounts: vec![account("dev-1")],
                    ..Default::default()
                },
            )))
            .await
            .unwrap()
            .into_inner()
            .granted[0]
            .token
            .clone()
    };
    // A long-lived stream stays open across the shutdown signal.
    let (tx, mut down) = open_cache(&channel, |s| {
        dev_identity(with_metadata(s, "dev-1", &token))
    })
    .await
    .unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 1);

    gw.shutdown.cancel();
    let task = &mut gw.task;
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(tx);
    // The listener is gone: new connections are refused.
    assert!(TcpStream::connect(gw.addr).await.is_err());
}
