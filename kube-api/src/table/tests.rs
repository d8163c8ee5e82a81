use super::*;

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-22T04:26:36Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/../kube-sim/fixtures/objects/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn res(plural: &'static str) -> Resource<'static> {
    let (group, kind) = match plural {
        "pods" => ("", "Pod"),
        "deployments" => ("apps", "Deployment"),
        "replicasets" => ("apps", "ReplicaSet"),
        "leases" => ("coordination.k8s.io", "Lease"),
        _ => ("", ""),
    };
    Resource {
        group,
        version: "v1",
        plural,
        kind,
    }
}

fn build(plural: &'static str, objects: &[&Value], rv: &str, include: IncludeObject) -> Value {
    table(
        res(plural),
        objects.iter().copied(),
        json!({"resourceVersion": rv}),
        include,
        now(),
    )
}

// From kube-sim.

#[test]
fn accept_header_detection() {
    assert!(wants_table(
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
    ));
    assert!(wants_table("application/json;as=Table;g=meta.k8s.io;v=v1"));
    assert!(!wants_table("application/json"));
    assert!(!wants_table(
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
    ));
}

// From the sidecar's facade.
#[test]
fn accept_header_detection_in_the_facade() {
    assert!(wants_table(
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
    ));
    assert!(!wants_table("application/json"));
    assert!(!wants_table(
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    ));
}

#[test]
fn human_durations() {
    let d = chrono::Duration::seconds;
    assert_eq!(human_duration(d(3)), "3s");
    assert_eq!(human_duration(d(119)), "119s");
    assert_eq!(human_duration(d(150)), "2m30s");
    assert_eq!(human_duration(d(600)), "10m");
    assert_eq!(human_duration(d(3 * 3600 + 5 * 60)), "3h5m");
    assert_eq!(human_duration(d(30 * 3600)), "30h");
    assert_eq!(human_duration(d(3 * 86400)), "3d");
    assert_eq!(human_duration(d(400 * 86400)), "400d");
    assert_eq!(human_duration(d(-5)), "<invalid>");
}

// From the sidecar's facade.

#[test]
fn human_durations_like_kubectl() {
    let d = chrono::Duration::seconds;
    assert_eq!(human_duration(d(5)), "5s");
    assert_eq!(human_duration(d(119)), "119s");
    assert_eq!(human_duration(d(180)), "3m");
    assert_eq!(human_duration(d(190)), "3m10s");
    assert_eq!(human_duration(d(60 * 45)), "45m");
    assert_eq!(human_duration(d(3600 * 5 + 60 * 7)), "5h7m");
    assert_eq!(human_duration(d(3600 * 20)), "20h");
    assert_eq!(human_duration(d(86400 * 2)), "2d");
    assert_eq!(human_duration(d(86400 * 3 + 3600 * 4)), "3d4h");
    assert_eq!(human_duration(d(86400 * 30)), "30d");
    assert_eq!(human_duration(d(86400 * 365 * 3)), "3y");
    assert_eq!(human_duration(d(-1)), "0s");
    assert_eq!(human_duration(d(-5)), "<invalid>");
}

#[test]
fn pods_table_matches_the_real_servers_leading_columns() {
    let list = fixture("pods.list.json");
    let want = fixture("pods.table.json");
    let items: Vec<&Value> = list["items"].as_array().unwrap().iter().collect();
    let got = build("pods", &items, "251", IncludeObject::Metadata);
    assert_eq!(got["kind"], "Table");
    assert_eq!(got["metadata"]["resourceVersion"], "251");
    let names = |t: &Value| -> Vec<String> {
        t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&got)[..7], names(&want)[..7]);
    assert_eq!(got["rows"].as_array().unwrap().len(), items.len());
    let (g, w) = (&got["rows"][0], &want["rows"][0]);
    // Name, Ready, Status, Restarts, Age, IP, Node as the server printed them.
    assert_eq!(
        g["cells"].as_array().unwrap()[..7],
        w["cells"].as_array().unwrap()[..7]
    );
    assert_eq!(g["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(g["object"]["metadata"]["namespace"], "demo");
    // The sidecar used to drop `managedFields` here; the recorded server keeps them.
    assert!(w["object"]["metadata"].get("managedFields").is_some());
    assert_eq!(
        g["object"]["metadata"].get("managedFields"),
        w["object"]["metadata"].get("managedFields")
    );
}

#[test]
fn pods_table_matches_the_real_server_entirely() {
    let list = fixture("pods.list.json");
    let want = fixture("pods.table.json");
    let items: Vec<&Value> = list["items"].as_array().unwrap().iter().collect();
    let got = build("pods", &items, "251", IncludeObject::Metadata);
    assert_eq!(got["columnDefinitions"], want["columnDefinitions"]);
    assert_eq!(got["metadata"], want["metadata"]);
    for (g, w) in got["rows"]
        .as_array()
        .unwrap()
        .iter()
        .zip(want["rows"].as_array().unwrap())
    {
        assert_eq!(g["cells"], w["cells"]);
    }
}

#[test]
fn every_kind_has_as_many_cells_as_columns() {
    for (file, resource) in [
        ("deployments.list.json", "deployments"),
        ("replicasets.list.json", "replicasets"),
        ("services.list.json", "services"),
        ("configmaps.list.json", "configmaps"),
        ("secrets.list.json", "secrets"),
        ("events.list.json", "events"),
        ("leases.list.json", "leases"),
        ("pods.list.json", "pods"),
    ] {
        let list = fixture(file);
        let items: Vec<&Value> = list["items"].as_array().unwrap().iter().collect();
        assert!(!items.is_empty(), "{file}");
        let t = build(resource, &items, "1", IncludeObject::None);
        let cols = t["columnDefinitions"].as_array().unwrap().len();
        for row in t["rows"].as_array().unwrap() {
            assert_eq!(row["cells"].as_array().unwrap().len(), cols, "{file}");
            assert!(row["object"].is_null());
        }
    }
}

#[test]
fn deployment_and_service_cells() {
    let list = fixture("deployments.list.json");
    let d = &list["items"][0];
    let c = cells(res("deployments"), d, now());
    assert_eq!(c[0], "web");
    assert_eq!(c[1], "0/2");
    assert_eq!(c[2], 2);
    assert_eq!(c[3], 0);
    let svc = json!({"metadata": {"name": "s"}, "spec": {"type": "NodePort", "clusterIP": "10.0.0.1",
        "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}});
    assert_eq!(
        service_cells(&svc),
        vec![
            json!("NodePort"),
            json!("10.0.0.1"),
            json!("<none>"),
            json!("80:30080/TCP,53/UDP")
        ]
    );
}

// Where the two earlier versions differed, the real printers' behaviour.

#[test]
fn pod_status_follows_kubectls_printer() {
    let pod = |status: Value| json!({"metadata": {"name": "p"}, "spec": {"containers": [{}, {}]}, "status": status});
    let state = |status: Value| pod_state(&pod(status), now());
    let running = json!({"ready": true, "restartCount": 1, "state": {"running": {}},
        "lastState": {"terminated": {"finishedAt": "2026-11-22T04:21:36Z"}}});
    let crashing = json!({"ready": false, "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}}});
    assert_eq!(
        state(json!({"phase": "Running", "containerStatuses": [running.clone(), crashing]})),
        ("1/2".into(), "CrashLoopBackOff".into(), "3 (5m ago)".into())
    );
    // Ready counts only containers that are also running.
    let ready_not_running = json!({"ready": true, "state": {}});
    assert_eq!(
        state(json!({"phase": "Running", "containerStatuses": [ready_not_running]})).0,
        "0/2"
    );
    assert_eq!(
        state(json!({"phase": "Pending", "initContainerStatuses": [{"state": {"waiting": {"reason": "PodInitializing"}}}]})).1,
        "Init:0/0"
    );
    assert_eq!(
        state(json!({"phase": "Running", "containerStatuses": [{"state": {"terminated": {"exitCode": 137, "signal": 9}}}]})).1,
        "Signal:9"
    );
    let completed = json!({"state": {"terminated": {"reason": "Completed", "exitCode": 0}}});
    assert_eq!(
        state(
            json!({"phase": "Running", "containerStatuses": [running, completed],
            "conditions": [{"type": "Ready", "status": "True"}]})
        )
        .1,
        "Running"
    );
    let mut deleting = pod(json!({"phase": "Running"}));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-22T04:26:00Z");
    assert_eq!(pod_state(&deleting, now()).1, "Terminating");
}

#[test]
fn services_and_events_print_as_the_server_does() {
    let lb = json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer", "externalIPs": ["1.2.3.4"]}});
    assert_eq!(service_external_ip(&lb), "1.2.3.4");
    let lb = json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer"}});
    assert_eq!(service_external_ip(&lb), "<pending>");
    let ext = json!({"metadata": {"name": "s"}, "spec": {"type": "ExternalName", "externalName": "db.example.com"}});
    assert_eq!(service_external_ip(&ext), "db.example.com");
    let svc = json!({"metadata": {"name": "s"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}});
    let c = cells(res("services"), &svc, now());
    assert_eq!(c[1], "ClusterIP");
    assert_eq!(c[4], "80/TCP");
    assert_eq!(c[6], "app=web");

    let ev = json!({"metadata": {"name": "web.1"}, "type": "Normal", "reason": "Pulled",
        "involvedObject": {"kind": "Pod", "name": "web-1", "fieldPath": "spec.containers{web}"},
        "source": {"component": "kubelet", "host": "node-1"}, "message": "pulled \n",
        "firstTimestamp": "2026-11-22T04:16:36Z", "lastTimestamp": "2026-11-22T04:26:26Z", "count": 3});
    assert_eq!(
        event_cells(&ev, now()),
        vec![
            json!("10s"),
            json!("Normal"),
            json!("Pulled"),
            json!("pod/web-1"),
            json!("spec.containers{web}"),
            json!("kubelet, node-1"),
            json!("pulled"),
            json!("10m"),
            json!(3),
            json!("web.1"),
        ]
    );
}

#[test]
fn rows_carry_what_include_object_asks_for() {
    let d = json!({"metadata": {"name": "web", "namespace": "demo"}, "spec": {"replicas": 1}});
    let t = build("deployments", &[&d], "7", IncludeObject::Object);
    assert_eq!(t["rows"][0]["object"]["kind"], "Deployment");
    assert_eq!(t["rows"][0]["object"]["apiVersion"], "apps/v1");
    assert_eq!(t["rows"][0]["object"]["spec"]["replicas"], 1);
    let t = build("deployments", &[&d], "7", IncludeObject::None);
    assert!(t["rows"][0].as_object().unwrap()["object"].is_null());
    assert_eq!(IncludeObject::parse(Some("None")), IncludeObject::None);
    assert_eq!(IncludeObject::parse(Some("Object")), IncludeObject::Object);
    assert_eq!(IncludeObject::parse(None), IncludeObject::Metadata);
}
