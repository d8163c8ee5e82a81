//! `spinlink status`: a kubectl-style view of the system, read from a
//! sidecar's accounts API (`GET /v1/accounts`, `/v1/agents` and each
//! account's `/operations`, all on the facade port; see
//! `docs/api/sidecar.openapi.yaml`). [`run`] fetches a [`Snapshot`], prints
//! it as a table ([`render_table`]) or as JSON/YAML ([`Snapshot::to_json`]),
//! and exits non-zero when anything is unhealthy ([`Health`]), so scripts
//! and readiness checks can use it.

use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use http_body_util::{BodyExt as _, Empty};
use serde::Deserialize;
use serde_json::{Value, json};

/// The sidecar asked when `--server` is not given: where `spinlink dev`
/// puts its facade.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7002";
/// How long the whole status read may take.
pub const DEFAULT_TIMEOUT_SECS: u64 = 10;
/// Exit code when the sidecar answered and something is unhealthy.
pub const EXIT_UNHEALTHY: u8 = 1;
/// Exit code when the sidecar could not be reached or its answer not read
/// (2 is clap's, for bad flags).
pub const EXIT_UNREACHABLE: u8 = 3;

/// Flags of `spinlink status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The sidecar's facade URL (plain HTTP), where its accounts API is.
    #[arg(long, env = "SPINLINK_SERVER", default_value = DEFAULT_SERVER)]
    server: String,
    /// Output format: the table (default), `wide` (more columns), `json`
    /// or `yaml`.
    #[arg(long, short, value_enum)]
    output: Option<Output>,
    /// Seconds the whole read may take.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_SECS)]
    timeout: u64,
}

/// `-o` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// More columns.
    Wide,
    /// The sidecar's answers with each account's health, as JSON.
    Json,
    /// The same as YAML.
    Yaml,
}

/// Reads the sidecar at `args.server`, prints what it found, and says
/// with the exit code whether all is healthy.
pub async fn run(args: StatusArgs) -> ExitCode {
    let timeout = Duration::from_secs(args.timeout);
    let snapshot = match tokio::time::timeout(timeout, Snapshot::fetch(&args.server)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(EXIT_UNREACHABLE);
        }
        Err(_) => {
            eprintln!(
                "error: the sidecar at {} did not answer within {}s",
                args.server, args.timeout
            );
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    let text = match args.output {
        None | Some(Output::Wide) => render_table(
            &snapshot,
            args.output == Some(Output::Wide),
            Utc::now(),
            use_colour(),
        ),
        Some(Output::Json) => {
            let mut s =
                serde_json::to_string_pretty(&snapshot.to_json(&args.server)).unwrap_or_default();
            s.push('\n');
            s
        }
        Some(Output::Yaml) => {
            serde_norway::to_string(&snapshot.to_json(&args.server)).unwrap_or_default()
        }
    };
    // A closed pipe (`| head`) is not worth a panic.
    let _ = std::io::stdout().write_all(text.as_bytes());
    let unhealthy: Vec<_> = snapshot
        .accounts
        .iter()
        .filter(|r| !r.health.problems.is_empty())
        .collect();
    if unhealthy.is_empty() {
        return ExitCode::SUCCESS;
    }
    for r in unhealthy {
        eprintln!(
            "unhealthy: account {}: {}",
            r.account.name,
            r.health.problems.join("; ")
        );
    }
    ExitCode::from(EXIT_UNHEALTHY)
}

/// Colour only on a terminal, and never with `NO_COLOR` set (no-color.org:
/// set and not empty).
fn use_colour() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// What the sidecar said, account by account.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Every account, by name.
    pub accounts: Vec<Row>,
    /// Every agent identity with streams there, as the API answered.
    pub agents: Vec<Agent>,
    agents_raw: Vec<Value>,
}

/// One account: the fields shown, its health, its last operation, and the
/// sidecar's answer as it was (for `-o json|yaml`).
#[derive(Debug)]
pub struct Row {
    /// The fields the table shows.
    pub account: Account,
    /// Whether it is healthy, and if not why.
    pub health: Health,
    /// Its most recent relayed operation, if any.
    pub last_operation: Option<Operation>,
    raw: Value,
    raw_operation: Option<Value>,
}

/// An account as `GET /v1/accounts` shows it (the fields read here).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Account {
    pub name: String,
    pub state: String,
    pub owner_instance: String,
    pub agent_identity: String,
    pub online: bool,
    pub offline_seconds: Option<u64>,
    pub kinds_synced: u64,
    pub kinds_total: u64,
    pub agent_synced: bool,
    pub objects: u64,
    pub last_event: Option<DateTime<Utc>>,
    pub discovery: bool,
    pub relay: bool,
    pub registration: Registration,
    pub api_server: ApiServer,
}

impl Default for Account {
    fn default() -> Self {
        Self {
            name: String::new(),
            state: String::new(),
            owner_instance: String::new(),
            agent_identity: String::new(),
            online: false,
            offline_seconds: None,
            kinds_synced: 0,
            kinds_total: 0,
            // A sidecar that does not say counts started kinds only.
            agent_synced: true,
            objects: 0,
            last_event: None,
            discovery: false,
            relay: false,
            registration: Registration::default(),
            // A sidecar that does not say is not taken to be cut off.
            api_server: ApiServer {
                reachable: true,
                ..ApiServer::default()
            },
        }
    }
}

/// An account's registration with Clouddriver (the fields read here).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Registration {
    pub state: String,
    pub reason: Option<String>,
}

/// Whether the account's agent reaches its API server.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ApiServer {
    pub reachable: bool,
    pub unreachable_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// A relayed operation with the time of each hop, all on the relaying
/// sidecar's clock.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Operation {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub outcome: String,
    pub received: Option<DateTime<Utc>>,
    pub sent_to_agent: Option<DateTime<Utc>>,
    pub agent_started: Option<DateTime<Utc>>,
    pub agent_finished: Option<DateTime<Utc>>,
    pub answered: Option<DateTime<Utc>>,
}

/// An agent identity and the accounts it serves there.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Agent {
    pub identity: String,
    pub accounts: Vec<AgentAccount>,
}

/// One account of an agent.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct AgentAccount {
    pub name: String,
    pub state: String,
    pub relay: bool,
}

/// An account's health: a one-word status, kubectl-style, and every
/// problem in words (none when healthy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// `Ready`, or the first problem: `Stale`, `Removed`, `NoRelay`,
    /// `Syncing`, `APIUnreachable`, `RegistrationFailing`.
    pub status: &'static str,
    /// Why it is not healthy.
    pub problems: Vec<String>,
}

impl Health {
    /// Judges `a`: healthy when online with its relay attached, every kind
    /// synced (discovery held), its API server reachable, and its
    /// registration, if any, not failing.
    pub fn of(a: &Account) -> Health {
        let mut found: Vec<(&'static str, String)> = Vec::new();
        if !a.online {
            let (status, what) = match a.state.as_str() {
                "removed" => (
                    "Removed",
                    "removed: its agent went away and the grace period ended",
                ),
                _ => (
                    "Stale",
                    "offline: no cache stream from its agent, reads are served from the last cache",
                ),
            };
            let since = a
                .offline_seconds
                .map(|s| format!(" (for {})", human_duration(s)))
                .unwrap_or_default();
            found.push((status, format!("{what}{since}")));
        }
        if a.online && !a.relay {
            found.push(("NoRelay", "no relay stream: writes and watches fail".into()));
        }
        if a.kinds_total == 0 || a.kinds_synced < a.kinds_total || !a.agent_synced || !a.discovery {
            found.push((
                "Syncing",
                format!(
                    "not fully synced: {}/{} kinds{}{}",
                    a.kinds_synced,
                    a.kinds_total,
                    if a.agent_synced {
                        ""
                    } else {
                        ", more to start"
                    },
                    if a.discovery { "" } else { ", no discovery" }
                ),
            ));
        }
        if !a.api_server.reachable {
            let error = a
                .api_server
                .last_error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            found.push((
                "APIUnreachable",
                format!("its agent does not reach the cluster's API server{error}"),
            ));
        }
        if a.registration.state == "retrying" {
            let reason = a.registration.reason.as_deref().unwrap_or("unknown");
            found.push((
                "RegistrationFailing",
                format!("registration with Clouddriver failing ({reason})"),
            ));
        }
        Health {
            status: found.first().map_or("Ready", |f| f.0),
            problems: found.into_iter().map(|f| f.1).collect(),
        }
    }
}

impl Snapshot {
    /// Reads every account, its last operation, and the agents from the
    /// sidecar at `server`.
    pub async fn fetch(server: &str) -> anyhow::Result<Snapshot> {
        let sidecar = Sidecar::parse(server)?;
        let accounts = sidecar
            .get("/v1/accounts")
            .await?
            .context("the sidecar has no accounts API (GET /v1/accounts: 404); is this a sidecar's facade address?")?;
        let Value::Array(accounts) = accounts else {
            bail!("{server}: GET /v1/accounts did not answer a list");
        };
        let mut rows = Vec::with_capacity(accounts.len());
        for raw in accounts {
            let account: Account = serde_json::from_value(raw.clone())
                .with_context(|| format!("{server}: reading an account"))?;
            // The journal may be unreadable (a store outage) or gone from
            // an older sidecar: the account is still shown, without it.
            let raw_operation = sidecar
                .get(&format!("/v1/accounts/{}/operations", account.name))
                .await
                .ok()
                .flatten()
                .and_then(|ops| match ops {
                    Value::Array(mut ops) => ops.pop(),
                    _ => None,
                });
            let last_operation = raw_operation
                .clone()
                .and_then(|v| serde_json::from_value(v).ok());
            rows.push(Row {
                health: Health::of(&account),
                account,
                last_operation,
                raw,
                raw_operation,
            });
        }
        let agents_raw = match sidecar.get("/v1/agents").await? {
            Some(Value::Array(a)) => a,
            _ => Vec::new(),
        };
        let agents = agents_raw
            .iter()
            .filter_map(|a| serde_json::from_value(a.clone()).ok())
            .collect();
        Ok(Snapshot {
            accounts: rows,
            agents,
            agents_raw,
        })
    }

    /// Whether every account is healthy.
    pub fn healthy(&self) -> bool {
        self.accounts.iter().all(|r| r.health.problems.is_empty())
    }

    /// The sidecar's answers as they were, each account with its `health`
    /// and `lastOperation`, for `-o json|yaml`.
    pub fn to_json(&self, server: &str) -> Value {
        let accounts: Vec<Value> = self
            .accounts
            .iter()
            .map(|r| {
                let mut v = r.raw.clone();
                if let Value::Object(m) = &mut v {
                    m.insert(
                        "health".into(),
                        json!({ "status": r.health.status, "problems": r.health.problems }),
                    );
                    m.insert(
                        "lastOperation".into(),
                        r.raw_operation.clone().unwrap_or(Value::Null),
                    );
                }
                v
            })
            .collect();
        json!({
            "server": server,
            "healthy": self.healthy(),
            "accounts": accounts,
            "agents": self.agents_raw,
        })
    }
}

/// A sidecar's facade, asked over plain HTTP/1.1.
struct Sidecar {
    server: String,
    authority: String,
    base: String,
}

impl Sidecar {
    fn parse(server: &str) -> anyhow::Result<Sidecar> {
        let with_scheme = if server.contains("://") {
            server.to_owned()
        } else {
            format!("http://{server}")
        };
        let uri: http::Uri = with_scheme
            .parse()
            .with_context(|| format!("--server {server:?} is not a URL"))?;
        if uri.scheme_str() != Some("http") {
            bail!(
                "--server {server:?}: only http:// is supported (the facade serves plain HTTP on loopback)"
            );
        }
        let authority = uri
            .authority()
            .with_context(|| format!("--server {server:?} names no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        Ok(Sidecar {
            server: server.to_owned(),
            authority: format!("{}:{port}", authority.host()),
            base: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// `GET path` as JSON; `None` on 404.
    async fn get(&self, path: &str) -> anyhow::Result<Option<Value>> {
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("cannot reach the sidecar at {}", self.server))?;
        stream.set_nodelay(true)?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .with_context(|| format!("cannot reach the sidecar at {}", self.server))?;
        tokio::spawn(conn);
        let request = http::Request::get(format!("{}{path}", self.base))
            .header(http::header::HOST, &self.authority)
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())?;
        let response = send
            .send_request(request)
            .await
            .with_context(|| format!("{}: GET {path}", self.server))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .with_context(|| format!("{}: GET {path}: reading the answer", self.server))?
            .to_bytes();
        if status == http::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            let message = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            bail!("{}: GET {path}: {status}: {message}", self.server);
        }
        serde_json::from_slice(&body)
            .map(Some)
            .with_context(|| format!("{}: GET {path}: the answer is not JSON", self.server))
    }
}

/// The table: one row per account (`LAST-EVENT`: when the sidecar last
/// applied a watch event from its agent), then one per agent. `wide` adds the
/// relay, registration, API server and the last operation's hop times;
/// `colour` paints the status column.
pub fn render_table(snapshot: &Snapshot, wide: bool, now: DateTime<Utc>, colour: bool) -> String {
    let mut out = String::new();
    if snapshot.accounts.is_empty() {
        out.push_str("No accounts.\n");
    } else {
        let mut header = vec![
            "ACCOUNT",
            "STATUS",
            "AGENT",
            "SIDECAR",
            "KINDS",
            "OBJECTS",
            "LAST-EVENT",
            "OFFLINE",
            "LAST-OP",
        ];
        if wide {
            header.extend(["RELAY", "REGISTRATION", "API-SERVER", "HOPS"]);
        }
        let rows = snapshot.accounts.iter().map(|r| {
            let a = &r.account;
            let mut row = vec![
                Cell::plain(&a.name),
                Cell::status(r.health.status),
                Cell::plain(dash(&a.agent_identity)),
                Cell::plain(dash(&a.owner_instance)),
                Cell::plain(format!("{}/{}", a.kinds_synced, a.kinds_total)),
                Cell::plain(a.objects.to_string()),
                Cell::plain(
                    a.last_event
                        .map_or_else(|| "-".into(), |t| format!("{} ago", age(t, now))),
                ),
                Cell::plain(
                    a.offline_seconds
                        .filter(|_| !a.online)
                        .map_or_else(|| "-".into(), human_duration),
                ),
                Cell::plain(
                    r.last_operation
                        .as_ref()
                        .map_or_else(|| "-".into(), |op| last_op(op, now)),
                ),
            ];
            if wide {
                row.extend([
                    Cell::plain(if a.relay { "attached" } else { "none" }),
                    Cell::plain(dash(&a.registration.state)),
                    Cell::plain(match a.api_server.unreachable_since {
                        _ if a.api_server.reachable => "reachable".to_owned(),
                        Some(since) => format!("unreachable {} ago", age(since, now)),
                        None => "unreachable".to_owned(),
                    }),
                    Cell::plain(
                        r.last_operation
                            .as_ref()
                            .and_then(hops)
                            .unwrap_or_else(|| "-".into()),
                    ),
                ]);
            }
            row
        });
        table(&mut out, &header, rows.collect(), colour);
    }
    if !snapshot.agents.is_empty() {
        out.push('\n');
        let rows = snapshot
            .agents
            .iter()
            .map(|g| {
                let online = g.accounts.iter().filter(|a| a.state == "online").count();
                let names: Vec<&str> = g.accounts.iter().map(|a| a.name.as_str()).collect();
                vec![
                    Cell::plain(&g.identity),
                    Cell::plain(format!("{online}/{}", g.accounts.len())),
                    Cell::plain(names.join(",")),
                ]
            })
            .collect();
        table(&mut out, &["AGENT", "ONLINE", "ACCOUNTS"], rows, colour);
    }
    out
}

/// A table cell: its text and, for the status column, whether it is good
/// news (green) or bad (red) when coloured.
struct Cell {
    text: String,
    good: Option<bool>,
}

impl Cell {
    fn plain(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            good: None,
        }
    }

    fn status(status: &str) -> Cell {
        Cell {
            text: status.to_owned(),
            good: Some(status == "Ready"),
        }
    }
}

/// Writes columns separated by three spaces, as kubectl does; padding is
/// counted on the text, so colour codes do not skew it.
fn table(out: &mut String, header: &[&str], rows: Vec<Vec<Cell>>, colour: bool) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.text.chars().count());
        }
    }
    let header = header.iter().map(|h| Cell::plain(*h)).collect();
    for row in std::iter::once(header).chain(rows) {
        let mut line = String::new();
        let last = row.len().saturating_sub(1);
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            let pad = if i == last {
                0
            } else {
                w - cell.text.chars().count() + 3
            };
            match cell.good {
                Some(good) if colour => {
                    let code = if good { "32" } else { "31" };
                    let _ = write!(line, "\x1b[{code}m{}\x1b[0m", cell.text);
                }
                _ => line.push_str(&cell.text),
            }
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// `GET 200 12ms, 35s ago`: the last operation's method, status (or
/// outcome when it was not answered), total time and age.
fn last_op(op: &Operation, now: DateTime<Utc>) -> String {
    let result = if op.outcome == "answered" || op.outcome.is_empty() {
        op.status.to_string()
    } else {
        op.outcome.clone()
    };
    let mut s = format!("{} {result}", op.method);
    if let (Some(received), Some(answered)) = (op.received, op.answered) {
        let _ = write!(s, " {}", millis(answered - received));
    }
    if let Some(received) = op.received {
        let _ = write!(s, ", {} ago", age(received, now));
    }
    s
}

/// The last operation's hops: facade to the relay stream, to the agent
/// starting on it, the agent's own time, and back to the answer.
fn hops(op: &Operation) -> Option<String> {
    let received = op.received?;
    let sent = op.sent_to_agent?;
    let mut s = format!("queue={}", millis(sent - received));
    if let (Some(started), Some(finished)) = (op.agent_started, op.agent_finished) {
        let _ = write!(
            s,
            " to-agent={} agent={}",
            millis(started - sent),
            millis(finished - started)
        );
        if let Some(answered) = op.answered {
            let _ = write!(s, " back={}", millis(answered - finished));
        }
    } else if let Some(answered) = op.answered {
        let _ = write!(s, " agent+back={}", millis(answered - sent));
    }
    Some(s)
}

fn millis(d: chrono::TimeDelta) -> String {
    format!("{}ms", d.num_milliseconds().max(0))
}

fn age(since: DateTime<Utc>, now: DateTime<Utc>) -> String {
    human_duration(u64::try_from((now - since).num_seconds()).unwrap_or(0))
}

/// A duration as kubectl shows ages: `45s`, `3m20s`, `25m`, `5h10m`, `3d`.
fn human_duration(secs: u64) -> String {
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if m < 10 => format!("{m}m{}s", s % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 48 => format!("{h}h{}m", m % 60),
        _ => format!("{d}d"),
    }
}

#[cfg(test)]
mod tests;
