//! The agent between kube-sim and a fake gateway: the initial sync of every
//! kind, live events, relayed reads and watches, and Secret values never
//! leaving the agent.

mod common;

use common::{FakeGateway, Records, all_bytes};
use serde_json::json;
use spinlink_agent::{AccountState, Agent, Config};
use spinlink_kube_sim::{Server, Sim};
use spinlink_proto::v1::{self, cache_up, relay_down, relay_up, watch_event};
use tokio_util::sync::CancellationToken;

/// Appears only inside Secret values; must never reach the gateway.
const SENTINEL: &str = "S3NT1NEL-do-not-leak-7c41";
/// base64 of [`SENTINEL`], as it sits in `data`.
const SENTINEL_B64: &str = "UzNOVDFORUwtZG8tbm90LWxlYWstN2M0MQ==";

fn sentinel_secret(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": "demo",
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration":
                    format!("{{\"stringData\":{{\"k\":\"{SENTINEL}\"}}}}")
            }
        },
        "type": "Opaque",
        "data": { "k": SENTINEL_B64 },
    })
}

fn no_sentinel(r: &Records) {
    let bytes = all_bytes(r);
    assert!(!bytes.contains(SENTINEL), "sentinel leaked");
    assert!(!bytes.contains(SENTINEL_B64), "base64 sentinel leaked");
}

fn events(r: &Records) -> Vec<(watch_event::Type, String, serde_json::Value)> {
    r.cache_up
        .iter()
        .filter_map(|(_, m)| match &m.msg {
            Some(cache_up::Msg::Event(e)) if e.r#type() != watch_event::Type::Bookmark => Some((
                e.r#type(),
                e.kind
                    .as_ref()
                    .map(|k| k.resource.clone())
                    .unwrap_or_default(),
                serde_json::from_slice(&e.object).unwrap(),
            )),
            _ => None,
        })
        .collect()
}

fn has_event(r: &Records, ty: watch_event::Type, resource: &str, name: &str) -> bool {
    events(r)
        .iter()
        .any(|(t, res, obj)| *t == ty && res == resource && obj["metadata"]["name"] == name)
}

/// The response to relayed request `id`: status, and the body if complete.
fn response(r: &Records, id: u64) -> (Option<u32>, Vec<u8>, bool) {
    let mut status = None;
    let mut body = Vec::new();
    let mut done = false;
    for (_, m) in &r.relay_up {
        match &m.msg {
            Some(relay_up::Msg::Head(h)) if h.id == id => status = Some(h.status),
            Some(relay_up::Msg::Body(c)) if c.id == id => {
                body.extend_from_slice(&c.data);
                done |= c.end_stream;
            }
            Some(relay_up::Msg::Error(e)) if e.id == id => panic!("request {id} failed: {e:?}"),
            _ => {}
        }
    }
    (status, body, done)
}

fn get(id: u64, path: &str, query: &str) -> v1::RelayDown {
    v1::RelayDown {
        msg: Some(relay_down::Msg::Head(v1::RequestHead {
            id,
            method: "GET".into(),
            path: path.into(),
            query: query.into(),
            headers: vec![v1::Header {
                name: "Accept".into(),
                value: b"application/json".to_vec(),
            }],
            deadline_unix_millis: 0,
            end_stream: true,
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_events_relay_and_no_secret_values() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::with_demo_workload();
    sim.create(sentinel_secret("sentinel")).unwrap();
    let server = Server::bind(sim.clone(), "127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let kubeconfig = dir.path().join("sim.kubeconfig");
    spinlink_kube_sim::write_kubeconfig(&kubeconfig, &server.url(), "sim", None).unwrap();
    let sim_stop = CancellationToken::new();
    let sim_task = tokio::spawn(server.run(sim_stop.clone()));

    let gw = FakeGateway::start(&dir.path().join("pki")).await;
    let config =
        Config::from_yaml_str(&gw.agent_yaml(&[("dev", &kubeconfig)]), "test.yaml").unwrap();
    let agent = Agent::new(config).unwrap();
    let mut state = agent.state();
    let shutdown = CancellationToken::new();
    let agent_task = tokio::spawn(agent.run(shutdown.clone()));

    // Initial sync: discovery, then SyncStart … SyncEnd for each discovered kind.
    // Every kind kube-sim's discovery advertises (59 preferred versions).
    gw.wait_for("SyncEnd for 59 kinds", |r| {
        r.cache_up
            .iter()
            .filter(|(_, m)| matches!(m.msg, Some(cache_up::Msg::SyncEnd(_))))
            .count()
            >= 59
    })
    .await;
    state
        .wait_for(|s| s.accounts.get("dev") == Some(&AccountState::Synced))
        .await
        .unwrap();
    gw.with(|r| {
        let kinds = |want: fn(&cache_up::Msg) -> Option<&v1::Kind>| {
            let mut v: Vec<String> = r
                .cache_up
                .iter()
                .filter_map(|(_, m)| m.msg.as_ref().and_then(want))
                .map(|k| format!("{}/{}/{}", k.group, k.version, k.resource))
                .collect();
            v.sort();
            v
        };
        // Every listable and watchable kind kube-sim's discovery advertises
        // (preferred versions): kube-sim serves them all, as a real server does.
        let expected = vec![
            "/v1/configmaps",
            "/v1/endpoints",
            "/v1/events",
            "/v1/limitranges",
            "/v1/namespaces",
            "/v1/nodes",
            "/v1/persistentvolumeclaims",
            "/v1/persistentvolumes",
            "/v1/pods",
            "/v1/podtemplates",
            "/v1/replicationcontrollers",
            "/v1/resourcequotas",
            "/v1/secrets",
            "/v1/serviceaccounts",
            "/v1/services",
            "admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
            "admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings",
            "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            "admissionregistration.k8s.io/v1/validatingadmissionpolicies",
            "admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
            "admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            "apiextensions.k8s.io/v1/customresourcedefinitions",
            "apiregistration.k8s.io/v1/apiservices",
            "apps/v1/controllerrevisions",
            "apps/v1/daemonsets",
            "apps/v1/deployments",
            "apps/v1/replicasets",
            "apps/v1/statefulsets",
            "autoscaling/v2/horizontalpodautoscalers",
            "batch/v1/cronjobs",
            "batch/v1/jobs",
            "certificates.k8s.io/v1/certificatesigningrequests",
            "coordination.k8s.io/v1/leases",
            "discovery.k8s.io/v1/endpointslices",
            "events.k8s.io/v1/events",
            "flowcontrol.apiserver.k8s.io/v1/flowschemas",
            "flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations",
            "networking.k8s.io/v1/ingressclasses",
            "networking.k8s.io/v1/ingresses",
            "networking.k8s.io/v1/ipaddresses",
            "networking.k8s.io/v1/networkpolicies",
            "networking.k8s.io/v1/servicecidrs",
            "node.k8s.io/v1/runtimeclasses",
            "policy/v1/poddisruptionbudgets",
            "rbac.authorization.k8s.io/v1/clusterrolebindings",
            "rbac.authorization.k8s.io/v1/clusterroles",
            "rbac.authorization.k8s.io/v1/rolebindings",
            "rbac.authorization.k8s.io/v1/roles",
            "resource.k8s.io/v1/deviceclasses",
            "resource.k8s.io/v1/resourceclaims",
            "resource.k8s.io/v1/resourceclaimtemplates",
            "resource.k8s.io/v1/resourceslices",
            "scheduling.k8s.io/v1/priorityclasses",
            "storage.k8s.io/v1/csidrivers",
            "storage.k8s.io/v1/csinodes",
            "storage.k8s.io/v1/csistoragecapacities",
            "storage.k8s.io/v1/storageclasses",
            "storage.k8s.io/v1/volumeattachments",
            "storage.k8s.io/v1/volumeattributesclasses",
        ];
        assert_eq!(
            kinds(|m| match m {
                cache_up::Msg::SyncStart(s) => s.kind.as_ref(),
                _ => None,
            }),
            expected
        );
        assert_eq!(
            kinds(|m| match m {
                cache_up::Msg::SyncEnd(s) => s.kind.as_ref(),
                _ => None,
            }),
            expected
        );
        for (_, m) in &r.cache_up {
            if let Some(cache_up::Msg::SyncEnd(end)) = &m.msg {
                assert!(!end.resource_version.is_empty(), "{end:?}");
            }
        }

        // Discovery came first after open.
        let Some(cache_up::Msg::Discovery(d)) = &r.cache_up[1].1.msg else {
            panic!("second message {:?}", r.cache_up[1].1)
        };
        let paths: Vec<_> = d.documents.iter().map(|d| d.path.as_str()).collect();
        for p in ["/version", "/api", "/api/v1", "/apis", "/apis/apps/v1"] {
            assert!(paths.contains(&p), "{p} missing from {paths:?}");
        }
        // Plain documents as JSON; `/api` and `/apis` also as the server's
        // aggregated discovery, under names no request path matches.
        for d in &d.documents {
            match d.path.strip_suffix(spinlink_proto::aggregated::PATH_SUFFIX) {
                Some(path) => {
                    assert!(path == "/api" || path == "/apis", "{}", d.path);
                    assert!(
                        d.content_type.starts_with(
                            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
                        ),
                        "{}",
                        d.content_type
                    );
                }
                None => assert_eq!(d.content_type, "application/json", "{}", d.path),
            }
        }
        assert!(
            paths.contains(&"/apis;as=APIGroupDiscoveryList"),
            "{paths:?}"
        );

        // Listed objects arrive as ADDED with apiVersion/kind filled in.
        let web = events(r)
            .into_iter()
            .find(|(t, res, o)| {
                *t == watch_event::Type::Added
                    && res == "deployments"
                    && o["metadata"]["name"] == "web"
            })
            .expect("deployment web");
        assert_eq!(web.2["apiVersion"], "apps/v1");
        assert_eq!(web.2["kind"], "Deployment");
        assert!(has_event(
            r,
            watch_event::Type::Added,
            "secrets",
            "sentinel"
        ));
        assert!(has_event(
            r,
            watch_event::Type::Added,
            "configmaps",
            "app-config"
        ));

        let seqs: Vec<u64> = r.cache_up.iter().map(|(_, m)| m.seq).collect();
        assert_eq!(
            seqs,
            (seqs[0]..seqs[0] + seqs.len() as u64).collect::<Vec<_>>()
        );
        no_sentinel(r);
    });

    // Changes after the sync arrive as the API server's events.
    sim.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "after-sync", "namespace": "demo"}, "data": {"x": "1"}}))
        .unwrap();
    gw.wait_for("event for after-sync", |r| {
        has_event(r, watch_event::Type::Added, "configmaps", "after-sync")
    })
    .await;
    sim.delete("configmaps", Some("demo"), "after-sync")
        .unwrap();
    gw.wait_for("delete of after-sync", |r| {
        has_event(r, watch_event::Type::Deleted, "configmaps", "after-sync")
    })
    .await;
    sim.create(sentinel_secret("sentinel-late")).unwrap();
    gw.wait_for("event for sentinel-late", |r| {
        has_event(r, watch_event::Type::Added, "secrets", "sentinel-late")
    })
    .await;

    // Relayed GET of an object, its head stamped with the agent's part.
    let before = spinlink_agent::relay::execute::unix_micros();
    gw.relay_down(
        "dev",
        get(1, "/api/v1/namespaces/demo/configmaps/app-config", ""),
    )
    .await;
    gw.wait_for("GET response", |r| response(r, 1).2).await;
    let after = spinlink_agent::relay::execute::unix_micros();
    gw.with(|r| {
        let (status, body, _) = response(r, 1);
        assert_eq!(status, Some(200));
        let obj: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(obj["metadata"]["name"], "app-config");
        assert_eq!(obj["data"]["mode"], "prod");
        let timing = r
            .relay_up
            .iter()
            .find_map(|(_, m)| match &m.msg {
                Some(relay_up::Msg::Head(h)) if h.id == 1 => h.timing,
                _ => None,
            })
            .expect("the head carries the agent's timing");
        assert!(
            before <= timing.started_unix_micros
                && timing.started_unix_micros <= timing.finished_unix_micros
                && timing.finished_unix_micros <= after,
            "{before} <= {timing:?} <= {after}"
        );
    });

    // Relayed GET and LIST of Secrets come back without values.
    gw.relay_down(
        "dev",
        get(2, "/api/v1/namespaces/demo/secrets/sentinel", ""),
    )
    .await;
    gw.relay_down("dev", get(3, "/api/v1/secrets", "")).await;
    gw.wait_for("secret responses", |r| response(r, 2).2 && response(r, 3).2)
        .await;
    gw.with(|r| {
        let (status, body, _) = response(r, 2);
        assert_eq!(status, Some(200));
        let obj: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(obj["metadata"]["name"], "sentinel");
        // The key is kept, its value a filler of the value's length.
        assert_eq!(
            obj["data"],
            json!({"k": spinlink_agent::scrub::filler(SENTINEL.len())})
        );
        let (_, body, _) = response(r, 3);
        let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(list["items"].as_array().unwrap().len() >= 3, "{list}");
        no_sentinel(r);
    });

    // Relayed watches stream events as they happen; secrets ones scrubbed.
    gw.relay_down(
        "dev",
        get(4, "/api/v1/namespaces/demo/configmaps", "watch=true"),
    )
    .await;
    gw.relay_down("dev", get(5, "/api/v1/namespaces/demo/secrets", "watch=1"))
        .await;
    gw.wait_for("watch heads", |r| {
        response(r, 4).0.is_some() && response(r, 5).0.is_some()
    })
    .await;
    sim.create(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "watched", "namespace": "demo"}}))
        .unwrap();
    sim.create(sentinel_secret("sentinel-watched")).unwrap();
    gw.wait_for("watched objects in the relayed watches", |r| {
        String::from_utf8_lossy(&response(r, 4).1).contains("\"watched\"")
            && String::from_utf8_lossy(&response(r, 5).1).contains("sentinel-watched")
    })
    .await;
    gw.with(|r| {
        assert!(!response(r, 4).2, "a watch does not end by itself");
        no_sentinel(r);
    });
    gw.relay_down(
        "dev",
        v1::RelayDown {
            msg: Some(relay_down::Msg::Cancel(v1::Cancel { id: 4 })),
        },
    )
    .await;

    // Still nothing leaked, in anything recorded.
    gw.with(no_sentinel);

    shutdown.cancel();
    tokio::time::timeout(common::WAIT, agent_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    sim_stop.cancel();
    let _ = tokio::time::timeout(common::WAIT, sim_task).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_are_forwarded_and_resync_lists_again() {
    let dir = tempfile::tempdir().unwrap();
    let config = spinlink_kube_sim::SimConfig::default()
        .bookmark_interval(std::time::Duration::from_millis(100));
    let sim = Sim::with_config(config);
    sim.add_demo_workload();
    let server = Server::bind(sim.clone(), "127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let kubeconfig = dir.path().join("sim.kubeconfig");
    spinlink_kube_sim::write_kubeconfig(&kubeconfig, &server.url(), "sim", None).unwrap();
    let stop = CancellationToken::new();
    let sim_task = tokio::spawn(server.run(stop.clone()));
    let gw = FakeGateway::start(&dir.path().join("pki")).await;
    let yaml = format!(
        "{}      kinds: [configmaps, pods]\n",
        gw.agent_yaml(&[("dev", &kubeconfig)])
    );
    let agent = Agent::new(Config::from_yaml_str(&yaml, "test.yaml").unwrap()).unwrap();
    let agent_task = tokio::spawn(agent.run(stop.clone()));

    let sync_starts = |r: &Records, resource: &str| {
        r.cache_up
            .iter()
            .filter(|(_, m)| {
                matches!(&m.msg, Some(cache_up::Msg::SyncStart(s))
                    if s.kind.as_ref().is_some_and(|k| k.resource == resource))
            })
            .count()
    };
    gw.wait_for("a bookmark for configmaps", |r| {
        r.cache_up.iter().any(|(_, m)| {
            matches!(&m.msg, Some(cache_up::Msg::Event(e))
                if e.r#type() == watch_event::Type::Bookmark
                    && !e.resource_version.is_empty()
                    && e.object.is_empty()
                    && e.kind.as_ref().is_some_and(|k| k.resource == "configmaps"))
        })
    })
    .await;
    gw.with(|r| {
        assert_eq!(
            (sync_starts(r, "configmaps"), sync_starts(r, "pods")),
            (1, 1)
        )
    });

    // The sidecar asks for configmaps again: only that kind lists again.
    let configmaps = gw.with(|r| {
        r.cache_up
            .iter()
            .find_map(|(_, m)| match &m.msg {
                Some(cache_up::Msg::SyncStart(s)) => {
                    s.kind.clone().filter(|k| k.resource == "configmaps")
                }
                _ => None,
            })
            .unwrap()
    });
    gw.cache_down(v1::CacheDown {
        msg: Some(v1::cache_down::Msg::Resync(v1::Resync {
            kinds: vec![configmaps],
        })),
    })
    .await;
    gw.wait_for("a second listing of configmaps", |r| {
        sync_starts(r, "configmaps") == 2
            && r.cache_up
                .iter()
                .filter(|(_, m)| matches!(m.msg, Some(cache_up::Msg::SyncEnd(_))))
                .count()
                >= 3
    })
    .await;
    gw.with(|r| assert_eq!(sync_starts(r, "pods"), 1));

    stop.cancel();
    tokio::time::timeout(common::WAIT, agent_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let _ = tokio::time::timeout(common::WAIT, sim_task).await;
    gw.stop().await;
}
