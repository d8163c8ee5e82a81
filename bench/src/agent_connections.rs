//! How many TCP connections the agent holds to the API server for a default
//! cluster (issue 20, finding 9: at most 4). kube-sim serves every kind a
//! default 1.36 cluster has (its recorded discovery), over HTTPS offering
//! HTTP/2 as a real API server does, and over plain HTTP (HTTP/1.1 only) for
//! comparison. The agent runs in its own process ([`crate::agent_chain`]);
//! its connections are counted from `/proc` — the process's sockets
//! established to kube-sim's port — so an older agent without the metric can
//! be measured the same way, and its `spinlink_agent_apiserver_connections`
//! gauge is read from the admin port beside it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use crate::agent_chain::{ACCOUNT, AgentChain, SimTransport, client, request};
use crate::chain::START_WAIT;
use crate::report::Report;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spinlink` binary (kube-sim, sidecar, gateway).
    pub spinlink: PathBuf,
    /// The agent's binary (default: `spinlink`).
    pub agent_spinlink: Option<PathBuf>,
    /// Transports to measure, in order.
    pub transports: Vec<SimTransport>,
    /// Readings after the sync, one a second.
    pub samples: usize,
    /// Scratch directory.
    pub dir: PathBuf,
}

/// One transport's figures.
#[derive(Debug, Clone, Default)]
pub struct Counted {
    /// Kinds the account watches (the sidecar's `kindsTotal`, after the
    /// readings).
    pub kinds: u64,
    /// Established connections from the agent to kube-sim, per reading.
    pub readings: Vec<usize>,
    /// The agent's own gauge at the last reading, when it has one.
    pub metric: Option<u64>,
}

/// Established TCP connections of process `pid` to `port` on loopback: the
/// process's socket inodes matched against its network namespace's tables.
pub fn connections_to(pid: u32, port: u16) -> anyhow::Result<usize> {
    let mut inodes = HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(link) = std::fs::read_link(fd?.path()) else {
            continue;
        };
        if let Some(inode) = link
            .to_str()
            .and_then(|l| l.strip_prefix("socket:["))
            .and_then(|l| l.strip_suffix(']'))
            .and_then(|l| l.parse::<u64>().ok())
        {
            inodes.insert(inode);
        }
    }
    let mut count = 0;
    for table in ["tcp", "tcp6"] {
        let path = format!("/proc/{pid}/net/{table}");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(remote), Some(state), Some(inode)) =
                (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            let established = *state == "01";
            if remote_port == Some(port)
                && established
                && inode.parse().is_ok_and(|i: u64| inodes.contains(&i))
            {
                count += 1;
            }
        }
    }
    Ok(count)
}

/// A free loopback port for the agent's admin listener.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The account's `spinlink_agent_apiserver_connections`, if the agent has it.
async fn metric(admin: SocketAddr) -> Option<u64> {
    let url = format!("http://{admin}/metrics");
    let (status, body) = request(&client(), http::Method::GET, &url, None)
        .await
        .ok()?;
    if status != 200 {
        return None;
    }
    let prefix = format!("spinlink_agent_apiserver_connections{{account=\"{ACCOUNT}\"}} ");
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

/// One chain over `transport`: the agent synced, then `samples` readings a
/// second apart.
pub fn measure(opts: &Options, transport: SimTransport) -> anyhow::Result<Counted> {
    let dir = opts.dir.join(format!("agent-connections-{transport:?}"));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    let extra = format!("admin:\n  listen: {admin}\n");
    let agent_spinlink = opts.agent_spinlink.as_ref().unwrap_or(&opts.spinlink);
    let mut chain =
        AgentChain::start_with(&opts.spinlink, agent_spinlink, &dir, 0, &extra, transport)?;
    chain.start_agent()?;
    let pid = chain.agent_pid()?;
    let port = chain.sim_addr.port();
    rt.block_on(async {
        chain
            .wait_cached(0, Duration::from_millis(100), START_WAIT * 4, || {})
            .await?;
        let mut counted = Counted::default();
        for i in 0..opts.samples.max(1) {
            if i > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            counted.readings.push(connections_to(pid, port)?);
        }
        counted.metric = metric(admin).await;
        // Read last: the sidecar counts a kind once its listing starts, so
        // "every kind synced" can hold before the last kinds have started.
        let url = format!("http://{}/v1/accounts/{ACCOUNT}", chain.facade_addr);
        let (_, body) = request(&client(), http::Method::GET, &url, None).await?;
        let account: serde_json::Value = serde_json::from_slice(&body)?;
        counted.kinds = account["kindsTotal"].as_u64().unwrap_or(0);
        Ok(counted)
    })
}

/// Measures every transport asked for and reports it.
pub fn run(opts: &Options, r: &mut Report) -> anyhow::Result<()> {
    if let Some(agent) = &opts.agent_spinlink {
        r.line(format!("- agent binary: `{}`", agent.display()));
    }
    r.line("| kube-sim serves | kinds watched | agent's TCP connections to it (from /proc, one reading a second after the sync; the largest in bold) | `spinlink_agent_apiserver_connections` at the last reading |");
    r.line("|---|---|---|---|");
    for &transport in &opts.transports {
        let counted = measure(opts, transport)?;
        let serves = match transport {
            SimTransport::Tls => "HTTPS, ALPN `h2`, `http/1.1`",
            SimTransport::Plain => "plain HTTP (HTTP/1.1)",
        };
        let max = counted.readings.iter().max().copied().unwrap_or_default();
        let readings: Vec<String> = counted.readings.iter().map(usize::to_string).collect();
        r.line(format!(
            "| {serves} | {} | **{max}** ({}) | {} |",
            counted.kinds,
            readings.join(", "),
            counted
                .metric
                .map_or_else(|| "absent".to_owned(), |m| m.to_string()),
        ));
    }
    Ok(())
}
