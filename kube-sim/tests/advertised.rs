//! A real API server serves every resource its discovery advertises; so does
//! kube-sim: each listable resource of the recorded discovery lists (empty to
//! start), and the ones without behaviour of their own take plain objects
//! through create, get, watch and delete.

mod common;

use common::start;
use http::StatusCode;
use serde_json::json;
use spinlink_kube_sim::Sim;

#[tokio::test]
async fn every_advertised_listable_resource_lists() {
    let s = start(Sim::new()).await;
    let mut docs = vec!["/api/v1".to_owned()];
    let groups = s.get("/apis").await.json();
    for group in groups["groups"].as_array().unwrap() {
        for version in group["versions"].as_array().unwrap() {
            docs.push(format!(
                "/apis/{}",
                version["groupVersion"].as_str().unwrap()
            ));
        }
    }
    let mut listed = 0;
    for doc in &docs {
        let r = s.get(doc).await;
        assert_eq!(r.status, StatusCode::OK, "{doc}");
        for res in r.json()["resources"].as_array().unwrap() {
            let name = res["name"].as_str().unwrap();
            let verbs = res["verbs"].as_array().unwrap();
            if name.contains('/') || !verbs.iter().any(|v| v == "list") {
                continue;
            }
            let path = format!("{doc}/{name}");
            let r = s.get(&path).await;
            assert_eq!(r.status, StatusCode::OK, "{path}");
            let kind = r.json()["kind"].as_str().unwrap_or_default().to_owned();
            assert_eq!(
                kind,
                format!("{}List", res["kind"].as_str().unwrap()),
                "{path}"
            );
            if res["namespaced"] == true {
                let path = format!("{doc}/namespaces/default/{name}");
                assert_eq!(s.get(&path).await.status, StatusCode::OK, "{path}");
            }
            listed += 1;
        }
    }
    // The recorded 1.36 server advertises far more than kube-sim's own kinds.
    assert!(listed > 50, "{listed}");
}

#[tokio::test]
async fn advertised_resources_take_plain_objects() {
    let s = start(Sim::new()).await;
    let base = "/apis/batch/v1/namespaces/default/jobs";
    let mut watch = s.watch(&format!("{base}?watch=1")).await;
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "j1", "namespace": "default"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
    assert_eq!(s.post(base, &job).await.status, StatusCode::CREATED);
    let added = watch.next().await.unwrap();
    assert_eq!(added["type"], "ADDED");
    assert_eq!(added["object"]["metadata"]["name"], "j1");
    let got = s.get(&format!("{base}/j1")).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.json()["kind"], "Job");
    let list = s.get(base).await.json();
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(s.delete(&format!("{base}/j1")).await.status, StatusCode::OK);
    assert_eq!(watch.next().await.unwrap()["type"], "DELETED");
    assert_eq!(
        s.get(&format!("{base}/j1")).await.status,
        StatusCode::NOT_FOUND
    );
    // Cluster-scoped too.
    let class = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "fast"}, "provisioner": "example.com/fast"});
    let path = "/apis/storage.k8s.io/v1/storageclasses";
    assert_eq!(s.post(path, &class).await.status, StatusCode::CREATED);
    assert_eq!(s.get(&format!("{path}/fast")).await.status, StatusCode::OK);
}
