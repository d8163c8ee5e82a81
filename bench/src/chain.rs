//! The system under test as separate processes on loopback: `spinlink
//! kube-sim --seed-pods N` and `spinlink dev --kubeconfig` in front of it, as
//! `tests/e2e_kubectl.rs` starts them. Every wait is bounded; processes are
//! killed when the [`Chain`] is dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The `spinlink` binary next to this one (`target/release/spinlink` when
/// this is `target/release/spinlink-bench`).
pub fn default_spinlink() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    // Test binaries live one level down, in `deps/`.
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("spinlink")
}

/// One running `spinlink` process; its stdout lines are collected.
pub struct Proc {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    log: PathBuf,
}

impl Proc {
    /// Starts `spinlink <args>`, stderr to `<dir>/<name>.log`.
    pub fn start(spinlink: &Path, name: &str, dir: &Path, args: &[&str]) -> anyhow::Result<Proc> {
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log)?;
        let mut child = Command::new(spinlink)
            .args(args)
            // Request logging would be part of what is measured.
            .env("SPINLINK_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {} {args:?}", spinlink.display()))?;
        let stdout = child.stdout.take().context("stdout piped")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Proc {
            name: name.to_owned(),
            child,
            lines,
            log,
        })
    }

    /// Waits at most `wait` for a stdout line starting with `prefix`.
    pub fn wait_line(&mut self, prefix: &str, wait: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return Ok(rest.trim().to_owned());
                    }
                }
                Err(_) => {
                    let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(20).collect();
                    bail!(
                        "{}: no line {prefix:?} within {wait:?} (exited: {:?}); log tail:\n{}",
                        self.name,
                        self.child.try_wait(),
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    )
                }
            }
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits at most `wait` for the process to exit (e.g. after a SIGTERM);
    /// its status, or `None` if it still runs.
    pub fn wait_exit(&mut self, wait: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + wait;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kube-sim with seeded pods and the dev chain in front of it.
pub struct Chain {
    /// The simulated cluster.
    pub sim: Proc,
    /// `spinlink dev`: agent, gateway and sidecar in one process.
    pub dev: Proc,
    /// kube-sim's address (plain HTTP).
    pub sim_addr: SocketAddr,
    /// The facade's address (plain HTTP).
    pub facade_addr: SocketAddr,
    /// Kubeconfig straight at kube-sim.
    pub sim_kubeconfig: PathBuf,
    /// Kubeconfig through the facade (account `dev`).
    pub facade_kubeconfig: PathBuf,
    /// How long seeding kube-sim took (process start to listening).
    pub seed_time: Duration,
    /// How long the dev chain took to cache the cluster (start to `ready:`).
    pub sync_time: Duration,
}

/// How long kube-sim may take to seed and the chain to cache it.
pub const START_WAIT: Duration = Duration::from_secs(900);

impl Chain {
    /// Starts kube-sim with `pods` seeded pods (no demo workload) and `spinlink
    /// dev` in front of it, in `dir`; returns once the account is cached.
    pub fn start(spinlink: &Path, dir: &Path, pods: usize) -> anyhow::Result<Chain> {
        let sim_kubeconfig = dir.join("sim.kubeconfig");
        let t = Instant::now();
        let pods_arg = pods.to_string();
        let mut sim = Proc::start(
            spinlink,
            "kube-sim",
            dir,
            &[
                "kube-sim",
                "--listen",
                "127.0.0.1:0",
                "--empty",
                "--seed-pods",
                &pods_arg,
                "--kubeconfig-out",
                path_str(&sim_kubeconfig)?,
            ],
        )?;
        let sim_addr: SocketAddr = sim.wait_line("listening: kube-sim ", START_WAIT)?.parse()?;
        let seed_time = t.elapsed();
        let state = dir.join("state");
        let t = Instant::now();
        let timeout = START_WAIT.as_secs().to_string();
        let mut dev = Proc::start(
            spinlink,
            "dev",
            dir,
            &[
                "dev",
                "--state-dir",
                path_str(&state)?,
                "--kubeconfig",
                path_str(&sim_kubeconfig)?,
                "--gateway-listen",
                "127.0.0.1:0",
                "--facade-listen",
                "127.0.0.1:0",
                "--ready-timeout",
                &timeout,
            ],
        )?;
        let facade_addr: SocketAddr = dev
            .wait_line("listening: sidecar-facade ", START_WAIT)?
            .parse()?;
        dev.wait_line("ready: ", START_WAIT)?;
        // `ready:` says every kind finished a listing; wait until the pods are
        // all in the cache too, so nothing measured overlaps the loading.
        wait_cached(facade_addr, pods, START_WAIT)?;
        let sync_time = t.elapsed();
        Ok(Chain {
            sim,
            dev,
            sim_addr,
            facade_addr,
            sim_kubeconfig,
            facade_kubeconfig: state.join("kubeconfig"),
            seed_time,
            sync_time,
        })
    }

    /// Base URL of the account's API through the facade.
    pub fn facade_url(&self) -> String {
        format!("http://{}/accounts/dev", self.facade_addr)
    }

    /// Base URL of kube-sim.
    pub fn sim_url(&self) -> String {
        format!("http://{}", self.sim_addr)
    }
}

/// The `/metrics` gauge `name` of account `dev`.
pub fn gauge(facade: SocketAddr, name: &str) -> anyhow::Result<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let text = rt.block_on(crate::load::fetch(&format!("http://{facade}/metrics")))?;
    let prefix = format!("{name}{{account=\"dev\"}} ");
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .with_context(|| format!("no {prefix} in /metrics"))
}

/// Waits (polling every 100 ms, at most `wait`) until the sidecar caches at
/// least `pods` objects.
fn wait_cached(facade: SocketAddr, pods: usize, wait: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + wait;
    loop {
        let held = gauge(facade, "spinlink_sidecar_cache_objects").unwrap_or(0);
        if held >= pods as u64 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the sidecar caches {held} objects, not {pods}, after {wait:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("non-UTF-8 path")
}
