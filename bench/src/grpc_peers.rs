//! The proxies of the gateway-vs-peers benchmark as processes on loopback,
//! each configured alike: TLS 1.3 only, a client certificate signed by the
//! dev CA required, HTTP/2 (ALPN h2) towards the client, h2c (gRPC) towards
//! the one echo backend, long timeouts so idle streams stay open, and limits
//! high enough for 2,000 connections. The gateway gets the same certificate
//! and its agent path: the policy grants the load's identity the account,
//! and its handshake and `Hello` rate limits are lifted (their defaults would
//! otherwise be what is measured).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use spinlink_tls::dev::DevPki;

/// How long a peer may take to open its port.
pub const START_WAIT: Duration = Duration::from_secs(20);

/// A free loopback port (bound and released; nothing else on loopback is
/// racing for it in a benchmark run).
pub fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Waits until `addr` accepts a TCP connection.
pub fn wait_port(addr: SocketAddr, what: &str, log: &Path) -> anyhow::Result<()> {
    wait_port_for(addr, what, log, START_WAIT)
}

/// Waits up to `wait` until `addr` accepts a TCP connection.
pub fn wait_port_for(
    addr: SocketAddr,
    what: &str,
    log: &Path,
    wait: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::read_to_string(log).unwrap_or_default();
    bail!("{what} never listened on {addr}; log:\n{log}")
}

/// One peer process; on drop it gets SIGTERM (nginx's master then stops its
/// workers, which a SIGKILL would orphan), and SIGKILL 5 s later.
pub struct PeerProc {
    child: Child,
    /// Stop it with SIGKILL at once rather than SIGTERM first.
    sigkill: bool,
}

impl PeerProc {
    /// Starts `program args` with `env` added, stdout and stderr to `log`.
    pub fn start(
        program: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let out = std::fs::File::create(log)?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Self {
            child,
            sigkill: false,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        if self.sigkill {
            let _ = self.child.kill();
            let _ = self.child.wait();
            return;
        }
        let pid = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The certificate every front end serves (the dev PKI's `gateway` leaf:
/// ECDSA P-256, names `localhost` and `127.0.0.1`).
pub const SERVER_CERT: &str = "gateway";

/// nginx: `grpc_pass` with upstream keepalive.
pub fn nginx_conf(pki: &DevPki, dir: &Path, listen: SocketAddr, echo: SocketAddr) -> String {
    let d = dir.display();
    format!(
        r#"worker_processes 2;
worker_rlimit_nofile 40000;
daemon off;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 20000; }}
http {{
    access_log off;
    upstream echo {{
        server {echo};
        keepalive 1024;
        keepalive_requests 1000000;
        keepalive_timeout 600s;
    }}
    server {{
        listen {listen} ssl http2;
        ssl_protocols TLSv1.3;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_client_certificate {ca};
        ssl_verify_client on;
        keepalive_requests 1000000;
        keepalive_timeout 600s;
        http2_max_concurrent_streams 1000;
        client_body_timeout 600s;
        grpc_read_timeout 600s;
        grpc_send_timeout 600s;
        location / {{ grpc_pass grpc://echo; }}
    }}
}}
"#,
        cert = pki.cert(SERVER_CERT).display(),
        key = pki.key(SERVER_CERT).display(),
        ca = pki.ca_cert().display(),
    )
}

/// HAProxy: an `h2` server line, connections reused by any stream.
pub fn haproxy_cfg(pem: &Path, pki: &DevPki, listen: SocketAddr, echo: SocketAddr) -> String {
    format!(
        r#"global
    maxconn 9000
    nbthread 2
    tune.h2.max-concurrent-streams 1000
defaults
    mode http
    timeout connect 5s
    timeout client 600s
    timeout server 600s
    timeout http-keep-alive 600s
frontend grpc
    bind {listen} ssl crt {pem} ca-file {ca} verify required alpn h2 ssl-min-ver TLSv1.3
    default_backend echo
backend echo
    http-reuse always
    server echo {echo} proto h2
"#,
        pem = pem.display(),
        ca = pki.ca_cert().display(),
    )
}

/// Envoy: an HTTP/2 listener with a required client certificate, an HTTP/2
/// cluster, circuit breakers lifted (the default of 1,024 requests would
/// refuse the 2,000 idle streams).
pub fn envoy_yaml(pki: &DevPki, listen: SocketAddr, echo: SocketAddr) -> String {
    let mut y = String::new();
    let _ = write!(
        y,
        r#"static_resources:
  listeners:
  - name: grpc
    address: {{socket_address: {{address: "{lip}", port_value: {lport}}}}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            tls_params: {{tls_minimum_protocol_version: TLSv1_3, tls_maximum_protocol_version: TLSv1_3}}
            alpn_protocols: [h2]
            tls_certificates:
            - certificate_chain: {{filename: "{cert}"}}
              private_key: {{filename: "{key}"}}
            validation_context:
              trusted_ca: {{filename: "{ca}"}}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: grpc
          codec_type: HTTP2
          stream_idle_timeout: 600s
          http2_protocol_options: {{max_concurrent_streams: 1000}}
          route_config:
            virtual_hosts:
            - name: echo
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: echo, timeout: 0s}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: echo
    type: STATIC
    connect_timeout: 5s
    circuit_breakers:
      thresholds:
      - {{max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}}
    load_assignment:
      cluster_name: echo
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: "{eip}", port_value: {eport}}}}}}}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{max_concurrent_streams: 100000}}
"#,
        lip = listen.ip(),
        lport = listen.port(),
        eip = echo.ip(),
        eport = echo.port(),
        cert = pki.cert(SERVER_CERT).display(),
        key = pki.key(SERVER_CERT).display(),
        ca = pki.ca_cert().display(),
    );
    y
}

/// The gateway, agent path: the echo backend is its one sidecar (h2c). Its
/// policy grants each agent of the benches — the load
/// ([`crate::grpc_wire::AGENT_ID`]), the newcomers and the hostile bench's
/// attacker — the account named as its agent id. With `lifted`, the
/// handshake (global and per client network) and `Hello` rate limits are
/// lifted (for throughput, where their
/// defaults would be what is measured); without, the gateway runs with its
/// defaults, as it ships.
pub fn gateway_yaml(pki: &DevPki, listen: SocketAddr, echo: SocketAddr, lifted: bool) -> String {
    let limits = if lifted {
        "listener:\n  maxConnections: 40000\n  handshakesPerSecond: 1000000\n  handshakeBurst: 1000000\n  handshakesPerSecondPerSource: 1000000\n  handshakeBurstPerSource: 1000000\n  helloPerSecond: 1000000\n  helloBurst: 1000000\n"
    } else {
        ""
    };
    let mut policy = String::new();
    let agents = [
        crate::grpc_wire::AGENT_ID.to_owned(),
        crate::grpc_wire::ATTACKER_ID.to_owned(),
    ]
    .into_iter()
    .chain((0..crate::grpc_wire::NEWCOMERS).map(crate::grpc_wire::newcomer));
    for id in agents {
        let _ = write!(
            policy,
            "  - identities: [\"{}\"]\n    accounts: [\"{id}\"]\n",
            spinlink_tls::dev::dev_agent_identity(&id)
        );
    }
    format!(
        r#"gatewayId: bench
listen: "{listen}"
tls:
  certFile: "{cert}"
  keyFile: "{key}"
  clientCaFile: "{ca}"
  reloadIntervalSeconds: 0
policy:
{policy}upstreams:
  - url: "http://{echo}"
{limits}"#,
        cert = pki.cert(SERVER_CERT).display(),
        key = pki.key(SERVER_CERT).display(),
        ca = pki.ca_cert().display(),
    )
}

/// The peers' binaries, as the benches take them on the command line; a
/// peer without one is skipped.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Peers {
    /// nginx binary (skipped when absent).
    #[arg(long)]
    pub nginx: Option<PathBuf>,
    /// HAProxy binary (skipped when absent).
    #[arg(long)]
    pub haproxy: Option<PathBuf>,
    /// Envoy binary (skipped when absent).
    #[arg(long)]
    pub envoy: Option<PathBuf>,
}

impl Peers {
    /// Every front to run, the gateway (`spinlink`) first.
    pub fn fronts(&self, spinlink: &Path) -> Vec<(Kind, PathBuf)> {
        [
            (Kind::Gateway, Some(spinlink.to_owned())),
            (Kind::Nginx, self.nginx.clone()),
            (Kind::Haproxy, self.haproxy.clone()),
            (Kind::Envoy, self.envoy.clone()),
        ]
        .into_iter()
        .filter_map(|(k, b)| b.map(|b| (k, b)))
        .collect()
    }
}

/// The fronts measured against each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `spinlink gateway`, its agent path.
    Gateway,
    /// nginx, `grpc_pass`.
    Nginx,
    /// HAProxy, an `h2` server line.
    Haproxy,
    /// Envoy, an HTTP/2 cluster.
    Envoy,
}

impl Kind {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Gateway => "gateway",
            Kind::Nginx => "nginx",
            Kind::Haproxy => "haproxy",
            Kind::Envoy => "envoy",
        }
    }
}

/// One front running on loopback in front of the echo backend.
pub struct Front {
    /// Which one.
    pub kind: Kind,
    /// Where it listens (TLS 1.3, client certificate required).
    pub addr: SocketAddr,
    /// What its binary says its version is.
    pub version: String,
    proc: PeerProc,
}

impl Front {
    /// Starts `kind` from `bin` in front of `echo` (h2c), its configuration
    /// and log in `dir`; the gateway gets `gateway` (its listen address in,
    /// its YAML out). Returns once it accepts connections.
    pub fn start(
        kind: Kind,
        bin: &Path,
        pki: &DevPki,
        dir: &Path,
        echo: SocketAddr,
        gateway: &dyn Fn(SocketAddr) -> String,
    ) -> anyhow::Result<Front> {
        Self::start_under(kind, bin, pki, dir, echo, gateway, &[], START_WAIT)
    }

    /// [`Front::start`], the front run by the command `under` (a program and
    /// its arguments, the front's command line appended; none runs it
    /// directly), given `wait` to open its port.
    #[allow(clippy::too_many_arguments)]
    pub fn start_under(
        kind: Kind,
        bin: &Path,
        pki: &DevPki,
        dir: &Path,
        echo: SocketAddr,
        gateway: &dyn Fn(SocketAddr) -> String,
        under: &[String],
        wait: Duration,
    ) -> anyhow::Result<Front> {
        let listen = free_port()?;
        let name = kind.name();
        let cfg = dir.join(match kind {
            Kind::Gateway => "gateway.yaml",
            Kind::Nginx => "nginx.conf",
            Kind::Haproxy => "haproxy.cfg",
            Kind::Envoy => "envoy.yaml",
        });
        let log = dir.join(format!("{name}.log"));
        let (text, args, version_args): (String, Vec<String>, &[&str]) = match kind {
            Kind::Gateway => (
                gateway(listen),
                vec!["gateway".into(), "--config".into(), path(&cfg)?.into()],
                &["--version"],
            ),
            Kind::Nginx => (
                nginx_conf(pki, dir, listen, echo),
                vec![
                    "-p".into(),
                    path(dir)?.into(),
                    "-c".into(),
                    path(&cfg)?.into(),
                    "-e".into(),
                    path(&log)?.into(),
                ]
                .into_iter()
                // Under a wrapper (valgrind), workers keep the master's
                // user: a worker that switched to `nobody` could neither
                // answer the wrapper's control requests nor write its files.
                .chain(
                    (!under.is_empty() && rustix::process::getuid().is_root())
                        .then(|| ["-g".into(), "user root;".into()])
                        .into_iter()
                        .flatten(),
                )
                .collect(),
                &["-v"],
            ),
            Kind::Haproxy => (
                haproxy_cfg(&haproxy_pem(pki, dir)?, pki, listen, echo),
                vec!["-db".into(), "-f".into(), path(&cfg)?.into()],
                &["-v"],
            ),
            Kind::Envoy => (
                envoy_yaml(pki, listen, echo),
                vec![
                    "-c".into(),
                    path(&cfg)?.into(),
                    "--concurrency".into(),
                    "2".into(),
                    "--log-level".into(),
                    "warn".into(),
                    "--disable-hot-restart".into(),
                ],
                &["--version"],
            ),
        };
        std::fs::write(&cfg, text)?;
        let (program, args): (&Path, Vec<&str>) = match under.split_first() {
            None => (bin, args.iter().map(String::as_str).collect()),
            Some((program, first)) => (
                Path::new(program),
                first
                    .iter()
                    .map(String::as_str)
                    .chain([path(bin)?])
                    .chain(args.iter().map(String::as_str))
                    .collect(),
            ),
        };
        // No front keeps an access log (nginx: `access_log off`; HAProxy and
        // Envoy log no requests unless told to), and every front logs
        // warnings and worse: nginx's `error_log … warn` leaves out its
        // per-connection `info` lines, so the gateway's (an agent
        // connection's end) are left out the same way.
        let env: &[(&str, &str)] = match kind {
            Kind::Gateway => &[("SPINLINK_LOG", "warn")],
            _ => &[],
        };
        let mut proc = PeerProc::start(program, &args, env, &log)?;
        // The gateway's drain on SIGTERM would only slow the bench down.
        proc.sigkill = kind == Kind::Gateway;
        wait_port_for(listen, name, &log, wait)?;
        Ok(Front {
            kind,
            addr: listen,
            version: version(bin, version_args),
            proc,
        })
    }

    /// Its process id (the master's, for nginx).
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }
}

/// `p` as a command-line argument.
pub fn path(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("non-UTF-8 path")
}

/// The first line `bin args` prints, on stdout or stderr.
pub fn version(bin: &Path, args: &[&str]) -> String {
    Command::new(bin)
        .args(args)
        .output()
        .map(|o| {
            let mut t = String::from_utf8_lossy(&o.stdout).into_owned();
            t.push_str(&String::from_utf8_lossy(&o.stderr));
            t.lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .unwrap_or_default()
}

/// Writes HAProxy's certificate-and-key file.
pub fn haproxy_pem(pki: &DevPki, dir: &Path) -> anyhow::Result<PathBuf> {
    let pem = dir.join("haproxy.pem");
    let mut text = std::fs::read_to_string(pki.cert(SERVER_CERT))?;
    text.push_str(&std::fs::read_to_string(pki.key(SERVER_CERT))?);
    std::fs::write(&pem, text)?;
    Ok(pem)
}

/// `pid` and its direct children (nginx's workers).
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in entries.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        // `pid (comm) state ppid ...`; comm may hold spaces, so split after ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            pids.push(child);
        }
    }
    pids
}

/// Summed RSS of `pids`, in bytes.
pub fn rss(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| crate::alloc::rss_of(&p.to_string()))
        .sum()
}

/// CPU time (user and system) `pids` have used, in seconds (`/proc` counts
/// in USER_HZ, 100 per second on Linux).
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|stat| {
            // Fields after `(comm)`: state is the 1st, utime the 12th, stime the 13th.
            let rest = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let user: f64 = f.get(11)?.parse().ok()?;
            let system: f64 = f.get(12)?.parse().ok()?;
            Some((user + system) / 100.0)
        })
        .sum()
}

/// Established TCP connections that `pids` hold to `port` on loopback: the
/// upstream connections a proxy keeps to the backend.
pub fn connections_to(pids: &[u32], port: u16) -> usize {
    let mut inodes = std::collections::HashSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                let link = link.to_string_lossy().into_owned();
                if let Some(inode) = link
                    .strip_prefix("socket:[")
                    .and_then(|s| s.strip_suffix(']'))
                    .and_then(|s| s.parse::<u64>().ok())
                {
                    inodes.insert(inode);
                }
            }
        }
    }
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                continue;
            }
            let rem_port = f[2]
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            let established = f[3] == "01";
            let inode = f[9].parse::<u64>().ok();
            if established && rem_port == Some(port) && inode.is_some_and(|i| inodes.contains(&i)) {
                n += 1;
            }
        }
    }
    n
}
