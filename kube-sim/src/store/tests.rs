//! Unit tests of the store (programmatic API); HTTP behaviour is tested in `tests/`.

use serde_json::json;

use super::*;

fn cm(name: &str, data: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"k": data}})
}

#[test]
fn new_has_system_namespaces() {
    let sim = Sim::new();
    let names: Vec<_> = sim
        .list("namespaces", None)
        .iter()
        .map(|n| n["metadata"]["name"].clone())
        .collect();
    assert_eq!(
        names,
        vec![
            json!("default"),
            json!("kube-node-lease"),
            json!("kube-public"),
            json!("kube-system")
        ]
    );
    assert_eq!(sim.resource_version(), 4);
}

#[test]
fn server_sets_fields_and_rv_increases() {
    let sim = Sim::new();
    let a = sim.create(cm("a", "1")).unwrap();
    assert_eq!(a["metadata"]["resourceVersion"], "5");
    assert_eq!(a["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert!(
        a["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    let err = sim.create(cm("a", "1")).unwrap_err();
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    let b = sim.upsert(cm("a", "2")).unwrap();
    assert_eq!(b["metadata"]["resourceVersion"], "6");
    assert_eq!(b["metadata"]["uid"], a["metadata"]["uid"]);
    // Unchanged upsert is no write.
    sim.upsert(cm("a", "2")).unwrap();
    assert_eq!(sim.resource_version(), 6);
    let d = sim.delete("configmaps", Some("default"), "a").unwrap();
    assert_eq!(d["status"], "Success");
    assert_eq!(
        sim.delete("configmaps", Some("default"), "a")
            .unwrap_err()
            .code,
        404
    );
}

#[test]
fn namespace_must_exist() {
    let sim = Sim::new();
    let mut o = cm("a", "1");
    o["metadata"]["namespace"] = json!("nope");
    let err = sim.create(o).unwrap_err();
    assert_eq!(err.code, 404);
    assert_eq!(err.message, "namespaces \"nope\" not found");
}

#[test]
fn generation_follows_spec_changes() {
    let sim = Sim::with_demo_workload();
    let res = resources::by_plural("deployments").unwrap();
    let web = sim.get("deployments", Some("demo"), "web").unwrap();
    assert_eq!(web["metadata"]["generation"], 1);
    let out = sim
        .patch_in(
            res,
            Some("demo"),
            "web",
            PatchType::Merge,
            &json!({"metadata": {"labels": {"x": "y"}}}),
            Subresource::Main,
            &WriteOptions::default(),
        )
        .unwrap();
    assert_eq!(
        out["metadata"]["generation"], 1,
        "metadata changes keep generation"
    );
    let out = sim
        .patch_in(
            res,
            Some("demo"),
            "web",
            PatchType::Merge,
            &json!({"spec": {"replicas": 5}}),
            Subresource::Main,
            &WriteOptions::default(),
        )
        .unwrap();
    assert_eq!(out["metadata"]["generation"], 2);
    assert_eq!(out["status"]["readyReplicas"], 5);
}

#[test]
fn stale_resource_version_conflicts() {
    let sim = Sim::new();
    let res = resources::by_plural("configmaps").unwrap();
    let a = sim.create(cm("a", "1")).unwrap();
    let mut stale = a.clone();
    sim.replace_in(
        res,
        Some("default"),
        "a",
        cm("a", "2"),
        &WriteOptions::default(),
    )
    .unwrap();
    stale["data"]["k"] = json!("3");
    let err = sim
        .replace_in(res, Some("default"), "a", stale, &WriteOptions::default())
        .unwrap_err();
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
}

#[test]
fn compact_expires_old_versions() {
    let sim = Sim::with_config(SimConfig::default().history(3));
    let res = resources::by_plural("configmaps").unwrap();
    let filter = WatchFilter {
        res,
        namespace: None,
        selectors: Default::default(),
    };
    for i in 0..5 {
        sim.create(cm(&format!("c{i}"), "x")).unwrap();
    }
    // rv 9 now; history keeps 7..=9, so 6 is the oldest valid start.
    assert!(sim.watch_start(&filter, Some(6)).is_ok());
    assert_eq!(sim.watch_start(&filter, Some(5)).unwrap_err().code, 410);
    let (events, cursor) = sim.events_since(&filter, 6).unwrap();
    assert_eq!(events.len(), 3);
    assert_eq!(cursor, 9);
    sim.compact();
    assert_eq!(sim.events_since(&filter, 8).unwrap_err().reason, "Expired");
}
