//! `Assignments` streams on a real sidecar: an account posted to the
//! accounts API reaches the first agent of its zone (its kubeconfig opened
//! from the store's seal), not another agent of the zone nor one of another
//! zone, nor an account the gateway says the agent's identity may not
//! serve; `Synced` follows what was assigned when the stream opened; `DELETE`
//! withdraws it; a stream whose `open` names another agent than the one the
//! gateway verified is refused.

mod common;

use std::time::Duration;

use common::*;
use spinlink_proto::headers;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use spinlink_proto::v1::{
    AssignmentsDown, AssignmentsOpen, AssignmentsUp, assignments_down, assignments_up,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const TOKEN: &str = "assignments-test-token-91ab";

fn kubeconfig() -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         clusters: [{{name: k, cluster: {{server: 'https://10.0.0.1:6443'}}}}]\n\
         users: [{{name: u, user: {{token: {TOKEN}}}}}]\n\
         contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
    )
}

struct Stream {
    _up: mpsc::Sender<AssignmentsUp>,
    down: tonic::Streaming<AssignmentsDown>,
}

/// Opens `Assignments` as the gateway carries it: verified for
/// `verified_agent`, with `open` naming `agent` in `zone`.
async fn open(
    client: &mut TunnelClient<Channel>,
    verified_agent: &str,
    agent: &str,
    zone: &str,
) -> Result<Stream, tonic::Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(AssignmentsUp {
        msg: Some(assignments_up::Msg::Open(AssignmentsOpen {
            agent_id: agent.into(),
            zone: zone.into(),
        })),
    })
    .await
    .unwrap();
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let md = request.metadata_mut();
    md.insert(headers::VERIFIED_IDENTITY, IDENTITY.parse().unwrap());
    md.insert(headers::VERIFIED_AGENT, verified_agent.parse().unwrap());
    md.insert(
        headers::VERIFIED_ACCOUNTS,
        r#"["dyn-*","other"]"#.parse().unwrap(),
    );
    let down = client.assignments(request).await?.into_inner();
    Ok(Stream { _up: tx, down })
}

impl Stream {
    /// The next message other than a heartbeat, or `None` if none comes
    /// within `wait`.
    async fn next_within(&mut self, wait: Duration) -> Option<assignments_down::Msg> {
        loop {
            let msg = tokio::time::timeout(wait, self.down.message())
                .await
                .ok()?
                .unwrap()
                .unwrap()
                .msg;
            match msg {
                Some(assignments_down::Msg::Heartbeat(_)) | None => {}
                other => return other,
            }
        }
    }

    async fn next(&mut self) -> assignments_down::Msg {
        self.next_within(Duration::from_secs(10))
            .await
            .expect("no assignments message")
    }
}

#[tokio::test]
async fn accounts_reach_the_first_agent_of_their_zone_and_are_withdrawn_on_delete() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, [3u8; 32]).unwrap();
    let running = start_config(
        "",
        &format!("accounts: {{ encryptionKeyFile: {} }}\n", key.display()),
    )
    .await
    .unwrap();
    let mut client = running.client().await.unwrap();

    // `open` must name the agent the gateway verified.
    let refused = open(&mut client, "agent-1", "agent-2", "eu")
        .await
        .err()
        .unwrap();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");

    let mut first = open(&mut client, "agent-1", "agent-1", "eu").await.unwrap();
    assert!(matches!(
        first.next().await,
        assignments_down::Msg::Synced(_)
    ));

    let http = http();
    let body = serde_json::json!({"name": "dyn-a", "kubeconfig": kubeconfig(), "zone": "eu",
                                  "namespaces": ["web"]});
    let answer = request(
        &http,
        "POST",
        &running.url("/v1/accounts"),
        &[],
        &body.to_string(),
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    // Not an account the identity may serve: never assigned.
    let forbidden =
        serde_json::json!({"name": "secret-eu", "kubeconfig": kubeconfig(), "zone": "eu"});
    let answer = request(
        &http,
        "POST",
        &running.url("/v1/accounts"),
        &[],
        &forbidden.to_string(),
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 201);
    let other_zone =
        serde_json::json!({"name": "dyn-us", "kubeconfig": kubeconfig(), "zone": "us"});
    let answer = request(
        &http,
        "POST",
        &running.url("/v1/accounts"),
        &[],
        &other_zone.to_string(),
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 201);

    // Seen at once (a change made on this sidecar), with the kubeconfig.
    match first.next().await {
        assignments_down::Msg::Assigned(a) => {
            assert_eq!(a.name, "dyn-a");
            assert_eq!(a.namespaces, ["web"]);
            assert_eq!(String::from_utf8(a.kubeconfig).unwrap(), kubeconfig());
        }
        other => panic!("expected dyn-a assigned, got {other:?}"),
    }

    // A second agent of the zone gets nothing while the first holds it.
    let mut second = open(&mut client, "agent-2", "agent-2", "eu").await.unwrap();
    assert!(matches!(
        second.next().await,
        assignments_down::Msg::Synced(_)
    ));
    assert!(
        second
            .next_within(Duration::from_millis(2500))
            .await
            .is_none(),
        "a held account went to a second agent"
    );

    // A reconnecting first agent is sent what it holds, then `Synced`.
    let mut again = open(&mut client, "agent-1", "agent-1", "eu").await.unwrap();
    assert!(matches!(again.next().await, assignments_down::Msg::Assigned(a) if a.name == "dyn-a"));
    assert!(matches!(
        again.next().await,
        assignments_down::Msg::Synced(_)
    ));

    let listed = get(&http, &running.url("/v1/dynamic-accounts"))
        .await
        .unwrap();
    let listed = listed.json();
    assert_eq!(listed[0]["name"], "dyn-a");
    assert_eq!(listed[0]["agentId"], "agent-1");
    assert_eq!(listed[2]["name"], "secret-eu");
    assert_eq!(
        listed[2]["agentId"], "",
        "assigned to an identity that may not serve it"
    );
    assert!(!listed.to_string().contains(TOKEN));

    let answer = request(&http, "DELETE", &running.url("/v1/accounts/dyn-a"), &[], "")
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    for stream in [&mut first, &mut again] {
        match stream.next().await {
            assignments_down::Msg::Withdrawn(w) => assert_eq!(w.name, "dyn-a"),
            other => panic!("expected dyn-a withdrawn, got {other:?}"),
        }
    }
    running.stop().await.unwrap();
}
