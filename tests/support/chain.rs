//! The whole chain as separate `spinlink` processes — a sidecar, a gateway
//! and an agent — in front of a cluster, with the agent's accounts as a
//! test writes them (impersonation, namespaces, relay policy).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use spinlink_tls::dev::{DevPki, dev_agent_identity};

use super::{Kubectl, Proc, SPINLINK, http, wait_for, write_file, write_kubeconfig};

/// One account of the agent: its name and the YAML keys it has besides
/// `name` and `kubeconfigFile`, one per line, unindented.
pub struct AccountSpec<'a> {
    pub name: &'a str,
    pub yaml: &'a str,
}

/// The running chain.
pub struct Chain {
    pub sidecar: Proc,
    pub gateway: Proc,
    pub agent: Proc,
    /// The sidecar's facade.
    pub facade: SocketAddr,
    dir: PathBuf,
}

/// What an agent's configuration file needs to reach the chain's gateway:
/// its port and the agent's development certificates.
pub struct AgentFiles {
    pub gateway_port: u16,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What a chain's sidecar and gateway get besides what every chain has.
#[derive(Default)]
pub struct Extra<'a> {
    /// More top-level keys of the sidecar's configuration (YAML).
    pub sidecar_yaml: &'a str,
    /// Account globs the gateway grants the agent besides the accounts it
    /// is started with (dynamic accounts, assigned later).
    pub accounts: &'a [&'a str],
}

impl Chain {
    /// Starts a sidecar (SQLite store, plaintext tunnel), a gateway that
    /// lets the agent serve `accounts`, and the agent with them, all against
    /// the cluster `kubeconfig` names; returns once every account is ready.
    pub fn start(dir: &Path, kubeconfig: &Path, accounts: &[AccountSpec<'_>]) -> Chain {
        let names: Vec<&str> = accounts.iter().map(|a| a.name).collect();
        Chain::start_with_agent(dir, &names, |files| {
            let p = |path: &Path| path.display().to_string();
            let accounts_yaml: String = accounts
                .iter()
                .map(|a| {
                    let extra: String = a.yaml.lines().map(|l| format!("    {l}\n")).collect();
                    format!(
                        "  - name: {}\n    kubeconfigFile: {}\n{extra}",
                        a.name,
                        kubeconfig.display()
                    )
                })
                .collect();
            write_file(
                dir,
                "agent.yaml",
                &format!(
                    "agentId: agent-1\ngateway:\n  url: https://localhost:{}\n  caFile: {}\n  certFile: {}\n  keyFile: {}\n\
                     kubernetes:\n  accounts:\n{accounts_yaml}",
                    files.gateway_port,
                    p(&files.ca),
                    p(&files.cert),
                    p(&files.key),
                ),
            )
        })
    }

    /// As [`Chain::start`], the agent's configuration file written by
    /// `write_agent` (which returns its path), serving `names`.
    pub fn start_with_agent(
        dir: &Path,
        names: &[&str],
        write_agent: impl FnOnce(&AgentFiles) -> String,
    ) -> Chain {
        Chain::start_with_agent_command(dir, names, write_agent, |config| {
            let mut command = Command::new(SPINLINK);
            command.args(["agent", "--config", config]);
            command
        })
    }

    /// As [`Chain::start_with_agent`], the agent run by the command `agent`
    /// makes from its configuration file's path (to wrap it, as in a mount
    /// namespace).
    pub fn start_with_agent_command(
        dir: &Path,
        names: &[&str],
        write_agent: impl FnOnce(&AgentFiles) -> String,
        agent: impl FnOnce(&str) -> Command,
    ) -> Chain {
        Chain::start_with(dir, names, &Extra::default(), write_agent, agent)
    }

    /// As [`Chain::start_with_agent_command`], the sidecar and gateway
    /// given `extra`.
    pub fn start_with(
        dir: &Path,
        names: &[&str],
        extra: &Extra<'_>,
        write_agent: impl FnOnce(&AgentFiles) -> String,
        agent: impl FnOnce(&str) -> Command,
    ) -> Chain {
        let pki = DevPki::ensure(&dir.join("pki"), &["agent-1"]).unwrap();
        let p = |path: PathBuf| path.display().to_string();
        let sidecar_cfg = write_file(
            dir,
            "sidecar.yaml",
            &format!(
                "instanceId: chain-sidecar\ntunnel:\n  listen: 127.0.0.1:0\n  insecure: true\n\
                 facade:\n  listen: 127.0.0.1:0\nstore:\n  url: sqlite://{}\n{}",
                dir.join("sidecar.db").display(),
                extra.sidecar_yaml,
            ),
        );
        let mut sidecar = Proc::start("sidecar", dir, &["sidecar", "--config", &sidecar_cfg]);
        let tunnel = sidecar.listening("sidecar-tunnel");
        let facade = sidecar.listening("sidecar-facade");

        let gateway_cfg = write_file(
            dir,
            "gateway.yaml",
            &format!(
                "gatewayId: chain-gateway\nlisten: 127.0.0.1:0\ntls:\n  certFile: {}\n  keyFile: {}\n  clientCaFile: {}\n\
                 policy:\n- identities: [\"{}\"]\n  accounts: [{}]\n\
                 upstreams:\n- url: http://{tunnel}\n",
                p(pki.cert("gateway")),
                p(pki.key("gateway")),
                p(pki.ca_cert()),
                dev_agent_identity("agent-1"),
                names
                    .iter()
                    .chain(extra.accounts)
                    .map(|n| format!("\"{n}\""))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        );
        let mut gateway = Proc::start("gateway", dir, &["gateway", "--config", &gateway_cfg]);
        let gateway_addr = gateway.listening("gateway");

        let agent_cfg = write_agent(&AgentFiles {
            gateway_port: gateway_addr.port(),
            ca: pki.ca_cert(),
            cert: pki.cert("agent-agent-1"),
            key: pki.key("agent-agent-1"),
        });
        let agent = Proc::spawn("agent", dir, agent(&agent_cfg));
        let chain = Chain {
            sidecar,
            gateway,
            agent,
            facade,
            dir: dir.to_owned(),
        };
        for name in names {
            chain.wait_ready(name);
        }
        chain
    }

    /// Waits until `account` is online, its kinds synced, its relay attached.
    pub fn wait_ready(&self, account: &str) {
        wait_for(&format!("account {account} to be ready"), || {
            let (status, body) = http(self.facade, "GET", &format!("/v1/accounts/{account}"), &[]);
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            let ready = status == 200
                && v["online"] == true
                && v["relay"] == true
                && v["discovery"] == true
                && v["kindsTotal"].as_u64().unwrap_or(0) > 0
                && v["kindsSynced"] == v["kindsTotal"];
            ready.then_some(())
        });
    }

    /// kubectl through the facade, as `account`.
    pub fn kubectl(&self, account: &str) -> Kubectl {
        let kubeconfig = self.dir.join(format!("{account}.kubeconfig"));
        write_kubeconfig(
            &kubeconfig,
            &format!("http://{}/accounts/{account}", self.facade),
        );
        Kubectl::new(&self.dir, &format!("via-{account}"), &kubeconfig)
    }

    /// A GET of `path` (a Kubernetes path) through the facade as `account`.
    pub fn get(&self, account: &str, path: &str) -> (u16, String) {
        http(
            self.facade,
            "GET",
            &format!("/accounts/{account}{path}"),
            &[],
        )
    }
}

/// kube-sim's kubeconfig with `token` for its user, and the running chain:
/// a sidecar with an encryption key (plus `sidecar_yaml`), a gateway that
/// grants `static`, `dyn-*` and `mig-*`, and an infrastructure-mode agent
/// with the configured account `static`, `dynamicAccounts` on in zone
/// `eu` and its admin port at the address returned. Once `static` is ready.
pub fn dynamic_chain(
    dir: &Path,
    sim_kubeconfig: &Path,
    token: &str,
    sidecar_yaml: &str,
) -> (String, Chain, SocketAddr) {
    let posted = std::fs::read_to_string(sim_kubeconfig)
        .unwrap()
        .replace("\"kube-sim\"\n", &format!("\"{token}\"\n"));
    assert!(
        posted.contains(token),
        "kube-sim's kubeconfig changed shape"
    );
    // 32 raw bytes (a fixed test key).
    let key_path = dir.join("accounts.key");
    std::fs::write(
        &key_path,
        (0u8..32).map(|b| b.wrapping_mul(37)).collect::<Vec<_>>(),
    )
    .unwrap();
    let sidecar_yaml = format!(
        "accounts:\n  encryptionKeyFile: {}\n{sidecar_yaml}",
        key_path.display()
    );
    let extra = Extra {
        sidecar_yaml: &sidecar_yaml,
        accounts: &["dyn-*", "mig-*"],
    };
    let mut chain = Chain::start_with(
        dir,
        &["static"],
        &extra,
        |files| {
            write_file(
                dir,
                "agent.yaml",
                &format!(
                    "agentId: agent-1\ngateway:\n  url: https://localhost:{}\n  caFile: {}\n  certFile: {}\n  keyFile: {}\n\
                     admin:\n  listen: 127.0.0.1:0\n\
                     kubernetes:\n  accounts:\n  - name: static\n    kubeconfigFile: {}\n\
                     dynamicAccounts:\n  enabled: true\n  zone: eu\n",
                    files.gateway_port,
                    files.ca.display(),
                    files.cert.display(),
                    files.key.display(),
                    sim_kubeconfig.display(),
                ),
            )
        },
        |config| {
            let mut command = Command::new(SPINLINK);
            command.args(["agent", "--config", config]);
            command
        },
    );
    let admin = chain.agent.listening("agent-admin");
    (posted, chain, admin)
}
