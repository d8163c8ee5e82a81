//! Watches over real HTTP: initial events, replay from a resourceVersion, bookmarks,
//! timeouts, selector transitions, 410 Expired, streaming lists, shutdown.

mod common;

use std::time::Duration;

use common::{configmap, fixture_lines, keys, start};
use serde_json::json;
use spinlink_kube_sim::{Sim, SimConfig};

fn cm(name: &str, labels: serde_json::Value) -> serde_json::Value {
    let mut c = configmap(name, labels);
    c["metadata"]["namespace"] = json!("default");
    c
}

fn rv(ev: &serde_json::Value) -> u64 {
    ev["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn initial_events_then_live_changes() {
    let s = start(Sim::new()).await;
    s.sim.create(cm("old", json!({}))).unwrap();
    let mut w = s
        .watch("/api/v1/namespaces/default/configmaps?watch=true")
        .await;
    let ev = w.next().await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("old"))
    );
    assert_eq!(ev["object"]["kind"], "ConfigMap");
    s.sim.create(cm("new", json!({}))).unwrap();
    // Another namespace and another kind are not this watch's business.
    s.sim.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "kube-system"}})).unwrap();
    s.sim.create(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x", "namespace": "default"}})).unwrap();
    let mut changed = cm("new", json!({}));
    changed["data"] = json!({"k": "2"});
    s.sim.upsert(changed).unwrap();
    s.sim.delete("configmaps", Some("default"), "new").unwrap();
    let added = w.next().await.unwrap();
    let modified = w.next().await.unwrap();
    let deleted = w.next().await.unwrap();
    assert_eq!(added["type"], "ADDED");
    assert_eq!(modified["type"], "MODIFIED");
    assert_eq!(modified["object"]["data"]["k"], "2");
    assert_eq!(deleted["type"], "DELETED");
    assert!(rv(&added) < rv(&modified) && rv(&modified) < rv(&deleted));
    // Event shape as the real server's.
    let real = fixture_lines("watch/configmaps.watch.jsonl");
    assert_eq!(keys(&deleted), keys(&real[2]));
    assert_eq!(keys(&deleted["object"]), keys(&real[2]["object"]));
}

#[tokio::test]
async fn replay_from_resource_version() {
    let s = start(Sim::new()).await;
    let from = s.sim.resource_version();
    for i in 0..5 {
        s.sim.create(cm(&format!("c{i}"), json!({}))).unwrap();
        s.sim.create(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("s{i}"), "namespace": "default"}})).unwrap();
    }
    s.sim.delete("configmaps", Some("default"), "c0").unwrap();
    let mut w = s
        .watch(&format!(
            "/api/v1/configmaps?watch=1&resourceVersion={from}"
        ))
        .await;
    let mut last = from;
    let mut seen = Vec::new();
    for _ in 0..6 {
        let ev = w.next().await.unwrap();
        assert!(rv(&ev) > last, "resourceVersions increase");
        last = rv(&ev);
        seen.push(format!(
            "{} {}",
            ev["type"].as_str().unwrap(),
            ev["object"]["metadata"]["name"].as_str().unwrap()
        ));
    }
    assert_eq!(
        seen,
        [
            "ADDED c0",
            "ADDED c1",
            "ADDED c2",
            "ADDED c3",
            "ADDED c4",
            "DELETED c0"
        ]
    );
    // And it continues live.
    s.sim.create(cm("live", json!({}))).unwrap();
    assert_eq!(
        w.next().await.unwrap()["object"]["metadata"]["name"],
        "live"
    );
}

#[tokio::test]
async fn bookmarks_arrive_at_the_configured_interval() {
    let s = start(Sim::with_config(
        SimConfig::default().bookmark_interval(Duration::from_millis(50)),
    ))
    .await;
    let now = s.sim.resource_version();
    let mut w = s
        .watch(&format!(
            "/api/v1/configmaps?watch=true&allowWatchBookmarks=true&resourceVersion={now}"
        ))
        .await;
    let ev = w.next().await.unwrap();
    assert_eq!(ev["type"], "BOOKMARK");
    let real = fixture_lines("watch/configmaps.watch.jsonl");
    assert_eq!(keys(&ev["object"]), keys(&real[3]["object"]));
    assert_eq!(keys(&ev["object"]["metadata"]), ["resourceVersion"]);
    assert_eq!(ev["object"]["kind"], "ConfigMap");
    assert_eq!(rv(&ev), now);
    // A bookmark after a write to another kind carries the newer resourceVersion.
    s.sim.create(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x", "namespace": "default"}})).unwrap();
    let later = s.sim.resource_version();
    loop {
        let ev = w.next().await.unwrap();
        assert_eq!(ev["type"], "BOOKMARK");
        if rv(&ev) == later {
            break;
        }
    }
    // Without allowWatchBookmarks there are none: the next event is a real one.
    let mut quiet = s
        .watch(&format!(
            "/api/v1/configmaps?watch=true&resourceVersion={later}"
        ))
        .await;
    let mut w2 = s
        .watch(&format!(
            "/api/v1/configmaps?watch=true&allowWatchBookmarks=true&resourceVersion={later}"
        ))
        .await;
    assert_eq!(w2.next().await.unwrap()["type"], "BOOKMARK");
    assert_eq!(w2.next().await.unwrap()["type"], "BOOKMARK");
    s.sim.create(cm("after", json!({}))).unwrap();
    assert_eq!(quiet.next().await.unwrap()["type"], "ADDED");
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream() {
    let s = start(Sim::new()).await;
    let mut w = s
        .watch("/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1")
        .await;
    assert!(w.next().await.is_none(), "stream ends after timeoutSeconds");
}

#[tokio::test]
async fn selectors_apply_to_events() {
    let s = start(Sim::new()).await;
    let from = s.sim.resource_version();
    let mut w = s.watch(&format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={from}&labelSelector=app%3Dweb")).await;
    let mut by_name = s.watch(&format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={from}&fieldSelector=metadata.name%3Db")).await;
    s.sim.create(cm("a", json!({"app": "web"}))).unwrap();
    s.sim.create(cm("b", json!({"app": "api"}))).unwrap();
    s.sim.upsert(cm("a", json!({"app": "api"}))).unwrap();
    s.sim.upsert(cm("a", json!({"app": "web"}))).unwrap();
    s.sim
        .upsert(cm("b", json!({"app": "web", "x": "y"})))
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let ev = w.next().await.unwrap();
        seen.push(format!(
            "{} {}",
            ev["type"].as_str().unwrap(),
            ev["object"]["metadata"]["name"].as_str().unwrap()
        ));
    }
    // `a` stops matching: DELETED for this watcher; matches again: ADDED.
    assert_eq!(seen, ["ADDED a", "DELETED a", "ADDED a", "ADDED b"]);
    let ev = by_name.next().await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("b"))
    );
    let ev = by_name.next().await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["labels"]["x"].as_str()
        ),
        (Some("MODIFIED"), Some("y"))
    );
}

#[tokio::test]
async fn too_old_resource_version_is_an_expired_error_event() {
    let s = start(Sim::with_config(SimConfig::default().history(5))).await;
    for i in 0..10 {
        s.sim.create(cm(&format!("c{i}"), json!({}))).unwrap();
    }
    let mut w = s
        .watch("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=2")
        .await;
    let ev = w.next().await.unwrap();
    let real = &fixture_lines("watch/configmaps.too-old.jsonl")[0];
    assert_eq!(keys(&ev), keys(real));
    assert_eq!(keys(&ev["object"]), keys(&real["object"]));
    assert_eq!(ev["type"], real["type"]);
    for f in ["kind", "apiVersion", "metadata", "status", "reason", "code"] {
        assert_eq!(ev["object"][f], real["object"][f], "{f}");
    }
    assert_eq!(ev["object"]["message"], "too old resource version: 2 (9)");
    assert!(w.next().await.is_none(), "the stream ends after the error");
    // Compaction expires a watcher's place too.
    let now = s.sim.resource_version();
    s.sim.create(cm("z", json!({}))).unwrap();
    s.sim.compact();
    let mut w = s
        .watch(&format!(
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={now}"
        ))
        .await;
    assert_eq!(w.next().await.unwrap()["object"]["code"], 410);
}

#[tokio::test]
async fn streaming_list_ends_initial_events_with_a_bookmark() {
    let s = start(Sim::with_demo_workload()).await;
    let mut w = s
        .watch("/api/v1/namespaces/demo/configmaps?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")
        .await;
    let real = fixture_lines("watch/configmaps.streaming-list.jsonl");
    let first = w.next().await.unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(keys(&first["object"]), keys(&real[0]["object"]));
    let end = w.next().await.unwrap();
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"],
        real[2]["object"]["metadata"]["annotations"]
    );
    assert_eq!(
        keys(&end["object"]["metadata"]),
        keys(&real[2]["object"]["metadata"])
    );
    assert_eq!(rv(&end), s.sim.resource_version());
}

#[tokio::test]
async fn shutdown_ends_watches_and_the_server() {
    let s = start(Sim::new()).await;
    let mut w = s
        .watch("/api/v1/configmaps?watch=true&resourceVersion=1")
        .await;
    // The four system namespaces are not configmaps: nothing to replay.
    s.sim.create(cm("a", json!({}))).unwrap();
    assert_eq!(w.next().await.unwrap()["type"], "ADDED");
    s.shutdown.cancel();
    assert!(w.next().await.is_none());
    tokio::time::timeout(common::WAIT, s.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn table_watch_for_kubectl_get_watch() {
    let s = start(Sim::with_demo_workload()).await;
    let resp = s
        .open(
            http::Method::GET,
            "/api/v1/namespaces/demo/pods?watch=true",
            &[("accept", "application/json;as=Table;g=meta.k8s.io;v=v1")],
            "",
        )
        .await;
    assert_eq!(resp.status(), http::StatusCode::OK);
    let body = http_body_util::BodyExt::frame(&mut resp.into_body())
        .await
        .unwrap()
        .unwrap();
    let line = body.into_data().unwrap();
    let ev: serde_json::Value =
        serde_json::from_slice(line.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(ev["object"]["kind"], "Table");
    assert_eq!(ev["object"]["rows"].as_array().unwrap().len(), 1);
}
