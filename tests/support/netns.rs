//! Pods as network namespaces, for the deployment test: each pod gets a
//! namespace of its own with its own loopback and one interface (`eth0`)
//! on a bridge that lives in a further namespace of the test's, so every
//! address the test assigns exists only inside namespaces it created and
//! nothing is added to the host's network. Needs root (`ip netns`); a
//! network is torn down when dropped, its pods' processes first (they are
//! owned by the test and dropped before it).
//!
//! Code runs in a pod in two ways: a process started through
//! `ip netns exec` ([`Pod::command`]), or a closure on a thread of the test
//! that has joined the pod's namespace ([`Pod::run`]); sockets that thread
//! opens (and threads it spawns) stay in the pod's network.

use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Why the deployment test cannot run here, if it cannot: it needs root and
/// `ip netns`. `None` when it can.
pub fn unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("it needs root to create network namespaces".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(out) if out.status.success() => None,
        _ => Some("`ip` (iproute2) is not installed".into()),
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running ip {args:?}: {e}"));
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// One test's network: a bridge in a namespace of its own, and pods.
pub struct Network {
    prefix: String,
    bridge: String,
    /// Namespaces created (deleted on drop).
    namespaces: Mutex<Vec<String>>,
    links: AtomicUsize,
    /// The subnet's first two octets, e.g. `[10, 77]` for 10.77.0.0/16.
    net: [u8; 2],
}

/// One pod: a network namespace with `lo` and `eth0` at [`Pod::ip`].
#[derive(Clone, Debug)]
pub struct Pod {
    /// The pod's name (for messages).
    pub name: String,
    /// Its namespace's name (`ip netns exec <ns>`).
    pub ns: String,
    /// Its address on the network.
    pub ip: Ipv4Addr,
    /// Its interface's far end, on the bridge (in the network's namespace).
    bridge_ns: String,
    port: String,
}

impl Network {
    /// A new network on `net`.0.0/16, its namespaces named `<prefix>-…`
    /// (the prefix gets the process id, so parallel runs never collide).
    pub fn new(prefix: &str, net: [u8; 2]) -> Network {
        let prefix = format!("{prefix}{}", std::process::id());
        let bridge = format!("{prefix}-net");
        let _ = Command::new("ip").args(["netns", "del", &bridge]).output();
        ip(&["netns", "add", &bridge]);
        let network = Network {
            prefix,
            bridge: bridge.clone(),
            namespaces: Mutex::new(vec![bridge.clone()]),
            links: AtomicUsize::new(0),
            net,
        };
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &bridge, "link", "set", "br0", "up"]);
        network
    }

    /// The address `host` (the last two octets) on this network.
    pub fn addr(&self, host: [u8; 2]) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], host[0], host[1])
    }

    /// A new pod `name` at `addr(host)`, with `lo` and `eth0` up.
    pub fn pod(&self, name: &str, host: [u8; 2]) -> Pod {
        let ns = format!("{}-{name}", self.prefix);
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        ip(&["netns", "add", &ns]);
        self.namespaces.lock().unwrap().push(ns.clone());
        let port = format!("p{}", self.links.fetch_add(1, Ordering::Relaxed));
        let ip_addr = self.addr(host);
        // Both ends are created in namespaces of the test's: the bridge
        // port in the network's, eth0 in the pod's.
        ip(&[
            "-n",
            &self.bridge,
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &ns,
        ]);
        ip(&["-n", &self.bridge, "link", "set", &port, "master", "br0"]);
        ip(&["-n", &self.bridge, "link", "set", &port, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{ip_addr}/16"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        Pod {
            name: name.to_owned(),
            ns,
            ip: ip_addr,
            bridge_ns: self.bridge.clone(),
            port,
        }
    }

    /// Deletes a pod's namespace (its processes must have exited).
    pub fn delete(&self, pod: &Pod) {
        let _ = Command::new("ip").args(["netns", "del", &pod.ns]).output();
        self.namespaces.lock().unwrap().retain(|n| *n != pod.ns);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for ns in self.namespaces.lock().unwrap().drain(..).rev() {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
    }
}

impl Pod {
    /// `program` run inside the pod's network (`ip netns exec`, which
    /// execs: the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns]).arg(program);
        command
    }

    /// Runs `f` on a thread that has joined the pod's network namespace,
    /// and returns what it returns.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.ns);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file =
                    std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
                // This thread alone changes network namespace, and it ends
                // with the scope.
                rustix::thread::move_into_link_name_space(
                    file.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap_or_else(|e| panic!("setns into {path}: {e}"));
                f()
            })
            .join()
            .expect("a thread in a pod's network")
        })
    }

    /// Takes the pod off the network (its bridge port down: packets are
    /// dropped both ways, connections are not reset), or puts it back.
    pub fn set_link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.bridge_ns, "link", "set", &self.port, state]);
    }
}
