//! `spinlink status` against a running chain, as a script or a readiness
//! check runs it: exit 0 and the account shown ready while all is well;
//! once the agent is stopped, a non-zero exit and the account shown stale;
//! and a clear error with its own exit code when no sidecar answers.

mod support;

use std::net::SocketAddr;
use std::process::{Command, Output};

use spinlink_tls::dev::{DevPki, dev_agent_identity};
use support::scale::{self, agent_yaml, gateway_yaml, ready_at, start_agent, start_gateway};
use support::store::SharedStore;
use support::{SPINLINK, wait_for};

/// `spinlink status --server http://<facade> <args>`, stdout piped (so
/// never coloured).
fn status(facade: SocketAddr, args: &[&str]) -> Output {
    Command::new(SPINLINK)
        .args(["status", "--server", &format!("http://{facade}")])
        .args(args)
        .env_remove("NO_COLOR")
        .env_remove("SPINLINK_SERVER")
        .output()
        .expect("running spinlink status")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The table's row for `account`, split into columns.
fn row(stdout: &str, account: &str) -> Option<Vec<String>> {
    stdout
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find(|cols| cols.first().is_some_and(|c| c == account))
}

#[test]
fn status_is_healthy_with_the_chain_up_and_not_once_the_agent_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
    let (_sim, kubeconfig) = support::kube_sim(dir);
    let store = SharedStore::new(dir, "spinlink_status");
    let sidecar = scale::Sidecar::start(dir, "s1", &store.url("s1"), 2);
    let policy = vec![("agent-1".to_owned(), vec!["prod".to_owned()])];
    let (_gateway, gateway_addr) = start_gateway(
        dir,
        "gw",
        &gateway_yaml("gw", &pki, &policy, &[sidecar.tunnel]),
    );
    let mut agent = start_agent(
        dir,
        "agent",
        &agent_yaml(
            "agent-1",
            &pki,
            gateway_addr.port(),
            &[("prod", &kubeconfig)],
        ),
    );
    wait_for("prod ready on the sidecar", || {
        ready_at(sidecar.facade, "prod").then_some(())
    });

    // Healthy at once: ready means every kind the agent watches has
    // synced, as the agent says (`CacheSynced`), not only those whose
    // listing the sidecar has seen start. Exit 0, and prod's row says so,
    // with who serves it.
    let healthy = status(sidecar.facade, &[]);
    assert!(
        healthy.status.success(),
        "{}\n{}",
        text(&healthy.stdout),
        text(&healthy.stderr)
    );
    let stdout = text(&healthy.stdout);
    assert!(!stdout.contains('\x1b'), "coloured into a pipe:\n{stdout}");
    let prod = row(&stdout, "prod").unwrap_or_else(|| panic!("no row for prod:\n{stdout}"));
    assert_eq!(prod[1], "Ready", "{stdout}");
    assert_eq!(prod[2], dev_agent_identity("agent-1"), "{stdout}");
    assert_eq!(prod[3], "s1", "{stdout}");
    assert!(
        stdout.contains(&dev_agent_identity("agent-1")) && stdout.contains("AGENT"),
        "{stdout}"
    );

    let json = status(sidecar.facade, &["-o", "json"]);
    assert!(json.status.success(), "{}", text(&json.stderr));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["healthy"], true, "{v}");
    let account = &v["accounts"][0];
    assert_eq!(account["name"], "prod", "{v}");
    assert_eq!(account["state"], "online", "{v}");
    assert_eq!(account["health"]["status"], "Ready", "{v}");
    // The listing arrived as events, so the sidecar has applied some.
    assert!(account["lastEvent"].is_string(), "{v}");
    assert_eq!(v["agents"][0]["identity"], dev_agent_identity("agent-1"));

    let yaml = status(sidecar.facade, &["-o", "yaml"]);
    assert!(yaml.status.success(), "{}", text(&yaml.stderr));
    let v: serde_json::Value = serde_norway::from_slice(&yaml.stdout).unwrap();
    assert_eq!(v["accounts"][0]["name"], "prod", "{v}");

    let wide = status(sidecar.facade, &["-o", "wide"]);
    assert!(wide.status.success(), "{}", text(&wide.stderr));
    assert!(text(&wide.stdout).contains("REGISTRATION"));

    // The agent stops: the account goes stale, and status says so with
    // its exit code and on stderr.
    agent.kill();
    let (out, prod) = wait_for("status to see prod unhealthy", || {
        let out = status(sidecar.facade, &[]);
        let prod = row(&text(&out.stdout), "prod")?;
        (prod[1] != "Ready").then_some((out, prod))
    });
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        prod[1] == "Stale" || prod[1] == "Removed",
        "prod shown {:?}:\n{stdout}",
        prod[1]
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("unhealthy: account prod: "), "{stderr}");

    let json = status(sidecar.facade, &["-o", "json"]);
    assert_eq!(json.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["healthy"], false, "{v}");
    assert_eq!(v["accounts"][0]["online"], false, "{v}");
}

#[test]
fn status_says_when_no_sidecar_answers() {
    let nobody = SocketAddr::from(([127, 0, 0, 1], support::free_port()));
    let out = status(nobody, &[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot reach the sidecar at http://{nobody}")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}
