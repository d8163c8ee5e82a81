//! `Hello` over the real listener: grants follow the policy, refusals say
//! why, and paths the gateway does not serve answer `Unimplemented`.

mod common;

use common::*;
use spinlink_gateway::stats::Refusal;
use spinlink_gateway::tunnel::hello::MAX_ACCOUNTS_PER_HELLO;
use spinlink_proto::v1::{HelloRequest, HelloResponse};
use tonic::Code;

#[tokio::test]
async fn hello_grants_allowed_accounts_and_refuses_others() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\ntokenTtlSeconds: 120\n",
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let resp = hello(&channel, &["dev-1", "prod", "staging"])
        .await
        .unwrap();
    assert_eq!(resp.gateway_id, "gw-test");
    let granted: Vec<_> = resp.granted.iter().map(|g| g.account.as_str()).collect();
    assert_eq!(granted, ["dev-1", "staging"]);
    for g in &resp.granted {
        assert!(!g.token.is_empty());
        assert!((before + 119..=before + 122).contains(&g.expires_at_unix));
    }
    assert_eq!(
        resp.granted[0].token.len(),
        spinlink_gateway::token::TOKEN_LEN
    );
    assert_ne!(resp.granted[0].token, resp.granted[1].token);
    assert_eq!(resp.refused.len(), 1);
    assert_eq!(resp.refused[0].account, "prod");
    assert_eq!(
        resp.refused[0].reason,
        format!("identity {A1} may not serve account prod")
    );
    let stats = gw.stats.snapshot();
    assert_eq!((stats.accounts_granted, stats.accounts_refused), (2, 1));
    assert_eq!(gw.stats.metrics().refusals(Refusal::Policy), 1);
    assert_eq!(gw.stats.metrics().refusals(Refusal::HelloInvalid), 0);
}

#[tokio::test]
async fn malformed_hellos_are_refused_and_counted() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n",
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    // An empty name and a name offered twice: those accounts are refused.
    let resp = hello(&channel, &["", "dev-1", "dev-1"]).await.unwrap();
    let granted: Vec<_> = resp.granted.iter().map(|g| g.account.as_str()).collect();
    assert_eq!(granted, ["dev-1"]);
    let reasons: Vec<_> = resp.refused.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(
        reasons,
        ["empty account name", "account dev-1 offered twice"]
    );
    assert_eq!(gw.stats.metrics().refusals(Refusal::HelloInvalid), 2);

    // More accounts than one Hello may carry: the whole Hello is refused.
    let many: Vec<String> = (0..=MAX_ACCOUNTS_PER_HELLO)
        .map(|i| format!("dev-{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let err = hello(&channel, &many).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(gw.stats.metrics().refusals(Refusal::HelloInvalid), 3);
    assert_eq!(gw.stats.metrics().refusals(Refusal::Policy), 0);
}

#[tokio::test]
async fn empty_policy_grants_nothing() {
    let pki = pki();
    let yaml = tls_gateway_yaml(&pki.pki, "upstreams: [{url: 'http://127.0.0.1:9'}]\n");
    // Cut the policy out of the YAML: no rules at all.
    let yaml: String = yaml
        .lines()
        .filter(|l| !l.contains("policy") && !l.contains("identities") && !l.contains("accounts"))
        .map(|l| format!("{l}\n"))
        .collect();
    let gw = start_gateway(&yaml).await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let resp = hello(&channel, &["dev-1", "anything"]).await.unwrap();
    assert!(resp.granted.is_empty());
    assert_eq!(resp.refused.len(), 2);
}

#[tokio::test]
async fn unknown_method_is_unimplemented() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n",
    ))
    .await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let err = grpc
        .unary::<HelloRequest, HelloResponse, _>(
            tonic::Request::new(HelloRequest::default()),
            http::uri::PathAndQuery::from_static("/spinlink.v1.Tunnel/Unknown"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
}
