//! Agent mode: the in-cluster service account from a mount directory, with
//! the API server (kube-sim over TLS, checking bearer tokens) at the address
//! the environment names; the token is read again when the kubelet rotates
//! it (the mount's `..data` symlink swap).

use std::path::Path;
use std::sync::Arc;

use spinlink_agent::incluster;
use spinlink_kube_sim::{Server, Sim};
use spinlink_tls::config::{ClientAuth, ServerFiles, server_config};
use spinlink_tls::dev::DevPki;
use tokio_util::sync::CancellationToken;

/// Writes `token` as a new version of the mount and swaps `..data` to it.
fn mount_token(dir: &Path, version: u32, token: &str, ca: &Path) {
    let v = dir.join(format!("..2026_v{version}"));
    std::fs::create_dir_all(&v).unwrap();
    std::fs::write(v.join("token"), token).unwrap();
    std::fs::copy(ca, v.join("ca.crt")).unwrap();
    std::fs::write(v.join("namespace"), "demo").unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(v.file_name().unwrap(), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for name in ["token", "ca.crt", "namespace"] {
        let link = dir.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), link).unwrap();
        }
    }
}

#[tokio::test]
async fn the_service_account_token_is_read_again_when_rotated() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = DevPki::ensure(&tmp.path().join("pki"), &[]).unwrap();
    let tls = server_config(
        ServerFiles {
            cert: &pki.cert("sidecar"),
            key: &pki.key("sidecar"),
            client_ca: None,
        },
        ClientAuth::Off,
        &[],
    )
    .unwrap();
    let sim = Sim::with_demo_workload();
    sim.require_tokens(&["token-1"]);
    let server = Server::bind(
        sim.clone(),
        "127.0.0.1:0".parse().unwrap(),
        Some(Arc::new(tls)),
    )
    .await
    .unwrap();
    let port = server.local_addr().port();
    let stop = CancellationToken::new();
    tokio::spawn(server.run(stop.clone()));

    let sa = tmp.path().join("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    mount_token(&sa, 1, "token-1\n", &pki.ca_cert());
    let env = |name: &str| match name {
        "KUBERNETES_SERVICE_HOST" => Some("127.0.0.1".to_owned()),
        "KUBERNETES_SERVICE_PORT" => Some(port.to_string()),
        _ => None,
    };
    let (config, token) = incluster::config_with_env(&sa, env).unwrap();
    assert_eq!(config.default_namespace, "demo");
    let connections = prometheus_client::metrics::gauge::Gauge::default();
    let client = incluster::client(config, token, connections.clone()).unwrap();
    let get = || async {
        let req = http::Request::get("/api/v1/namespaces/demo/configmaps")
            .body(Vec::new())
            .unwrap();
        client.request_text(req).await
    };
    get().await.expect("served with the first token");

    // The kubelet rotates the token; the old one stops working.
    mount_token(&sa, 2, "token-2\n", &pki.ca_cert());
    sim.require_tokens(&["token-2"]);
    get().await.expect("served with the rotated token");

    // And a token the server does not know is refused, so the check above
    // could fail.
    sim.require_tokens(&["token-3"]);
    let err = get().await.unwrap_err().to_string();
    assert!(err.contains("401") || err.contains("Unauthorized"), "{err}");
    // Every request with its token on the one HTTP/2 connection, counted.
    assert_eq!(connections.get(), 1);
    stop.cancel();
}

#[test]
fn outside_a_pod_the_error_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let err = incluster::config_with_env(tmp.path(), |_| None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("KUBERNETES_SERVICE_HOST"), "{err}");
}

#[tokio::test]
async fn a_kubeconfig_comes_from_a_secret() {
    use base64::Engine as _;
    let tmp = tempfile::tempdir().unwrap();
    let pki = DevPki::ensure(&tmp.path().join("pki"), &[]).unwrap();
    let tls = server_config(
        ServerFiles {
            cert: &pki.cert("sidecar"),
            key: &pki.key("sidecar"),
            client_ca: None,
        },
        ClientAuth::Off,
        &[],
    )
    .unwrap();
    let stop = CancellationToken::new();
    // The cluster the agent runs in holds the Secret; the target cluster is
    // another one.
    let home = Sim::new();
    home.require_tokens(&["sa-token"]);
    let home_server = Server::bind(
        home.clone(),
        "127.0.0.1:0".parse().unwrap(),
        Some(Arc::new(tls)),
    )
    .await
    .unwrap();
    let home_port = home_server.local_addr().port();
    tokio::spawn(home_server.run(stop.clone()));
    let target = Sim::with_demo_workload();
    target
        .create(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "only-in-target", "namespace": "demo"}}))
        .unwrap();
    let target_server = Server::bind(target, "127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let kubeconfig_path = tmp.path().join("target.kubeconfig");
    spinlink_kube_sim::write_kubeconfig(&kubeconfig_path, &target_server.url(), "target", None)
        .unwrap();
    tokio::spawn(target_server.run(stop.clone()));
    let kubeconfig = std::fs::read(&kubeconfig_path).unwrap();
    home.create(serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "spinlink"}}))
        .unwrap();
    home.create(serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "target-kubeconfig", "namespace": "spinlink"},
        "data": {"kubeconfig": base64::engine::general_purpose::STANDARD.encode(&kubeconfig)}}))
        .unwrap();

    let sa = tmp.path().join("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    mount_token(&sa, 1, "sa-token", &pki.ca_cert());
    let account: spinlink_agent::AccountConfig = serde_norway::from_str(&format!(
        "name: target\nkubeconfigSecret: {{namespace: spinlink, name: target-kubeconfig, key: kubeconfig}}\n\
         serviceAccountDir: {}\n",
        sa.display()
    ))
    .unwrap();
    let env = |name: &str| match name {
        "KUBERNETES_SERVICE_HOST" => Some("127.0.0.1".to_owned()),
        "KUBERNETES_SERVICE_PORT" => Some(home_port.to_string()),
        _ => None,
    };
    let metrics = spinlink_agent::metrics::Metrics::new();
    let cluster = spinlink_agent::cluster::Cluster::connect_with_env(&account, &metrics, env)
        .await
        .unwrap();
    let body = cluster
        .get_raw("/api/v1/namespaces/demo/configmaps")
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&body).contains("only-in-target"),
        "the client reaches the cluster the Secret names"
    );

    // A missing key is named, the Secret's content never.
    let account = spinlink_agent::AccountConfig {
        kubeconfig_secret: Some(spinlink_agent::config::SecretRef {
            namespace: "spinlink".into(),
            name: "target-kubeconfig".into(),
            key: Some("nope".into()),
        }),
        ..account
    };
    let err = spinlink_agent::cluster::Cluster::connect_with_env(&account, &metrics, env)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"nope\""), "{err}");
    assert!(!err.contains("clusters"), "{err}");
    stop.cancel();
}
