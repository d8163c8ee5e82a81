//! kube-sim authorizes impersonated requests with RBAC as the real server
//! does: the requests recorded in `fixtures/authz/` (ServiceAccount
//! `fx-a/narrow`, allowed to get and list configmaps in `fx-a` only) are sent
//! again and answered with the recorded status and body.

mod common;

use common::{Running, fixture, start};
use http::{Method, StatusCode};
use serde_json::{Value, json};
use spinlink_kube_sim::Sim;

const NARROW: &str = "system:serviceaccount:fx-a:narrow";

/// The cluster the fixtures were recorded on, as far as they depend on it.
async fn recorded_cluster() -> Running {
    let s = start(Sim::new()).await;
    for ns in ["fx-a", "fx-b"] {
        let r = s
            .post(
                "/api/v1/namespaces",
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
        let r = s
            .post(
                &format!("/api/v1/namespaces/{ns}/configmaps"),
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                        "data": {"color": "blue", "size": "large"}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    let rbac = [
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/fx-a/roles",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": "configmap-reader", "namespace": "fx-a"},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/fx-a/rolebindings",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "narrow-configmap-reader", "namespace": "fx-a"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
                   "subjects": [{"kind": "ServiceAccount", "name": "narrow", "namespace": "fx-a"}]}),
        ),
    ];
    for (path, object) in rbac {
        let r = s.post(path, &object).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.json());
    }
    s
}

/// Sends the request `name.request.json` records (without the recorder's
/// own headers); the answer and the recorded `name.response.json`.
async fn replay(s: &Running, name: &str) -> (common::Resp, Value) {
    let request = fixture(&format!("authz/{name}.request.json"));
    let response = fixture(&format!("authz/{name}.response.json"));
    let headers: Vec<(String, String)> = request["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h[0].as_str().unwrap().to_owned(),
                h[1].as_str().unwrap().to_owned(),
            )
        })
        .filter(|(k, _)| {
            !matches!(
                k.to_ascii_lowercase().as_str(),
                "host" | "authorization" | "content-length" | "accept-encoding"
            )
        })
        .collect();
    let borrowed: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut path = request["path"].as_str().unwrap().to_owned();
    if let Some(q) = request["query"].as_str().filter(|q| !q.is_empty()) {
        path = format!("{path}?{q}");
    }
    let method = Method::from_bytes(request["method"].as_str().unwrap().as_bytes()).unwrap();
    let body = match &request["body"]["decoded"] {
        Value::Null => String::new(),
        decoded => decoded.to_string(),
    };
    (s.send(method, &path, &borrowed, &body).await, response)
}

#[tokio::test]
async fn impersonated_requests_get_the_recorded_answers() {
    let s = recorded_cluster().await;
    for name in [
        "impersonate-list-forbidden",
        "impersonate-list-forbidden-group-only",
        "impersonate-kubectl-get-forbidden.1-list-configmaps",
        "impersonate-group-without-user",
    ] {
        let (got, want) = replay(&s, name).await;
        assert_eq!(u64::from(got.status.as_u16()), want["status"], "{name}");
        assert_eq!(got.json(), want["body"]["decoded"], "{name}");
        if got.status == StatusCode::FORBIDDEN {
            assert_eq!(got.headers["x-content-type-options"], "nosniff", "{name}");
        }
    }

    // Allowed: the same objects the real server listed.
    let (got, want) = replay(&s, "impersonate-list-allowed").await;
    assert_eq!(got.status, StatusCode::OK);
    let data = |v: &Value| -> Vec<(Value, Value)> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["metadata"]["name"].clone(), i["data"].clone()))
            .collect()
    };
    assert_eq!(data(&got.json()), data(&want["body"]["decoded"]));
}

#[tokio::test]
async fn refusals_are_worded_as_the_real_server_words_them() {
    let s = recorded_cluster().await;
    let r = s
        .post(
            "/apis/apps/v1/namespaces/fx-a/deployments",
            &serde_json::from_str::<Value>(
                r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},
                    "spec":{"selector":{"matchLabels":{"app":"web"}},
                    "template":{"metadata":{"labels":{"app":"web"}},
                    "spec":{"containers":[{"name":"web","image":"nginx"}]}}}}"#,
            )
            .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let as_narrow = [("impersonate-user", NARROW)];
    let cases = [
        (
            Method::GET,
            "/api/v1/namespaces/fx-b/configmaps/settings",
            "403-get.json",
        ),
        (
            Method::GET,
            "/api/v1/configmaps",
            "403-list-all-namespaces.json",
        ),
        (
            Method::GET,
            "/api/v1/namespaces/fx-b/configmaps?watch=true",
            "403-watch.json",
        ),
        (
            Method::GET,
            "/api/v1/namespaces",
            "403-list-cluster-scoped.json",
        ),
        (
            Method::DELETE,
            "/api/v1/namespaces/fx-a/configmaps/settings",
            "403-delete.json",
        ),
        (
            Method::GET,
            "/apis/apps/v1/namespaces/fx-a/deployments/web/scale",
            "403-get-subresource.json",
        ),
    ];
    for (method, path, file) in cases {
        let got = s.send(method, path, &as_narrow, "").await;
        assert_eq!(got.status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(got.json(), fixture(&format!("errors/{file}")), "{path}");
    }
    // What the role allows still works, and the admin is not limited.
    let got = s
        .send(
            Method::GET,
            "/api/v1/namespaces/fx-a/configmaps/settings",
            &as_narrow,
            "",
        )
        .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(
        s.get("/api/v1/namespaces/fx-b/configmaps/settings")
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn self_subject_access_reviews_answer_for_the_impersonated_user() {
    let s = recorded_cluster().await;
    // Recorded with the ServiceAccount's own token; here the same identity
    // is impersonated (its token is not stored).
    for name in ["ssar-token-allowed", "ssar-token-denied"] {
        let request = fixture(&format!("authz/{name}.request.json"));
        let want = fixture(&format!("authz/{name}.response.json"));
        let got = s
            .send(
                Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                &[
                    ("impersonate-user", NARROW),
                    ("content-type", "application/json"),
                ],
                &request["body"]["decoded"].to_string(),
            )
            .await;
        assert_eq!(got.status, StatusCode::CREATED, "{name}");
        let want = &want["body"]["decoded"];
        let got = got.json();
        assert_eq!(got["status"], want["status"], "{name}");
        assert_eq!(got["spec"], want["spec"], "{name}");
        assert_eq!(got["kind"], want["kind"], "{name}");
    }
}
