//! kube-sim over real HTTP: discovery, OpenAPI, CRUD, errors, selectors, pagination,
//! tables, patches, subresources — compared with the recorded real-server fixtures.

mod common;

use std::collections::BTreeSet;

use common::{configmap, fixture, keys, start};
use http::{Method, StatusCode};
use serde_json::{Value, json};
use spinlink_kube_sim::{Sim, SimConfig};

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

#[tokio::test]
async fn discovery_equals_fixtures() {
    let s = start(Sim::with_config(SimConfig::default().reported_minor(None))).await;
    for (path, rel) in [
        ("/api", "discovery/api.json"),
        ("/api/v1", "discovery/api_v1.json"),
        ("/apis", "discovery/apis.json"),
        ("/apis/apps/v1", "discovery/apis_apps_v1.json"),
        ("/apis/batch/v1", "discovery/apis_batch_v1.json"),
        ("/version", "discovery/version.json"),
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.json(), fixture(rel), "{path}");
    }
    for (path, rel) in [
        ("/api", "discovery/api.aggregated.json"),
        ("/apis", "discovery/apis.aggregated.json"),
    ] {
        let r = s.get_accept(path, AGGREGATED).await;
        assert_eq!(
            r.content_type(),
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        );
        assert_eq!(r.json(), fixture(rel), "{path}");
    }
    // kubectl 1.27 asks only for v2beta1: it gets the plain document and falls back.
    let r = s.get_accept("/apis", "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json").await;
    assert_eq!(r.json()["kind"], "APIGroupList");
    let r = s.get("/apis/apps").await;
    assert_eq!(r.json()["kind"], "APIGroup");
    assert_eq!(r.json()["preferredVersion"]["groupVersion"], "apps/v1");
}

/// Only `/api` and `/apis` are written as aggregated discovery: every other
/// path asked for that alone answers the recorded 406, byte for byte, as
/// does a resource asked for a type no API path is written as.
#[tokio::test]
async fn what_cannot_be_written_is_refused_as_the_server_does() {
    let s = start(Sim::new()).await;
    let aggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    for (path, accept, rel) in [
        ("/api/v1", aggregated, "api-v1"),
        ("/apis/apps", aggregated, "group"),
        ("/apis/apps/v1", aggregated, "group-version"),
        ("/api/v1/namespaces/fx-a/configmaps", aggregated, "resource"),
        (
            "/api/v1/namespaces/fx-a/configmaps",
            "text/html",
            "text-html",
        ),
    ] {
        let r = s.get_accept(path, accept).await;
        let file = match rel {
            "text-html" => "errors/406-accept-text-html.json".to_owned(),
            rel => format!("errors/406-aggregated-discovery-{rel}.json"),
        };
        assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE, "{path}");
        assert_eq!(r.content_type(), "application/json", "{path}");
        assert_eq!(
            String::from_utf8_lossy(&r.body),
            String::from_utf8_lossy(&common::fixture_bytes(&file)),
            "{path}"
        );
    }
}

/// Every group version `/apis` lists is served (kubectl without aggregated
/// discovery fetches each one), and where a document is derived from the
/// aggregated form it says what the recorded ones say.
#[tokio::test]
async fn every_listed_group_version_is_served() {
    let s = start(Sim::new()).await;
    let apis = s.get("/apis").await.json();
    let mut served = 0;
    for group in apis["groups"].as_array().unwrap() {
        for v in group["versions"].as_array().unwrap() {
            let path = format!("/apis/{}", v["groupVersion"].as_str().unwrap());
            let r = s.get(&path).await;
            assert_eq!(r.status, StatusCode::OK, "{path}");
            assert_eq!(r.json()["groupVersion"], v["groupVersion"], "{path}");
            served += 1;
        }
    }
    assert!(served >= 20, "{served}");
    let flow = s.get("/apis/flowcontrol.apiserver.k8s.io/v1").await.json();
    let names: Vec<&str> = flow["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"flowschemas") && names.contains(&"flowschemas/status"),
        "{names:?}"
    );
    // The derivation, checked against a group version that was recorded.
    let recorded = fixture("discovery/apis_apps_v1.json");
    let strip = |mut v: Value| {
        for r in v["resources"].as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("storageVersionHash");
        }
        v
    };
    let derived = spinlink_kube_sim::derived_group_version("apps", "v1").unwrap();
    assert_eq!(strip(derived), strip(recorded));
}

#[tokio::test]
async fn version_is_reported_as_configured() {
    let s = start(Sim::new()).await;
    let v = s.get("/version").await.json();
    assert_eq!(
        (v["major"].as_str(), v["minor"].as_str()),
        (Some("1"), Some("33"))
    );
    assert_eq!(v["gitVersion"], "v1.33.0");
}

#[tokio::test]
async fn openapi_documents() {
    let s = start(Sim::new()).await;
    let r = s.get("/openapi/v2").await;
    assert_eq!(r.content_type(), "application/json");
    assert_eq!(r.json()["swagger"], "2.0");
    // Asked for in either form, answered in the dotted one a real server uses.
    for accept in [
        "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
    ] {
        let r = s.get_accept("/openapi/v2", accept).await;
        assert_eq!(
            r.content_type(),
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
        );
    }
    let r = s
        .get_accept(
            "/openapi/v2",
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        )
        .await;
    let pb = std::fs::read(format!(
        "{}/fixtures/openapi/v2.pb",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    assert_eq!(&r.body[..], &pb[..]);
    let index = s.get("/openapi/v3").await.json();
    let url = index["paths"]["apis/apps/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(url.contains("?hash="));
    let doc = s.get(&url).await;
    assert_eq!(doc.status, StatusCode::OK);
    assert_eq!(doc.json(), fixture("openapi/v3/apis_apps_v1.json"));
    assert_eq!(
        s.get("/openapi/v3/apis/apps/v1?hash=WRONG").await.status,
        StatusCode::OK
    );
    assert_eq!(
        s.get("/openapi/v3/apis/nope/v1").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn errors_match_fixtures_field_by_field() {
    let s = start(Sim::with_demo_workload()).await;
    let check = |r: common::Resp, rel: &str, code: StatusCode| {
        assert_eq!(r.status, code, "{rel}");
        assert_eq!(r.json(), fixture(rel), "{rel}");
    };
    check(
        s.get("/api/v1/namespaces/demo/pods/nope").await,
        "errors/404-notfound.json",
        StatusCode::NOT_FOUND,
    );
    check(
        s.delete("/api/v1/namespaces/demo/configmaps/nope").await,
        "errors/404-delete.json",
        StatusCode::NOT_FOUND,
    );
    check(
        s.post(
            "/api/v1/namespaces/demo/configmaps",
            &configmap("app-config", json!({})),
        )
        .await,
        "errors/409-alreadyexists.json",
        StatusCode::CONFLICT,
    );
    let mut stale = s
        .get("/api/v1/namespaces/demo/configmaps/app-config")
        .await
        .json();
    let r = s
        .patch(
            "/api/v1/namespaces/demo/configmaps/app-config",
            "application/merge-patch+json",
            r#"{"data":{"mode":"dev"}}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    stale["data"]["mode"] = json!("test");
    check(
        s.put("/api/v1/namespaces/demo/configmaps/app-config", &stale)
            .await,
        "errors/409-conflict.json",
        StatusCode::CONFLICT,
    );
    check(
        s.post(
            "/api/v1/namespaces/demo/configmaps",
            &configmap("Bad_Name", json!({})),
        )
        .await,
        "errors/422-invalid.json",
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    check(
        s.get("/api/v1/namespaces/demo/configmaps?labelSelector=app%20in%20(")
            .await,
        "errors/400-badselector.json",
        StatusCode::BAD_REQUEST,
    );
    // Field selectors, each as the real server refused the same one.
    for (path, fixture) in [
        (
            "/api/v1/namespaces/demo/configmaps?fieldSelector=data.a%3Db&limit=500",
            "errors/400-fieldselector-configmaps.json",
        ),
        (
            "/api/v1/namespaces/demo/pods?fieldSelector=spec.foo%3Dbar&limit=500",
            "errors/400-fieldselector-pods.json",
        ),
        (
            "/api/v1/namespaces/demo/configmaps?fieldSelector=metadata.name%3D%3D%3Dx",
            "errors/400-fieldselector-badsyntax.json",
        ),
    ] {
        check(s.get(path).await, fixture, StatusCode::BAD_REQUEST);
    }
    // Namespace must exist; unimplemented resources and junk are proper 404 Statuses.
    let r = s
        .post(
            "/api/v1/namespaces/nope/configmaps",
            &configmap("a", json!({})),
        )
        .await;
    assert_eq!(
        (r.status, r.json()["message"].as_str()),
        (StatusCode::NOT_FOUND, Some("namespaces \"nope\" not found"))
    );
    for path in [
        "/apis/apps/v1/widgets",
        "/api/v1/nopes",
        "/nope",
        "/apis/apps/v1/namespaces/demo/deployments/web/nope",
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(r.json()["reason"], "NotFound", "{path}");
    }
    let r = s
        .get("/apis/apps/v1/namespaces/demo/deployments/nope")
        .await;
    assert_eq!(r.json()["message"], "deployments.apps \"nope\" not found");
    assert_eq!(
        r.json()["details"],
        json!({"name": "nope", "group": "apps", "kind": "deployments"})
    );
    // Malformed bodies are 400s, never a crash.
    for body in ["{", "[1]", "null", "\u{0}\u{1}"] {
        let r = s
            .send(
                Method::POST,
                "/api/v1/namespaces/demo/configmaps",
                &[("content-type", "application/json")],
                body,
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body:?}");
        assert_eq!(r.json()["kind"], "Status");
    }
    let r = s
        .patch(
            "/api/v1/namespaces/demo/configmaps/app-config",
            "application/json-patch+json",
            "{nope",
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = s
        .patch(
            "/api/v1/namespaces/demo/configmaps/app-config",
            "text/plain",
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test]
async fn objects_and_lists_have_the_real_shape() {
    let s = start(Sim::with_demo_workload()).await;
    let list = s.get("/api/v1/namespaces/demo/configmaps").await.json();
    let real = fixture("objects/configmaps.list.json");
    assert_eq!(keys(&list), keys(&real));
    assert_eq!(list["kind"], "ConfigMapList");
    assert_eq!(list["apiVersion"], "v1");
    assert!(list["metadata"]["resourceVersion"].is_string());
    // Like the real server, list items carry no kind/apiVersion.
    let item = &list["items"][0];
    assert_eq!(keys(item), keys(&real["items"][0]));
    let deps = s
        .get("/apis/apps/v1/namespaces/demo/deployments")
        .await
        .json();
    assert_eq!(deps["kind"], "DeploymentList");
    assert_eq!(deps["apiVersion"], "apps/v1");
    assert_eq!(
        keys(&deps["items"][0]),
        keys(&fixture("objects/deployments.list.json")["items"][0])
    );
    // Single objects do carry them, and the server-set fields.
    let cm = s
        .get("/api/v1/namespaces/demo/configmaps/app-config")
        .await
        .json();
    assert_eq!(
        (cm["kind"].as_str(), cm["apiVersion"].as_str()),
        (Some("ConfigMap"), Some("v1"))
    );
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        assert!(cm["metadata"][f].is_string(), "{f}");
    }
    let ns = s.get("/api/v1/namespaces/demo").await.json();
    let real_ns = fixture("objects/namespace.json");
    assert_eq!(keys(&ns), keys(&real_ns));
    assert_eq!(ns["metadata"]["labels"], real_ns["metadata"]["labels"]);
    assert_eq!(ns["spec"], real_ns["spec"]);
    assert_eq!(ns["status"], real_ns["status"]);
    let all = s.get("/api/v1/pods").await.json();
    assert_eq!(all["items"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn crud_generate_name_dry_run_and_delete() {
    let s = start(Sim::new()).await;
    let before = s.sim.resource_version();
    let r = s.post("/api/v1/namespaces/default/configmaps?dryRun=All&fieldManager=t&fieldValidation=Strict", &configmap("dry", json!({}))).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(s.sim.resource_version(), before, "dry run changes nothing");
    assert!(s.sim.get("configmaps", Some("default"), "dry").is_none());

    let mut generated = configmap("", json!({}));
    generated["metadata"] = json!({"generateName": "gen-"});
    let r = s
        .post("/api/v1/namespaces/default/configmaps", &generated)
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let name = r.json()["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    let r = s
        .post(
            "/api/v1/namespaces/default/configmaps",
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        r.json()["details"]["causes"][0]["reason"],
        "FieldValueRequired"
    );

    // PUT with the current resourceVersion succeeds and bumps it; without one it is unconditional.
    let mut cm = s
        .get(&format!("/api/v1/namespaces/default/configmaps/{name}"))
        .await
        .json();
    cm["data"] = json!({"x": "1"});
    let r = s
        .put(
            &format!("/api/v1/namespaces/default/configmaps/{name}"),
            &cm,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let rv1: u64 = r.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    cm["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    cm["data"] = json!({"x": "2"});
    let r = s
        .put(
            &format!("/api/v1/namespaces/default/configmaps/{name}"),
            &cm,
        )
        .await;
    let rv2: u64 = r.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1);
    let r = s
        .put("/api/v1/namespaces/default/configmaps/other", &cm)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "name mismatch");

    let r = s
        .send(
            Method::DELETE,
            &format!("/api/v1/namespaces/default/configmaps/{name}"),
            &[("content-type", "application/json")],
            r#"{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    assert_eq!(
        (v["kind"].as_str(), v["status"].as_str()),
        (Some("Status"), Some("Success"))
    );
    assert_eq!(v["details"]["name"], name.as_str());
    assert_eq!(v["details"]["kind"], "configmaps");
    assert!(v["details"]["uid"].is_string());
}

#[tokio::test]
async fn resource_versions_increase_across_kinds() {
    let s = start(Sim::new()).await;
    let mut last = 0u64;
    for (path, body) in [
        (
            "/api/v1/namespaces/default/configmaps",
            configmap("a", json!({})),
        ),
        (
            "/api/v1/namespaces/default/secrets",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"a": "b"}}),
        ),
        (
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}),
        ),
        (
            "/apis/apps/v1/namespaces/default/deployments",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            configmap("b", json!({})),
        ),
    ] {
        let r = s.post(path, &body).await;
        assert_eq!(r.status, StatusCode::CREATED, "{path}");
        let rv: u64 = r.json()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rv > last, "{path}: {rv} after {last}");
        last = rv;
    }
    assert_eq!(s.sim.resource_version(), last);
    let secret = s.sim.get("secrets", Some("default"), "s").unwrap();
    assert_eq!(
        secret["data"]["a"], "Yg==",
        "stringData is encoded into data"
    );
    let d = s.sim.get("deployments", Some("default"), "d").unwrap();
    assert_eq!(d["metadata"]["generation"], 1);
    assert_eq!(d["spec"]["replicas"], 1);
}

#[tokio::test]
async fn label_and_field_selectors() {
    let s = start(Sim::new()).await;
    for (name, labels) in [
        ("a", json!({"app": "web", "tier": "fe"})),
        ("b", json!({"app": "api"})),
        ("c", json!({})),
    ] {
        assert_eq!(
            s.post(
                "/api/v1/namespaces/default/configmaps",
                &configmap(name, labels)
            )
            .await
            .status,
            StatusCode::CREATED
        );
    }
    let names = |v: Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    for (q, want) in [
        ("labelSelector=app%3Dweb", vec!["a"]),
        ("labelSelector=app%3D%3Dweb", vec!["a"]),
        ("labelSelector=app!%3Dweb", vec!["b", "c"]),
        ("labelSelector=app%20in%20(web,api)", vec!["a", "b"]),
        ("labelSelector=app%20notin%20(web)", vec!["b", "c"]),
        ("labelSelector=app", vec!["a", "b"]),
        ("labelSelector=!app", vec!["c"]),
        ("labelSelector=app,tier%3Dfe", vec!["a"]),
        ("fieldSelector=metadata.name%3Db", vec!["b"]),
        ("fieldSelector=metadata.name!%3Db", vec!["a", "c"]),
        (
            "fieldSelector=metadata.namespace%3D%3Ddefault&labelSelector=app%3Dapi",
            vec!["b"],
        ),
    ] {
        let r = s
            .get(&format!("/api/v1/namespaces/default/configmaps?{q}"))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{q}");
        assert_eq!(names(r.json()), want, "{q}");
    }
    let sim = Sim::with_demo_workload();
    let s = start(sim).await;
    let r = s.get("/api/v1/namespaces/demo/events?fieldSelector=involvedObject.kind%3DPod,reason%3DScheduled,type%3DNormal").await;
    assert_eq!(r.json()["items"].as_array().unwrap().len(), 3);
    let r = s
        .get("/api/v1/pods?fieldSelector=status.phase%3DRunning,spec.nodeName%3Dsim-node-1")
        .await;
    assert_eq!(r.json()["items"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn pagination_is_consistent_under_writes() {
    let s = start(Sim::new()).await;
    for i in 0..52 {
        s.sim.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm{i:02}"), "namespace": "default"}})).unwrap();
    }
    let expected: BTreeSet<String> = (0..52).map(|i| format!("cm{i:02}")).collect();
    let page1 = s
        .get("/api/v1/namespaces/default/configmaps?limit=10")
        .await
        .json();
    let real = fixture("objects/configmaps.page1.json");
    assert_eq!(keys(&page1["metadata"]), keys(&real["metadata"]));
    assert_eq!(page1["metadata"]["remainingItemCount"], 42);
    let rv = page1["metadata"]["resourceVersion"].clone();
    // Writes between pages (before and after the cursor) must not show up.
    s.sim.delete("configmaps", Some("default"), "cm00").unwrap();
    s.sim.delete("configmaps", Some("default"), "cm40").unwrap();
    s.sim.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm25x", "namespace": "default"}})).unwrap();
    s.sim.upsert(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm30", "namespace": "default"}, "data": {"changed": "yes"}})).unwrap();
    let mut seen = Vec::new();
    let mut page = page1;
    loop {
        assert_eq!(page["metadata"]["resourceVersion"], rv);
        for item in page["items"].as_array().unwrap() {
            seen.push(item["metadata"]["name"].as_str().unwrap().to_string());
            if item["metadata"]["name"] == "cm30" {
                assert!(
                    item.get("data").is_none(),
                    "page shows the object as of the first page"
                );
            }
        }
        let Some(token) = page["metadata"]["continue"].as_str() else {
            break;
        };
        assert!(page["metadata"]["remainingItemCount"].is_u64());
        page = s
            .get(&format!(
                "/api/v1/namespaces/default/configmaps?limit=10&continue={token}"
            ))
            .await
            .json();
    }
    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(seen.len(), unique.len(), "no duplicates");
    assert_eq!(unique, expected, "no loss, no later objects");
    // After compaction, an old continue token is 410 Expired.
    let page1 = s
        .get("/api/v1/namespaces/default/configmaps?limit=5")
        .await
        .json();
    let token = page1["metadata"]["continue"].as_str().unwrap().to_string();
    s.sim.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late", "namespace": "default"}})).unwrap();
    s.sim.compact();
    let r = s
        .get(&format!(
            "/api/v1/namespaces/default/configmaps?limit=5&continue={token}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::GONE);
    let v = r.json();
    assert_eq!(
        (v["reason"].as_str(), v["code"].as_u64()),
        (Some("Expired"), Some(410))
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("The provided continue parameter is too old")
    );
    assert!(v["metadata"]["continue"].is_string());
    let r = s
        .get("/api/v1/namespaces/default/configmaps?limit=5&continue=garbage")
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn tables_have_the_real_shape() {
    let s = start(Sim::with_demo_workload()).await;
    let t = s
        .get_accept("/api/v1/namespaces/demo/pods", TABLE)
        .await
        .json();
    let real = fixture("objects/pods.table.json");
    assert_eq!(keys(&t), keys(&real));
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(t["columnDefinitions"], real["columnDefinitions"]);
    let row = &t["rows"][0];
    assert_eq!(keys(row), keys(&real["rows"][0]));
    assert_eq!(row["cells"].as_array().unwrap().len(), 9);
    assert_eq!(row["cells"][1], "1/1");
    assert_eq!(row["cells"][2], "Running");
    assert_eq!(row["cells"][3], "0");
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(row["object"]["apiVersion"], "meta.k8s.io/v1");
    assert!(row["object"]["metadata"]["uid"].is_string());
    assert!(row["object"].get("spec").is_none());

    let t = s
        .get_accept(
            "/apis/apps/v1/namespaces/demo/deployments?includeObject=Object",
            TABLE,
        )
        .await
        .json();
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cols,
        [
            "Name",
            "Ready",
            "Up-to-date",
            "Available",
            "Age",
            "Containers",
            "Images",
            "Selector"
        ]
    );
    let web = t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cells"][0] == "web")
        .unwrap();
    assert_eq!(web["cells"][1], "2/2");
    assert_eq!(web["cells"][2], 2);
    assert_eq!(web["object"]["kind"], "Deployment");
    let t = s
        .get_accept("/api/v1/namespaces/demo/configmaps/app-config", TABLE)
        .await
        .json();
    assert_eq!(t["rows"].as_array().unwrap().len(), 1);
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols.first(), Some(&"Name"));
    assert!(cols.contains(&"Age"));
}

#[tokio::test]
async fn patches_strategic_json_merge_and_apply() {
    let s = start(Sim::with_demo_workload()).await;
    let path = "/apis/apps/v1/namespaces/demo/deployments/web";
    let r = s.patch(path, "application/strategic-merge-patch+json",
        r#"{"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"web"},{"name":"log"}],"containers":[{"name":"web","image":"nginx:1.27"},{"name":"log","image":"busybox"}]}}}}"#).await;
    assert_eq!(r.status, StatusCode::OK);
    let d = r.json();
    let cs = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(cs.len(), 2);
    assert_eq!(cs[0]["image"], "nginx:1.27");
    assert_eq!(
        cs[0]["ports"][0]["containerPort"], 80,
        "merged by name, other fields kept"
    );
    assert_eq!(d["metadata"]["generation"], 2);
    let r = s
        .patch(
            path,
            "application/json-patch+json",
            r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
        )
        .await;
    assert_eq!(r.json()["spec"]["replicas"], 3);
    let r = s
        .patch(
            path,
            "application/merge-patch+json",
            r#"{"metadata":{"labels":{"x":"y"}}}"#,
        )
        .await;
    assert_eq!(
        r.json()["metadata"]["labels"],
        json!({"app": "web", "x": "y"})
    );
    // A patch carrying a stale resourceVersion conflicts.
    let r = s
        .patch(
            path,
            "application/merge-patch+json",
            r#"{"metadata":{"resourceVersion":"1"},"spec":{"replicas":9}}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);

    // Server-side apply creates, then merges; managedFields as the real server records them.
    let cm_path = "/api/v1/namespaces/demo/configmaps/ssa-demo?fieldManager=spinlink-fixture";
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa-demo\n  namespace: demo\ndata:\n  k: v\n";
    let r = s.patch(cm_path, "application/apply-patch+yaml", yaml).await;
    assert_eq!(r.status, StatusCode::CREATED);
    let got = r.json();
    let real = fixture("objects/ssa-apply.response.json");
    assert_eq!(keys(&got), keys(&real));
    assert_eq!(keys(&got["metadata"]), keys(&real["metadata"]));
    assert_eq!(got["data"], real["data"]);
    let (mf, real_mf) = (
        &got["metadata"]["managedFields"][0],
        &real["metadata"]["managedFields"][0],
    );
    assert_eq!(keys(mf), keys(real_mf));
    for f in [
        "manager",
        "operation",
        "apiVersion",
        "fieldsType",
        "fieldsV1",
    ] {
        assert_eq!(mf[f], real_mf[f], "{f}");
    }
    let r = s
        .patch(
            cm_path,
            "application/apply-patch+yaml",
            &yaml.replace("k: v", "k: w\n  k2: x"),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["data"], json!({"k": "w", "k2": "x"}));
    assert_eq!(
        r.json()["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let r = s
        .patch(
            "/api/v1/namespaces/demo/configmaps/ssa-demo",
            "application/apply-patch+yaml",
            yaml,
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "apply needs a fieldManager"
    );
    let r = s
        .patch(
            "/api/v1/namespaces/demo/configmaps/none",
            "application/merge-patch+json",
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn scale_and_status_subresources() {
    let s = start(Sim::with_demo_workload()).await;
    let path = "/apis/apps/v1/namespaces/demo/deployments/web/scale";
    let scale = s.get(path).await.json();
    assert_eq!(
        (scale["kind"].as_str(), scale["apiVersion"].as_str()),
        (Some("Scale"), Some("autoscaling/v1"))
    );
    assert_eq!(scale["spec"]["replicas"], 2);
    assert_eq!(scale["status"]["selector"], "app=web");
    let r = s
        .patch(
            path,
            "application/merge-patch+json",
            r#"{"spec":{"replicas":5}}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["spec"]["replicas"], 5);
    assert_eq!(
        s.sim.get("deployments", Some("demo"), "web").unwrap()["spec"]["replicas"],
        5
    );
    let mut put = r.json();
    put["spec"]["replicas"] = json!(1);
    let r = s.put(path, &put).await;
    assert_eq!(r.json()["spec"]["replicas"], 1);
    let r = s.put(path, &put).await;
    assert_eq!(
        r.status,
        StatusCode::CONFLICT,
        "stale Scale resourceVersion"
    );

    // Status writes change only status; main writes keep status.
    let spath = "/apis/apps/v1/namespaces/demo/deployments/api/status";
    let mut d = s.get(spath).await.json();
    d["status"]["readyReplicas"] = json!(0);
    d["spec"]["replicas"] = json!(7);
    let r = s.put(spath, &d).await.json();
    assert_eq!(r["status"]["readyReplicas"], 0);
    assert_eq!(r["spec"]["replicas"], 1);
    let r = s
        .patch(
            "/apis/apps/v1/namespaces/demo/deployments/api",
            "application/merge-patch+json",
            r#"{"status":{"replicas":99}}"#,
        )
        .await;
    assert_ne!(r.json()["status"]["replicas"], 99);
    assert_eq!(
        s.get("/api/v1/namespaces/demo/configmaps/app-config/scale")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn serves_http2_with_prior_knowledge() {
    let s = start(Sim::new()).await;
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let resp = client
        .get(format!("{}/api/v1/namespaces", s.url).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), StatusCode::OK);
    s.shutdown.cancel();
    tokio::time::timeout(common::WAIT, s.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
