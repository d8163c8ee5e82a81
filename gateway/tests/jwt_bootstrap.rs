//! JWT bootstrap over the real listener: with `jwtBootstrap` configured an
//! agent without a client certificate completes TLS, its `Hello` carries a
//! signed JWT naming its identity (`sub`) and accounts, and its streams are
//! carried as that identity; without a JWT (or with a bad one) it gets
//! nothing. Without `jwtBootstrap` TLS still demands a certificate.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use spinlink_gateway::stats::AuthFailure;
use spinlink_proto::headers;
use spinlink_proto::v1::HelloRequest;
use spinlink_proto::v1::tunnel_client::TunnelClient;
use tonic::Code;
use tonic::transport::Channel;

const JWT_HEADER: &str = "spinlink-bootstrap-jwt";

struct Signer {
    key: EncodingKey,
    jwk: serde_json::Value,
}

fn signer() -> Signer {
    let rng = SystemRandom::new();
    let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    let p = pair.public_key().as_ref();
    Signer {
        key: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk: serde_json::json!({"kty": "EC", "crv": "P-256", "kid": "k1",
            "x": URL_SAFE_NO_PAD.encode(&p[1..33]), "y": URL_SAFE_NO_PAD.encode(&p[33..65])}),
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl Signer {
    fn jwt(&self, sub: &str, aud: &str, exp: u64) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("k1".into());
        let claims = serde_json::json!({"sub": sub, "aud": aud, "exp": exp,
            "spinlink_accounts": ["boot-*"]});
        jsonwebtoken::encode(&header, &claims, &self.key).unwrap()
    }
}

async fn bootstrap_gateway(pki: &Pki, signer: &Signer, upstream: &str) -> RunningGateway {
    let jwks = pki.dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        serde_json::json!({"keys": [signer.jwk.clone()]}).to_string(),
    )
    .unwrap();
    start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &format!(
            "upstreams: [{{url: '{upstream}'}}]\n\
             jwtBootstrap:\n  jwksFile: {}\n  audiences: [spinlink-gateway]\n",
            jwks.display()
        ),
    ))
    .await
}

async fn bootstrap_hello(
    channel: &Channel,
    jwt: Option<&str>,
    accounts: &[&str],
) -> Result<spinlink_proto::v1::HelloResponse, tonic::Status> {
    let mut request = tonic::Request::new(HelloRequest {
        agent_id: "boot".into(),
        agent_version: "test".into(),
        accounts: accounts.iter().map(|a| account(a)).collect(),
    });
    if let Some(jwt) = jwt {
        request
            .metadata_mut()
            .insert(JWT_HEADER, jwt.parse().unwrap());
    }
    Ok(TunnelClient::new(channel.clone())
        .hello(request)
        .await?
        .into_inner())
}

#[tokio::test]
async fn agent_without_certificate_bootstraps_with_a_jwt() {
    let pki = pki();
    let signer = signer();
    let sidecar = FakeSidecar::plain().await;
    let gw = bootstrap_gateway(&pki, &signer, &sidecar.url()).await;
    let channel = agent_channel(gw.addr, &pki.pki, None).await.unwrap();

    // Streams before any Hello have no identity.
    let err = open_cache(&channel, |s| with_metadata(s, "boot-1", "x"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    // No JWT, a wrong audience, an expired one: refused.
    let err = bootstrap_hello(&channel, None, &["boot-1"])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let wrong = signer.jwt("cluster-9", "other", now() + 300);
    let err = bootstrap_hello(&channel, Some(&wrong), &["boot-1"])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert_eq!(err.message(), "bootstrap JWT audience not accepted");
    let expired = signer.jwt("cluster-9", "spinlink-gateway", now() - 3600);
    let err = bootstrap_hello(&channel, Some(&expired), &["boot-1"])
        .await
        .unwrap_err();
    assert_eq!(err.message(), "bootstrap JWT expired");
    assert_eq!(
        gw.stats.metrics().auth_failures(AuthFailure::BootstrapJwt),
        3
    );

    let jwt = signer.jwt("cluster-9", "spinlink-gateway", now() + 300);
    let resp = bootstrap_hello(&channel, Some(&jwt), &["boot-1", "dev-1"])
        .await
        .unwrap();
    let granted: Vec<_> = resp.granted.iter().map(|g| g.account.as_str()).collect();
    // The JWT's claim grants, not the certificate policy.
    assert_eq!(granted, ["boot-1"]);
    assert_eq!(
        resp.refused[0].reason,
        "identity cluster-9 may not serve account dev-1"
    );
    let token = resp.granted[0].token.clone();

    let (tx, _down) = acked_cache(&channel, "boot-1", &token).await;
    drop(tx);
    let streams = sidecar.streams();
    assert_eq!(streams.len(), 1);
    let h = &streams[0].headers;
    assert_eq!(h[headers::VERIFIED_IDENTITY], "cluster-9");
    assert!(h.get(JWT_HEADER).is_none());

    // The connection belongs to cluster-9 now; a JWT for another sub is refused.
    let other = signer.jwt("cluster-10", "spinlink-gateway", now() + 300);
    let err = bootstrap_hello(&channel, Some(&other), &["boot-2"])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn without_jwt_bootstrap_a_certificate_is_required() {
    let pki = pki();
    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\n",
    ))
    .await;
    // TLS 1.3 reports the missing certificate after the client's handshake
    // completes, so the failure shows on the first call.
    let result = match agent_channel(gw.addr, &pki.pki, None).await {
        Err(_) => true,
        Ok(channel) => hello(&channel, &["dev-1"]).await.is_err(),
    };
    assert!(result, "served without a client certificate");
}

#[tokio::test]
async fn bootstrap_gateway_still_serves_certificates_by_policy() {
    let pki = pki();
    let signer = signer();
    let gw = bootstrap_gateway(&pki, &signer, "http://127.0.0.1:9").await;
    let channel = agent_a1(gw.addr, &pki.pki).await;
    let resp = hello(&channel, &["dev-1", "boot-1"]).await.unwrap();
    let granted: Vec<_> = resp.granted.iter().map(|g| g.account.as_str()).collect();
    assert_eq!(granted, ["dev-1"]);
}

#[tokio::test]
async fn bad_jwt_bootstrap_config_names_the_key() {
    let pki = pki();
    let yaml = tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\njwtBootstrap:\n  jwksFile: /x\n  audience: [a]\n",
    );
    let err = spinlink_gateway::Config::from_yaml_str(&yaml, "t.yaml").unwrap_err();
    assert!(err.to_string().contains("audience"), "{err}");
    let yaml = tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\njwtBootstrap:\n  jwksFile: /x\n",
    );
    let err = spinlink_gateway::Config::from_yaml_str(&yaml, "t.yaml").unwrap_err();
    assert!(err.to_string().contains("jwtBootstrap.audiences"), "{err}");
    let yaml = tls_gateway_yaml(
        &pki.pki,
        "upstreams: [{url: 'http://127.0.0.1:9'}]\njwtBootstrap:\n  jwksFile: /nonexistent/jwks.json\n  audiences: [a]\n",
    );
    let config = spinlink_gateway::Config::from_yaml_str(&yaml, "t.yaml").unwrap();
    let err = spinlink_gateway::Gateway::bind(config).await.unwrap_err();
    assert!(err.to_string().contains("jwtBootstrap.jwksFile"), "{err}");
}

#[tokio::test]
async fn a_bootstrap_connection_gets_no_assignments() {
    use spinlink_proto::v1::{AssignmentsOpen, AssignmentsUp, assignments_up};
    let pki = pki();
    let signer = signer();
    let sidecar = FakeSidecar::plain().await;
    let gw = bootstrap_gateway(&pki, &signer, &sidecar.url()).await;
    let channel = agent_channel(gw.addr, &pki.pki, None).await.unwrap();
    let jwt = signer.jwt("cluster-9", "spinlink-gateway", now() + 300);
    bootstrap_hello(&channel, Some(&jwt), &["boot-1"])
        .await
        .unwrap();

    // Kubeconfigs go only to identities the policy names.
    let open = AssignmentsUp {
        msg: Some(assignments_up::Msg::Open(AssignmentsOpen {
            agent_id: "boot".into(),
            zone: String::new(),
        })),
    };
    let mut request = tonic::Request::new(futures::stream::iter([open]));
    request
        .metadata_mut()
        .insert(headers::AGENT_ID, "boot".parse().unwrap());
    let err = TunnelClient::new(channel.clone())
        .assignments(request)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(sidecar.streams().is_empty());
}
