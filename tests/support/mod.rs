//! What the end-to-end tests share: running the real `spinlink` binary as
//! separate processes, real kubectl with its own HOME and cache, a loopback
//! recorder that keeps every byte it relays, and bounded waits.
#![allow(dead_code)]

pub mod balancer;
pub mod chain;
pub mod chart;
pub mod monitoring;
pub mod netns;
pub mod released_agent;
pub mod scale;
pub mod store;
pub mod workload;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// The binary under test.
pub const SPINLINK: &str = env!("CARGO_BIN_EXE_spinlink");

/// The longest any single wait in these tests may take.
pub const WAIT: Duration = Duration::from_secs(90);

/// A running `spinlink` process: its stdout lines are collected, its stderr
/// goes to a log file printed when the test fails. Killed on drop.
pub struct Proc {
    pub name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    log: PathBuf,
}

impl Proc {
    /// Starts `spinlink <args>`, logging to `<dir>/<name>.log`.
    pub fn start(name: &str, dir: &Path, args: &[&str]) -> Proc {
        let mut command = Command::new(SPINLINK);
        command.args(args);
        Proc::spawn(name, dir, command)
    }

    /// Starts `command` (the binary under test, perhaps wrapped, as by
    /// `ip netns exec`), logging to `<dir>/<name>.log`.
    pub fn spawn(name: &str, dir: &Path, mut command: Command) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("creating log file");
        let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
        let mut child = command
            .env("SPINLINK_LOG", "info,spinlink=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {args:?}: {e}"));
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            name: name.to_owned(),
            child,
            lines,
            seen: Vec::new(),
            log,
        }
    }

    /// Waits for a stdout line starting with `prefix` and returns the rest.
    pub fn wait_line(&mut self, prefix: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.starts_with(prefix)) {
            return line[prefix.len()..].trim().to_owned();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                }
                Err(_) => panic!(
                    "{}: no line starting with {prefix:?} (exited: {:?})\n{}",
                    self.name,
                    self.child.try_wait(),
                    self.log_tail()
                ),
            }
        }
    }

    /// Like [`Proc::wait_line`], but `None` once the process has exited
    /// without printing it (a port still taken, say).
    pub fn try_wait_line(&mut self, prefix: &str) -> Option<String> {
        if let Some(line) = self.seen.iter().find(|l| l.starts_with(prefix)) {
            return Some(line[prefix.len()..].trim().to_owned());
        }
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return Some(rest.trim().to_owned());
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        None
    }

    /// Like [`Proc::listening`], but `None` once the process has exited.
    pub fn try_listening(&mut self, what: &str) -> Option<SocketAddr> {
        self.try_wait_line(&format!("listening: {what} "))
            .and_then(|rest| rest.parse().ok())
    }

    /// Waits for `listening: <what> <addr>`.
    pub fn listening(&mut self, what: &str) -> SocketAddr {
        let rest = self.wait_line(&format!("listening: {what} "));
        rest.parse()
            .unwrap_or_else(|e| panic!("{}: bad address {rest:?}: {e}", self.name))
    }

    /// The stdout lines read so far (by the waits) that start with `prefix`.
    pub fn seen(&self, prefix: &str) -> Vec<&str> {
        self.seen
            .iter()
            .filter(|l| l.starts_with(prefix))
            .map(String::as_str)
            .collect()
    }

    /// The last lines of the process's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(40);
        format!("--- {} log ---\n{}", self.name, lines[start..].join("\n"))
    }

    /// The whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process at once (SIGKILL): a crash, not a drain.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGINT (what Ctrl-C sends) and waits for the exit status.
    pub fn interrupt(&mut self) -> std::process::ExitStatus {
        self.signal_and_wait("-INT")
    }

    /// Sends SIGTERM (what Kubernetes sends a pod it stops) and waits for
    /// the exit status: the process drains first.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal_and_wait("-TERM")
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn signal_and_wait(&mut self, signal: &str) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args([signal, &pid]).status();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for child") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not stop after {signal}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
            // The whole log, for a failure the last lines do not explain.
            if let Some(dir) = std::env::var_os("SPINLINK_TEST_LOG_DIR") {
                let dir = Path::new(&dir);
                let copied = std::fs::create_dir_all(dir).and_then(|()| {
                    std::fs::copy(&self.log, dir.join(format!("{}.log", self.name)))
                });
                if let Err(e) = copied {
                    eprintln!("copying {}'s log to {}: {e}", self.name, dir.display());
                }
            }
        }
    }
}

/// Writes `text` to `dir/name`; returns the path as a string, for a
/// command-line argument.
pub fn write_file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A loopback port free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `spinlink kube-sim` (demo workload) in `dir`; returns the process
/// and the kubeconfig it wrote (`dir/sim.kubeconfig`).
pub fn kube_sim(dir: &Path) -> (Proc, PathBuf) {
    kube_sim_with(dir, &[])
}

/// [`kube_sim`] with more `kube-sim` arguments.
pub fn kube_sim_with(dir: &Path, extra: &[&str]) -> (Proc, PathBuf) {
    let kubeconfig = dir.join("sim.kubeconfig");
    let mut args = vec![
        "kube-sim",
        "--listen",
        "127.0.0.1:0",
        "--kubeconfig-out",
        kubeconfig.to_str().expect("a UTF-8 temp path"),
    ];
    args.extend_from_slice(extra);
    let mut sim = Proc::start("kube-sim", dir, &args);
    sim.listening("kube-sim");
    (sim, kubeconfig)
}

/// Starts `spinlink dev` with its state in `state`, in front of the cluster
/// `kubeconfig` names (its own kube-sim without one), on free ports; returns
/// once it is ready.
pub fn dev(dir: &Path, state: &Path, kubeconfig: Option<&Path>) -> Proc {
    let mut args = vec![
        "dev",
        "--state-dir",
        state.to_str().expect("a UTF-8 temp path"),
        "--gateway-listen",
        "127.0.0.1:0",
        "--facade-listen",
        "127.0.0.1:0",
    ];
    if let Some(k) = kubeconfig {
        args.extend(["--kubeconfig", k.to_str().expect("a UTF-8 temp path")]);
    }
    let mut dev = Proc::start("dev", dir, &args);
    dev.wait_line("ready: ");
    dev
}

/// Real kubectl with a private HOME and discovery cache.
pub struct Kubectl {
    home: PathBuf,
    kubeconfig: PathBuf,
    bin: Option<PathBuf>,
    /// The network namespace it runs in (`ip netns exec`), if not the test's.
    netns: Option<String>,
}

impl Kubectl {
    /// A kubectl for `kubeconfig`, with its HOME under `dir/<name>`.
    pub fn new(dir: &Path, name: &str, kubeconfig: &Path) -> Kubectl {
        let home = dir.join(format!("kubectl-{name}"));
        std::fs::create_dir_all(&home).unwrap();
        Kubectl {
            home,
            kubeconfig: kubeconfig.to_owned(),
            bin: None,
            netns: None,
        }
    }

    /// The same, run inside `pod`'s network.
    pub fn in_pod(mut self, pod: &netns::Pod) -> Kubectl {
        self.netns = Some(pod.ns.clone());
        self
    }

    /// The same, running the kubectl binary at `bin`.
    pub fn with_binary(mut self, bin: &Path) -> Kubectl {
        self.bin = Some(bin.to_owned());
        self
    }

    /// The kubectl command for `args`, output piped.
    fn command(&self, args: &[&str]) -> (PathBuf, Command) {
        let bin = self.bin.clone().unwrap_or_else(|| {
            std::env::var_os("SPINLINK_KUBECTL").map_or_else(|| "kubectl".into(), PathBuf::from)
        });
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.home.join("cache"))
            .arg("--request-timeout=60s")
            .args(args)
            .env("HOME", &self.home)
            .env_remove("KUBECONFIG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        (bin, command)
    }

    /// Starts kubectl with `args` (a command that runs on, like `logs -f`)
    /// and sends each line it prints to the receiver as it comes.
    pub fn spawn_lines(&self, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
        let (bin, mut command) = self.command(args);
        let mut child = command
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        (child, rx)
    }

    /// Runs kubectl with `args` and `stdin`, returning its output.
    pub fn run_with_input(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let (bin, mut command) = self.command(args);
        let mut child = command
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        // A kubectl that hangs (a watch that never ends) fails the test
        // here, naming the command, instead of at the test runner's timeout.
        let pid = child.id();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if done_rx.recv_timeout(WAIT).is_err() {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        });
        let started = Instant::now();
        let out = child.wait_with_output().unwrap();
        let _ = done_tx.send(());
        assert!(
            started.elapsed() < WAIT,
            "kubectl {args:?} did not finish within {WAIT:?}; killed"
        );
        out
    }

    /// The lines kubectl prints for `args` (like `get pods -A -o name`),
    /// sorted; panics when it fails.
    pub fn sorted_lines(&self, args: &[&str]) -> Vec<String> {
        let mut lines: Vec<String> = self.ok(args).lines().map(str::to_owned).collect();
        lines.sort();
        lines
    }

    /// Runs kubectl and returns stdout, panicking with stderr on failure.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_with_input(args, None)
    }

    /// Like [`Kubectl::ok`] with standard input.
    pub fn ok_with_input(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run_with_input(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\nstdout: {}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// Polls `check` until it returns `Some`, for at most [`WAIT`].
pub fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A plain HTTP/1.1 request on loopback; returns status and body.
pub fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    try_http(addr, method, path, headers).unwrap_or_else(|| panic!("no answer from {addr}"))
}

/// Like [`http`], but `None` when nothing answers (a process restarting).
pub fn try_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    try_http_with_body(addr, method, path, headers, "")
}

/// `method path` with a JSON `body`; returns status and body.
pub fn send_json(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    try_http_with_body(
        addr,
        method,
        path,
        &[("Content-Type", "application/json")],
        body,
    )
    .unwrap_or_else(|| panic!("no answer from {addr}"))
}

/// Like [`try_http`], with `body` sent (and its `Content-Length`) when not
/// empty.
pub fn try_http_with_body(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A TCP relay on loopback that records every byte in both directions.
#[derive(Clone)]
pub struct Recorder {
    pub addr: SocketAddr,
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl Recorder {
    /// Listens on an ephemeral loopback port and relays to `upstream`.
    pub fn start(upstream: SocketAddr) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let recorder = Recorder {
            addr: listener.local_addr().unwrap(),
            bytes: Arc::default(),
        };
        let bytes = recorder.bytes.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { break };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let bytes = bytes.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                            bytes.lock().unwrap().extend_from_slice(&buf[..n]);
                        }
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        recorder
    }

    /// Everything relayed so far.
    pub fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }
}

/// Whether `haystack` contains `needle`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Writes a kubeconfig whose one context reaches `server`.
pub fn write_kubeconfig(path: &Path, server: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
         users:\n- name: u\n  user: {{}}\n"
    );
    std::fs::write(path, text).unwrap();
}

/// A Deployment manifest named `name` in `namespace`.
pub fn deployment(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  \
         labels:\n    app: {name}\nspec:\n  replicas: 1\n  selector:\n    matchLabels:\n      app: {name}\n  \
         template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      containers:\n      \
         - name: web\n        image: nginx:1.27\n        ports:\n        - containerPort: 80\n"
    )
}

/// splitmix64: the same choices for the same seed, on every platform (the
/// seeded chaos tests).
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// One of `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Between `lo` and `hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }
}
