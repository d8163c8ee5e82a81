//! Every series the shipped dashboards and alerts read exists on a running
//! chain. kube-sim, a sidecar (TLS tunnel and peer port, a metrics
//! listener, kubeconfig registration), a gateway and an agent run as the
//! real binary, with admin ports; the test makes them do what each panel
//! shows — kubectl reads from the cache and a relayed write, a watch, an
//! account the policy refuses, a failed TLS handshake, a peer-port
//! stranger, and a second gateway whose certificate the sidecar does not
//! take, so it refuses that gateway's streams and the gateway ejects it —
//! then reads each component's `/metrics` and checks every metric name,
//! label matcher and grouping label of every alert and dashboard query.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;

use serde_json::Value;
use spinlink_tls::dev::{DevPki, dev_agent_identity, dev_gateway_identity};
use support::monitoring::{self, alerts, dashboard_files, dashboard_queries, rules_file};
use support::scale::agent_yaml;
use support::{Proc, http, try_http, wait_for, write_file, write_kubeconfig};

fn p(path: PathBuf) -> String {
    path.display().to_string()
}

/// The sample of `name` with `labels` (exactly `{…}` as exported), if any.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// A gateway in front of `upstreams` (sidecar tunnel URLs), presenting
/// `client` (a certificate of `pki`) to them, letting agent-1 serve prod,
/// with an admin port (announced as `gateway-admin`) and health checks
/// every second.
fn gateway_yaml(id: &str, pki: &DevPki, client: &str, upstreams: &[String]) -> String {
    let upstreams: String = upstreams.iter().map(|u| format!("- url: {u}\n")).collect();
    format!(
        "gatewayId: {id}\nlisten: 127.0.0.1:0\nshutdownGraceSeconds: 2\n\
         tls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
         policy:\n- identities: [\"{}\"]\n  accounts: [prod]\n\
         upstreams:\n{upstreams}\
         upstreamTls:\n  caFile: {}\n  certFile: {}\n  keyFile: {}\n\
         upstreamPool:\n  healthCheck:\n    intervalSeconds: 1\n    unhealthyThreshold: 1\n\
         admin:\n  listen: 127.0.0.1:0\n",
        p(pki.cert("gateway")),
        p(pki.key("gateway")),
        p(pki.ca_cert()),
        dev_agent_identity("agent-1"),
        p(pki.ca_cert()),
        p(pki.cert(client)),
        p(pki.key(client)),
    )
}

fn metrics(addr: SocketAddr) -> Option<String> {
    match try_http(addr, "GET", "/metrics", &[]) {
        Some((200, text)) => Some(text),
        _ => None,
    }
}

#[test]
fn every_series_of_the_dashboards_and_alerts_exists_on_a_running_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
    let (_sim, kubeconfig) = support::kube_sim(dir);

    let kubeconfigs = dir.join("registered");
    let sidecar_cfg = write_file(
        dir,
        "sidecar.yaml",
        &format!(
            "instanceId: s1\n\
             tunnel:\n  listen: 127.0.0.1:0\n  tls:\n    certFile: {}\n    keyFile: {}\n    \
             clientCaFile: {}\n    gatewayIdentities: [\"{}\"]\n\
             facade:\n  listen: 127.0.0.1:0\n\
             metrics:\n  listen: 127.0.0.1:0\n\
             store:\n  url: sqlite://{}\n\
             clouddriver:\n  kubeconfigDir: {}\n{}",
            p(pki.cert("sidecar")),
            p(pki.key("sidecar")),
            p(pki.ca_cert()),
            dev_gateway_identity(),
            dir.join("sidecar.db").display(),
            kubeconfigs.display(),
            support::scale::peer_yaml(dir),
        ),
    );
    let mut sidecar = Proc::start("sidecar", dir, &["sidecar", "--config", &sidecar_cfg]);
    let tunnel = sidecar.listening("sidecar-tunnel");
    let facade = sidecar.listening("sidecar-facade");
    let peer = sidecar.listening("sidecar-peer");
    let sidecar_metrics = sidecar.listening("sidecar-metrics");

    let gateway_cfg = write_file(
        dir,
        "gateway.yaml",
        &gateway_yaml(
            "gw",
            &pki,
            "gateway",
            &[format!("https://localhost:{}", tunnel.port())],
        ),
    );
    let mut gateway = Proc::start("gateway", dir, &["gateway", "--config", &gateway_cfg]);
    let gateway_addr = gateway.listening("gateway");
    let gateway_admin = gateway.listening("gateway-admin");

    // The policy grants prod only: `denied` is refused in every Hello.
    let agent_cfg = write_file(
        dir,
        "agent.yaml",
        &format!(
            "{}admin:\n  listen: 127.0.0.1:0\n",
            agent_yaml(
                "agent-1",
                &pki,
                gateway_addr.port(),
                &[("prod", &kubeconfig), ("denied", &kubeconfig)],
            )
        ),
    );
    let mut agent = Proc::start("agent", dir, &["agent", "--config", &agent_cfg]);
    let agent_admin = agent.listening("agent-admin");
    wait_for("prod ready on the sidecar", || {
        support::scale::ready_at(facade, "prod").then_some(())
    });
    // Its first listing is counted by this process only: the agent that
    // comes back below resumes its watches instead.
    let listing_text = wait_for("the agent's listings counted", || {
        let text = metrics(agent_admin)?;
        text.contains("spinlink_agent_relists_total{")
            .then_some(text)
    });
    // The agent comes back to the cache the sidecar kept: a handover.
    agent.kill();
    wait_for("prod offline", || {
        let v = support::scale::account(facade, "prod")?;
        (v["online"] == false).then_some(())
    });
    let mut agent = Proc::start("agent-again", dir, &["agent", "--config", &agent_cfg]);
    let agent_admin = agent.listening("agent-admin");
    wait_for("prod ready again", || {
        support::scale::ready_at(facade, "prod").then_some(())
    });

    // Clouddriver's traffic: reads from the cache, a relayed write, a
    // watch served from the cache.
    let via = dir.join("prod.kubeconfig");
    write_kubeconfig(&via, &format!("http://{facade}/accounts/prod"));
    let kubectl = support::Kubectl::new(dir, "via-prod", &via);
    kubectl.ok(&["get", "pods", "-A"]);
    kubectl.ok(&["create", "configmap", "observed", "-n", "default"]);
    let (status, _) = http(
        facade,
        "GET",
        "/accounts/prod/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1",
        &[],
    );
    assert_eq!(status, 200);

    // Strangers: bytes that are not TLS at the gateway (a failed
    // handshake) and at the peer port.
    for addr in [gateway_addr, peer] {
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        drop(s);
    }

    // A second gateway, presenting an agent's certificate to the sidecar,
    // in front of it and of a spare sidecar: an agent that dials it has
    // its streams refused by the sidecar (not a gateway identity), and
    // once the spare has been healthy and stops, the gateway ejects it.
    let spare_cfg = write_file(
        dir,
        "spare.yaml",
        "instanceId: spare\ntunnel:\n  listen: 127.0.0.1:0\n  insecure: true\nfacade:\n  listen: 127.0.0.1:0\n",
    );
    let mut spare = Proc::start("spare", dir, &["sidecar", "--config", &spare_cfg]);
    let spare_tunnel = spare.listening("sidecar-tunnel");
    let rogue_cfg = write_file(
        dir,
        "rogue.yaml",
        &gateway_yaml(
            "rogue",
            &pki,
            "agent-agent-1",
            &[
                format!("https://localhost:{}", tunnel.port()),
                format!("http://{spare_tunnel}"),
            ],
        ),
    );
    let mut rogue = Proc::start("rogue", dir, &["gateway", "--config", &rogue_cfg]);
    let rogue_addr = rogue.listening("gateway");
    let rogue_admin = rogue.listening("gateway-admin");
    let spare_label =
        format!("spinlink_gateway_upstream_available{{upstream=\"http://{spare_tunnel}\"}} ");
    wait_for("the spare sidecar in rotation", || {
        (sample(&metrics(rogue_admin)?, &spare_label) == Some(1.0)).then_some(())
    });
    spare.kill();
    let stray_cfg = write_file(
        dir,
        "stray.yaml",
        &agent_yaml("agent-1", &pki, rogue_addr.port(), &[("prod", &kubeconfig)]),
    );
    let _stray = Proc::start("stray", dir, &["agent", "--config", &stray_cfg]);

    // Each component's scrape once it shows what was done above.
    let agent_text = wait_for("the agent's metrics", || {
        let text = metrics(agent_admin)?;
        (sample(&text, "spinlink_agent_connected ") == Some(1.0)
            && text.contains("spinlink_agent_relays_total{")
            && text.contains("state=\"refused\"} 1"))
        .then_some(text)
    });
    let gateway_text = wait_for("the gateway's metrics", || {
        let text = metrics(gateway_admin)?;
        (text.contains("spinlink_gateway_refusals_total{reason=\"policy\"}")
            && text.contains("spinlink_gateway_auth_failures_total{reason=\"handshake\"}"))
        .then_some(text)
    });
    let rogue_text = wait_for("the rogue gateway to eject the sidecar", || {
        let text = metrics(rogue_admin)?;
        text.contains("spinlink_gateway_upstream_ejections_total{")
            .then_some(text)
    });
    let sidecar_text = wait_for("the sidecar's metrics", || {
        let text = metrics(sidecar_metrics)?;
        (text.contains("spinlink_sidecar_tunnel_refused_total{reason=\"not_gateway\"}")
            && text.contains("spinlink_sidecar_peer_refused_total{")
            && text.contains("spinlink_sidecar_registrations_total{")
            && text.contains("spinlink_sidecar_handovers_total{"))
        .then_some(text)
    });
    let facade_text = http(facade, "GET", "/metrics", &[]).1;

    // What the product promises beyond existing: the values are right.
    let not_after =
        |file: &str| spinlink_tls::identity::leaf_not_after(&pki.cert(file)).unwrap() as f64;
    assert_eq!(
        sample(
            &agent_text,
            "spinlink_agent_certificate_not_after_seconds{certificate=\"client\"} "
        ),
        Some(not_after("agent-agent-1")),
        "{agent_text}"
    );
    assert_eq!(
        sample(
            &sidecar_text,
            "spinlink_sidecar_certificate_not_after_seconds{listener=\"tunnel\"} "
        ),
        Some(not_after("sidecar")),
        "{sidecar_text}"
    );
    assert!(
        sidecar_text.contains("spinlink_sidecar_certificate_not_after_seconds{listener=\"peer\"}"),
        "{sidecar_text}"
    );
    // Streaming until its first listing is in, synced after: either is on.
    let state = |name: &str| {
        sample(
            &agent_text,
            &format!("spinlink_agent_account_state{{account=\"prod\",state=\"{name}\"}} "),
        )
    };
    assert!(
        state("synced") == Some(1.0) || state("streaming") == Some(1.0),
        "{agent_text}"
    );
    assert!(
        sidecar_text
            .contains("spinlink_sidecar_account_state{account=\"prod\",state=\"online\"} 1"),
        "{sidecar_text}"
    );
    // The metrics listener serves the facade's metrics and nothing else.
    assert!(facade_text.contains("spinlink_sidecar_cache_objects{account=\"prod\"}"));
    let (status, _) = http(sidecar_metrics, "GET", "/v1/accounts/prod", &[]);
    assert_eq!(status, 404);
    let (status, _) = http(sidecar_metrics, "GET", "/accounts/prod/api/v1/pods", &[]);
    assert_eq!(status, 404);

    // Every series every alert and dashboard reads.
    let mut series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for text in [
        &listing_text,
        &agent_text,
        &gateway_text,
        &rogue_text,
        &sidecar_text,
    ] {
        for (name, labels) in monitoring::exposition(text) {
            series.entry(name).or_default().extend(labels);
        }
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for chart in ["spinlink", "spinlink-agent"] {
        for (name, expr) in alerts(&rules_file(chart)) {
            problems.extend(monitoring::missing(
                &format!("alert {name}"),
                &expr,
                &series,
            ));
            checked += 1;
        }
        for file in dashboard_files(chart) {
            let d: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            let title = d["title"].as_str().unwrap_or_default().to_owned();
            for (what, expr) in dashboard_queries(&d) {
                problems.extend(monitoring::missing(
                    &format!("{title}: {what}"),
                    &expr,
                    &series,
                ));
                checked += 1;
            }
        }
    }
    assert!(checked > 60, "only {checked} expressions checked");
    assert!(
        problems.is_empty(),
        "{} problems:\n{}\n\nseries seen: {:#?}",
        problems.len(),
        problems.join("\n"),
        series
    );
}
