//! `discovery: {endpointSlices: ...}` against kube-sim: the gateway watches
//! a Service's EndpointSlices with kube-rs; every ready address is an
//! instance, and an instance whose slice goes away ends its streams with
//! `Unavailable`, the reopened stream reaching the new owner.
//!
//! When kube-sim does not serve `discovery.k8s.io/v1` EndpointSlices as a
//! built-in kind, a CustomResourceDefinition of the same group, version and
//! kind stands in, so the watch runs over kube-sim's real list/watch path.

mod common;

use common::*;
use serde_json::json;
use spinlink_kube_sim::{Server, Sim};
use tokio_util::sync::CancellationToken;
use tonic::Code;

fn endpoint_slice_crd() -> serde_json::Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "endpointslices.discovery.k8s.io"},
        "spec": {"group": "discovery.k8s.io", "scope": "Namespaced",
            "names": {"plural": "endpointslices", "kind": "EndpointSlice"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

fn slice(name: &str, port: u16, ready: bool) -> serde_json::Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default",
            "labels": {"kubernetes.io/service-name": "sidecar"}},
        "addressType": "IPv4",
        "ports": [{"name": "tunnel", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}]})
}

async fn wait_instances(gw: &RunningGateway, n: usize) {
    let mut changes = gw.upstreams.subscribe();
    tokio::time::timeout(WAIT, async {
        while gw.upstreams.instances().len() != n {
            changes.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} instances, not {n}", gw.upstreams.instances().len()));
}

#[tokio::test]
async fn endpoint_slices_are_watched_and_a_gone_instance_hands_over() {
    let pki = pki();
    let a = FakeSidecar::plain().await;
    let b = FakeSidecar::plain().await;
    let sim = Sim::new();
    if sim.create(slice("sidecar-a", a.addr.port(), true)).is_err() {
        sim.create(endpoint_slice_crd()).unwrap();
        sim.create(slice("sidecar-a", a.addr.port(), true)).unwrap();
    }
    sim.create(slice("sidecar-b", b.addr.port(), true)).unwrap();
    // Unready endpoints are not instances.
    sim.create(slice("sidecar-c", 9, false)).unwrap();
    let stop = CancellationToken::new();
    let server = Server::bind(sim.clone(), "127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let kubeconfig = pki.dir.path().join("sim.kubeconfig");
    spinlink_kube_sim::write_kubeconfig(&kubeconfig, &server.url(), "sim", None).unwrap();
    tokio::spawn(server.run(stop.clone()));

    let gw = start_gateway(&tls_gateway_yaml(
        &pki.pki,
        &format!(
            "upstreams:\n  - url: http://sidecar.default.svc:7001\n    discovery:\n      \
             endpointSlices: {{service: sidecar, namespace: default, portName: tunnel, kubeconfig: {}}}\n\
             upstreamPool: {{healthCheck: {{intervalSeconds: 0}}}}\n",
            kubeconfig.display()
        ),
    ))
    .await;
    wait_instances(&gw, 2).await;
    let mut urls: Vec<String> = gw
        .upstreams
        .instances()
        .iter()
        .map(|i| i.url().to_owned())
        .collect();
    urls.sort();
    let mut want = vec![a.url(), b.url()];
    want.sort();
    assert_eq!(urls, want);

    let channel = agent_a1(gw.addr, &pki.pki).await;
    let token = token_for(&channel, "dev-1").await;
    let (_tx, mut down) = acked_cache(&channel, "dev-1", &token).await;
    let owner = gw.upstreams.assigned("dev-1").unwrap();
    let (gone_slice, stays) = if owner == a.url() {
        ("sidecar-a", &b)
    } else {
        ("sidecar-b", &a)
    };
    // The owner's pod goes away: its slice is deleted.
    sim.delete("endpointslices", Some("default"), gone_slice)
        .unwrap();
    wait_instances(&gw, 1).await;
    let err = next_ack(&mut down).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let (_tx, _down) = acked_cache(&channel, "dev-1", &token).await;
    assert_eq!(gw.upstreams.assigned("dev-1").unwrap(), stays.url());
    stop.cancel();
}
