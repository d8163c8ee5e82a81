//! An Armory Scale Agent's configuration, unchanged: `spinlink agent` runs
//! `armory-agent.yml` (with its `armory-agent-local.yaml` override) as
//! Armory's documentation writes it — `clouddriver.grpc` naming the
//! gateway, `clouddriver.tls.*` with an encrypted PKCS#8 client key, many
//! kubeconfigs — and kubectl reaches the cluster through the chain.
//! Agent mode (`serviceAccount: true`) runs too, the pod's service account
//! mounted where Kubernetes mounts it, in a mount namespace of the agent's
//! own. `--check-config` and `migrate-config` are checked on the same files.

mod support;

use std::path::Path;
use std::process::Command;

use pkcs8::der::pem::LineEnding;
use pkcs8::pkcs5::pbes2;
use support::chain::{AgentFiles, Chain};
use support::{SPINLINK, write_file};

const KEY_PASSWORD: &str = "armory-key-password";

/// The agent's development key, encrypted as Armory's mTLS setup expects
/// it (PKCS#8, PBES2 with PBKDF2-SHA256 and AES-256-CBC); its path.
fn encrypt_key(plain: &Path, dir: &Path) -> String {
    let pem = std::fs::read_to_string(plain).unwrap();
    let (label, der) = pkcs8::SecretDocument::from_pem(&pem).unwrap();
    assert_eq!(label, "PRIVATE KEY", "the development key is PKCS#8");
    let info = pkcs8::PrivateKeyInfo::try_from(der.as_bytes()).unwrap();
    let params =
        pbes2::Parameters::pbkdf2_sha256_aes256cbc(2048, b"salt-of-8", b"iv-of-16-bytes!!")
            .unwrap();
    let encrypted = info.encrypt_with_params(params, KEY_PASSWORD).unwrap();
    let pem = encrypted
        .to_pem("ENCRYPTED PRIVATE KEY", LineEnding::LF)
        .unwrap();
    write_file(dir, "agent-encrypted.key", &pem)
}

/// Writes the Armory files for the chain: the main file (gateway, mTLS,
/// account `armory-a`, keys spinlink has no use for) and the override that
/// makes the account list `armory-a` and `armory-b`, each from its own
/// kubeconfig, in Armory's two spellings.
fn write_armory_files(dir: &Path, files: &AgentFiles, kubeconfig: &Path) -> String {
    let key = encrypt_key(&files.key, dir);
    for name in ["kubecfg-a.yaml", "kubecfg-b.yaml"] {
        std::fs::copy(kubeconfig, dir.join(name)).unwrap();
    }
    let d = dir.display();
    write_file(
        dir,
        "armory-agent-local.yaml",
        &format!(
            "kubernetes:\n  accounts:\n\
             \x20   - name: armory-a\n      kubeConfigFile: {d}/kubecfg-a.yaml\n\
             \x20     kinds: [pod, replicaSet, deployment, namespace]\n\
             \x20   - name: armory-b\n      kubeconfigFile: {d}/kubecfg-b.yaml\n\
             \x20     omitKinds: [event]\n      metrics: true\n"
        ),
    );
    write_file(
        dir,
        "armory-agent.yml",
        &format!(
            "clouddriver:\n  grpc: localhost:{port}\n  tls:\n\
             \x20   cacertFile: {ca}\n    clientCertFile: {cert}\n    clientKeyFile: {key}\n\
             \x20   clientKeyFilePassword: {KEY_PASSWORD}\n\
             \x20 keepAliveHeartbeatSeconds: 20\n  responseRetries:\n    enabled: true\n\
             kubernetes:\n  accounts:\n    - name: armory-a\n      kubeConfigFile: {d}/kubecfg-a.yaml\n\
             tasks:\n  totalBudget: 6\n  budgetPerAccount: 3\n\
             pprof:\n  enabled: false\n  port: 6060\n\
             logging:\n  level: info\n",
            port = files.gateway_port,
            ca = files.ca.display(),
            cert = files.cert.display(),
        ),
    )
}

fn spinlink(args: &[&str]) -> std::process::Output {
    Command::new(SPINLINK).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn an_armory_agent_file_runs_unchanged_through_the_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_sim, kubeconfig) = support::kube_sim(dir);
    let mut armory_file = String::new();
    let chain = Chain::start_with_agent(dir, &["armory-a", "armory-b"], |files| {
        armory_file = write_armory_files(dir, files, &kubeconfig);
        armory_file.clone()
    });

    // Both accounts, the second from the override, serve kubectl.
    for account in ["armory-a", "armory-b"] {
        let pods = chain
            .kubectl(account)
            .ok(&["get", "pods", "-n", "demo", "-o", "name"]);
        assert!(pods.contains("pod/web-"), "{account}: {pods}");
    }
    // `kinds` (Armory's singular camelCase names) narrowed the first
    // account's cache to those four kinds; the second caches every kind.
    let kinds = |account: &str| {
        let (status, body) =
            support::http(chain.facade, "GET", &format!("/v1/accounts/{account}"), &[]);
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["kindsTotal"].as_u64().unwrap()
    };
    assert_eq!(kinds("armory-a"), 4);
    assert!(kinds("armory-b") > 4);

    // Each key without a meaning was said once, naming it.
    let log = chain.agent.log();
    for key in [
        "pprof",
        "logging",
        "clouddriver.responseRetries",
        "kubernetes.accounts[1].metrics",
    ] {
        let lines = log
            .lines()
            .filter(|l| l.contains(&format!(": {key}: ignored:")))
            .count();
        assert_eq!(lines, 1, "{key}:\n{log}");
    }
    assert!(
        !log.contains(KEY_PASSWORD),
        "the key password reached the log"
    );

    // --check-config accepts the same files, with the same warnings.
    let out = spinlink(&["agent", "--check-config", "--config", &armory_file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("ok: "),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stdout).contains("armory-agent-local.yaml"));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("warning: ") && stderr.contains(": pprof: ignored: "),
        "{stderr}"
    );
}

/// Why agent mode cannot run here, if it cannot: the service account is
/// mounted at its real path in a mount namespace, which needs root and
/// `unshare` (util-linux).
fn agent_mode_unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("it needs root to make a mount namespace".into());
    }
    match Command::new("unshare").arg("--version").output() {
        Ok(out) if out.status.success() => None,
        _ => Some("`unshare` (util-linux) is not installed".into()),
    }
}

#[test]
fn an_armory_agent_mode_file_runs_with_the_pods_service_account() {
    if let Some(why) = agent_mode_unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The API server over TLS, as in a pod: the service account's ca.crt
    // is the CA that signed it.
    let tls_dir = dir.join("sim-tls");
    let (mut _sim, _) = support::kube_sim_with(dir, &["--tls-dir", tls_dir.to_str().unwrap()]);
    let sim_port = _sim.listening("kube-sim").port();
    let sa = dir.join("serviceaccount");
    std::fs::create_dir(&sa).unwrap();
    std::fs::copy(tls_dir.join("ca.crt"), sa.join("ca.crt")).unwrap();
    std::fs::write(sa.join("token"), "pod-token").unwrap();
    std::fs::write(sa.join("namespace"), "spinnaker").unwrap();

    let chain = Chain::start_with_agent_command(
        dir,
        &["armory-prod"],
        |files| {
            write_file(
                dir,
                "armory-agent.yml",
                &format!(
                    "clouddriver:\n  grpc: localhost:{port}\n  insecure: false\n  tls:\n\
                     \x20   cacertFile: {ca}\n    clientCertFile: {cert}\n    clientKeyFile: {key}\n\
                     kubernetes:\n  accounts:\n    - name: armory-prod\n      serviceAccount: true\n\
                     \x20     kinds: [replicaSet, service, ingress, daemonSet, deployment, pod, statefulSet, job, cronJob]\n",
                    port = files.gateway_port,
                    ca = files.ca.display(),
                    cert = files.cert.display(),
                    key = files.key.display(),
                ),
            )
        },
        |config| {
            // /var/run is /run: a tmpfs there, private to the agent, holds
            // the service account as the kubelet mounts it.
            let script = format!(
                "set -e; mount -t tmpfs tmpfs /run; \
                 mkdir -p /run/secrets/kubernetes.io/serviceaccount; \
                 cp {sa}/* /run/secrets/kubernetes.io/serviceaccount/; \
                 exec {SPINLINK} agent --config {config}",
                sa = sa.display(),
            );
            let mut command = Command::new("unshare");
            command
                .args(["--mount", "--propagation", "private", "sh", "-c", &script])
                .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
                .env("KUBERNETES_SERVICE_PORT", sim_port.to_string());
            command
        },
    );
    let pods = chain
        .kubectl("armory-prod")
        .ok(&["get", "pods", "-n", "demo", "-o", "name"]);
    assert!(pods.contains("pod/web-"), "{pods}");
    // Nine kinds, as the file lists them in Armory's spelling.
    let (_, body) = support::http(chain.facade, "GET", "/v1/accounts/armory-prod", &[]);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kindsTotal"], 9, "{body}");
}

#[test]
fn migrate_config_prints_a_native_file_that_checks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let kubeconfig = Path::new(&write_file(dir, "kubeconfig", "x")).to_owned();
    // Real development certificates: the test encrypts the key.
    let pki = spinlink_tls::dev::DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
    let files = AgentFiles {
        gateway_port: 7443,
        ca: pki.ca_cert(),
        cert: pki.cert("agent-agent-1"),
        key: pki.key("agent-agent-1"),
    };
    let armory = write_armory_files(dir, &files, &kubeconfig);

    let out = spinlink(&["agent", "migrate-config", &armory]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let native = text(&out.stdout);
    let dropped = text(&out.stderr);
    // What it dropped is said, once each; the secret is not.
    for key in ["pprof", "logging", "clouddriver.responseRetries"] {
        assert_eq!(
            dropped.matches(&format!(": {key}: ignored:")).count(),
            1,
            "{key}: {dropped}"
        );
    }
    assert!(!dropped.contains(KEY_PASSWORD), "{dropped}");
    // The output is a native file: it checks as one, and carries the keys.
    assert!(!native.contains("clouddriver:"), "{native}");
    for expected in [
        "url: https://localhost:7443",
        "keyPassword: armory-key-password",
        "totalBudget: 6",
        "name: armory-b",
        "- Pod",
        "- ReplicaSet",
    ] {
        assert!(native.contains(expected), "{expected}: {native}");
    }
    let native_file = write_file(dir, "spinlink-agent.yaml", &native);
    let out = spinlink(&["agent", "--check-config", "--config", &native_file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));

    // A native file is not migrated again.
    let out = spinlink(&["agent", "migrate-config", &native_file]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("already a spinlink agent configuration"));
}

#[test]
fn check_config_names_an_unknown_key_and_its_file() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_file(
        tmp.path(),
        "armory-agent.yml",
        "clouddriver:\n  grpc: localhost:9091\n  tls:\n    cacertFile: /x\n    clientKeyPasword: p\n",
    );
    let out = spinlink(&["agent", "--check-config", "--config", &file]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("clientKeyPasword") && stderr.contains(&file),
        "{stderr}"
    );
}
