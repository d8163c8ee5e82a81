//! `Assignments` streams through the gateway: carried to the sidecar with
//! the verified identity and agent id when the agent id is the one the
//! connection's `Hello` stated; refused before anything opens upstream when
//! it is another one, or when the connection has not said `Hello`. The
//! sidecar is told which accounts the identity may serve.

mod common;

use common::*;
use spinlink_proto::headers;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_proto::v1::{AssignmentsDown, AssignmentsOpen, AssignmentsUp, assignments_up};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Status, Streaming};

fn upstream_yaml(url: &str) -> String {
    format!(
        "upstreams: [{{url: '{url}'}}]\nupstreamPool: {{healthCheck: {{intervalSeconds: 0}}}}\n"
    )
}

/// Opens `Assignments` naming `agent_id` (header and `open`), the first
/// message sent at once as agents do.
async fn open_assignments(
    channel: &tonic::transport::Channel,
    agent_id: &str,
) -> Result<(mpsc::Sender<AssignmentsUp>, Streaming<AssignmentsDown>), Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(AssignmentsUp {
        msg: Some(assignments_up::Msg::Open(AssignmentsOpen {
            agent_id: agent_id.to_owned(),
            zone: "eu".into(),
        })),
    })
    .await
    .unwrap();
    let mut request = Request::new(ReceiverStream::new(rx));
    let md = request.metadata_mut();
    md.insert(headers::AGENT_ID, agent_id.parse().unwrap());
    md.insert(
        headers::VERIFIED_AGENT,
        "forged-by-the-agent".parse().unwrap(),
    );
    let mut client = TunnelClient::new(channel.clone());
    let down = client.assignments(request).await?;
    Ok((tx, down.into_inner()))
}

#[tokio::test]
async fn assignments_stream_is_carried_for_the_hello_agent_only() {
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let gw = start_gateway(&tls_gateway_yaml(&pki.pki, &upstream_yaml(&sidecar.url()))).await;
    let channel = agent_a1(gw.addr, &pki.pki).await;

    // No Hello on this connection yet: refused.
    let refused = open_assignments(&channel, "a1").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");

    // `hello` states agent id "a1".
    hello(&channel, &[]).await.unwrap();
    let refused = open_assignments(&channel, "someone-else")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("someone-else"), "{refused:?}");
    assert!(
        sidecar.streams().is_empty(),
        "a refused stream went upstream"
    );

    let (_tx, mut down) = open_assignments(&channel, "a1").await.unwrap();
    let first = tokio::time::timeout(WAIT, down.message())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_some(), "the sidecar's answer did not come back");
    let streams = sidecar.streams();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].method, "Assignments");
    let h = &streams[0].headers;
    let all = |name: &str| -> Vec<_> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(all(headers::VERIFIED_IDENTITY), [A1]);
    assert_eq!(all(headers::VERIFIED_AGENT), ["a1"]);
    // The accounts the policy lets this identity serve, for the sidecar to
    // assign no others.
    assert_eq!(all(headers::VERIFIED_ACCOUNTS), [r#"["dev-*","staging"]"#]);
    assert!(all(headers::VERIFIED_ACCOUNT).is_empty());
}

#[tokio::test]
async fn an_identity_the_policy_grants_nothing_gets_no_assignments() {
    let pki = pki();
    let sidecar = FakeSidecar::plain().await;
    let extra = upstream_yaml(&sidecar.url());
    // Only agents other than a1 may serve anything.
    let yaml = tls_gateway_yaml(&pki.pki, &extra).replace(
        "spiffe://spinlink.dev/agent/*",
        "spiffe://spinlink.dev/agent/other",
    );
    let gw = start_gateway(&yaml).await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    hello(&channel, &[]).await.unwrap();
    let refused = open_assignments(&channel, "a1").await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(sidecar.streams().is_empty());
}
