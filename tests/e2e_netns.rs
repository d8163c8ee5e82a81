//! The Spinnaker-side chart as a cluster runs it, each pod in a network
//! namespace of its own (root and `ip netns` needed; CI has both).
//!
//! The chart is rendered with Helm's SDK for two gateways and three
//! Clouddriver pods carrying the sidecar, on PostgreSQL (when
//! `SPINLINK_TEST_POSTGRES_URL` is set; a shared SQLite file otherwise).
//! What a cluster would do around it, the test does, and nothing more:
//!
//! - cert-manager: every rendered `Certificate` is issued from the CA its
//!   issuer names, written as the Secret the pods mount;
//! - the kubelet: each pod's container runs with the rendered arguments and
//!   environment (`$(POD_IP)` from the pod's address), its ConfigMaps and
//!   Secrets mounted (files written, mount paths pointed at them);
//! - the EndpointSlice controller: the sidecar Service's slice, in a
//!   kube-sim standing for the Spinnaker cluster's API server, lists each
//!   running sidecar pod (ready, or terminating while it drains); the
//!   gateways find the sidecars through it, as rendered (`discovery:
//!   endpointSlices`, their kubeconfig from `KUBECONFIG` as a service
//!   account's would be);
//! - the NLB: a TCP balancer in a pod of its own, sending PROXY v2 as the
//!   chart's NLB annotations ask;
//! - the database: a TCP forwarder in a pod of its own to the PostgreSQL
//!   server on the host.
//!
//! The agent runs in a further pod with the cluster it serves (kube-sim,
//! on that pod's loopback), with the agent certificate the chart issued.
//! kubectl runs inside each Clouddriver pod, against that pod's own facade
//! on loopback: the only way it can reach it.
//!
//! Three scenarios, each on a deployment of its own: failover (the pod
//! owning the account dies, then the gateway the agent is on), rolling
//! restarts (every sidecar pod, then every gateway pod, replaced the way a
//! Deployment's rolling update does it: new pod with a new address first),
//! and seeded chaos with real network partitions (a pod's link down).
//! Failover and rolling restarts fail no kubectl command; after each
//! scenario every pod's cache equals the cluster.

mod support;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::balancer::Balancer;
use support::chart::{self, Data};
use support::netns::{Network, Pod};
use support::store::SharedStore;
use support::workload::{self, Objects, Workload};
use support::{Kubectl, Proc, Rng, SPINLINK, try_http, wait_for, write_kubeconfig};

const RELEASE: &str = "spl";
const NAMESPACE: &str = "spinnaker";
const FULLNAME: &str = "spl-spinlink";
const ACCOUNT: &str = "prod";
const AGENT: &str = "prod-eu";
/// The NLB's DNS name, in the gateway certificate.
const GATEWAY_DNS: &str = "gateway.spinlink.test";
const TUNNEL_PORT: u16 = 7001;
const FACADE_PORT: u16 = 7009;
const GATEWAY_PORT: u16 = 7443;

/// Stops the test with a clear message where it cannot run.
fn require_netns() {
    if let Some(why) = support::netns::unavailable() {
        panic!(
            "the network-namespace deployment test cannot run: {why}. Run the suite as root \
             with iproute2 installed (.ci/run does), or leave this binary out: \
             cargo nextest run --workspace -E 'not binary(e2e_netns)'"
        );
    }
}

/// The values the deployment is rendered with: two gateways, the chart's
/// certificates, one agent allowed account `prod`, the shared store.
fn values(store: &Store) -> Value {
    let store_values = match store {
        Store::Postgres {
            user,
            database,
            schema,
            ..
        } => json!({"postgresql": {
            "enabled": true, "host": "10.77.0.5", "port": 5432, "database": database,
            "user": user, "sslMode": "disable", "schema": schema,
            "passwordSecret": {"name": "spinlink-db"}}}),
        Store::Sqlite(path) => json!({"url": format!("sqlite://{}", path.display())}),
    };
    json!({
        "gateway": {
            "replicaCount": 2,
            "autoscaling": {"enabled": false},
            "policy": [{"identities": [format!("spiffe://spinlink/agent/{AGENT}")],
                        "accounts": [ACCOUNT]}],
            "config": {"shutdownGraceSeconds": 8,
                       "upstreamPool": {"healthCheck": {"intervalSeconds": 1,
                                                        "unhealthyThreshold": 1}}},
        },
        "sidecar": {
            // Registration with Clouddriver has tests of its own
            // (sidecar/tests/clouddriver.rs); no Clouddriver runs here.
            "clouddriver": {"registration": {"enabled": false}},
            "store": store_values,
            "config": {"ownership": {"leaseSeconds": 3}},
        },
        "certManager": {"enabled": true, "gatewayDnsNames": [GATEWAY_DNS],
                        "agents": [{"id": AGENT}]},
    })
}

enum Store {
    Postgres {
        user: String,
        database: String,
        schema: String,
        server: SocketAddr,
        _shared: SharedStore,
    },
    Sqlite(PathBuf),
}

impl Store {
    fn new(dir: &Path, prefix: &str) -> Store {
        let Ok(url) = std::env::var("SPINLINK_TEST_POSTGRES_URL") else {
            return Store::Sqlite(dir.join("shared.db"));
        };
        // postgres://user@host:port/database: the schema is what SharedStore
        // makes; the sidecars reach the server through the database pod.
        let shared = SharedStore::new(dir, prefix);
        let schema = shared
            .schema_name()
            .expect("a schema on PostgreSQL")
            .to_owned();
        let rest = url
            .strip_prefix("postgres://")
            .or(url.strip_prefix("postgresql://"));
        let rest = rest.expect("SPINLINK_TEST_POSTGRES_URL: postgres://user@host:port/db");
        let (user, rest) = rest
            .split_once('@')
            .expect("a user in SPINLINK_TEST_POSTGRES_URL");
        let (hostport, database) = rest.split_once('/').expect("a database");
        let database = database.split('?').next().unwrap().to_owned();
        let server = std::net::ToSocketAddrs::to_socket_addrs(hostport)
            .expect("the PostgreSQL server's address")
            .next()
            .unwrap();
        Store::Postgres {
            user: user.split(':').next().unwrap().to_owned(),
            database,
            schema,
            server,
            _shared: shared,
        }
    }
}

/// A pod and its one container's process.
struct Running {
    pod: Pod,
    proc: Option<Proc>,
}

impl Running {
    fn kill(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.kill();
        }
    }

    fn terminate(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            let t = Instant::now();
            let status = p.terminate();
            eprintln!("{} drained in {:?} ({status})", p.name, t.elapsed());
        }
    }
}

/// One deployment: every pod, and what stands in for the cluster around it.
/// Fields drop in order: processes first, the network last.
struct Deployment {
    dir: PathBuf,
    objects: Vec<Value>,
    data: Data,
    sidecars: Vec<Running>,
    gateways: Vec<Running>,
    agent: Running,
    /// The cluster the agent serves (kube-sim in the agent's pod).
    _cluster: Proc,
    cluster_kubeconfig: PathBuf,
    /// The Spinnaker cluster's API server (EndpointSlices).
    api: Running,
    api_kubeconfig: PathBuf,
    nlb: Balancer,
    _nlb_pod: Pod,
    db: Option<(Balancer, Pod)>,
    starts: usize,
    /// Host part of the next pod address handed out.
    next_host: u8,
    network: Network,
    store: Store,
}

impl Deployment {
    /// A deployment in namespaces named after `prefix`; `churn`: the
    /// cluster changes ConfigMaps until [`Deployment::stop_churn`].
    fn new(dir: &Path, prefix: &str, churn: bool) -> Deployment {
        require_netns();
        let store = Store::new(dir, &format!("spinlink_{prefix}"));
        let network = Network::new(prefix, [10, 77]);

        let values_path = dir.join("values.yaml");
        std::fs::write(
            &values_path,
            serde_json::to_string_pretty(&values(&store)).unwrap(),
        )
        .unwrap();
        let objects = chart::render("spinlink", &[&values_path], RELEASE, NAMESPACE);
        let mut data = chart::data(&objects);
        data.extend(chart::issue_certificates(&objects));
        data.insert(
            "spinlink-db".into(),
            BTreeMap::from([("password".to_owned(), "unused-with-trust-auth".to_owned())]),
        );

        // The database pod: a forwarder to the server on the host.
        let db = match &store {
            Store::Postgres { server, .. } => {
                let pod = network.pod("db", [0, 5]);
                let listener = pod.run(|| TcpListener::bind((pod.ip, 5432)).unwrap());
                // Accepted in the pod, connected from here (the host).
                Some((Balancer::on(listener, &[*server], None, false), pod))
            }
            Store::Sqlite(_) => None,
        };

        // The Spinnaker cluster's API server: the sidecar Service's
        // EndpointSlices.
        let api_pod = network.pod("api", [0, 2]);
        let api_kubeconfig = dir.join("api.kubeconfig");
        let mut api = Proc::spawn("api", dir, {
            let mut c = api_pod.command(SPINLINK);
            c.args(["kube-sim", "--listen", &format!("{}:6443", api_pod.ip)])
                .arg("--kubeconfig-out")
                .arg(&api_kubeconfig);
            c
        });
        api.listening("kube-sim");
        let admin = Kubectl::new(dir, "api-admin", &api_kubeconfig).in_pod(&api_pod);
        admin.ok_with_input(
            &["apply", "-f", "-"],
            Some(
                &json!({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": NAMESPACE}})
                .to_string(),
            ),
        );
        // The agent's pod: the cluster it serves, on its loopback.
        let agent_pod = network.pod("agent", [2, 1]);
        let cluster_kubeconfig = dir.join("cluster.kubeconfig");
        let mut cluster = Proc::spawn("cluster", dir, {
            let mut c = agent_pod.command(SPINLINK);
            c.args(["kube-sim", "--listen", "127.0.0.1:0"])
                .arg("--kubeconfig-out")
                .arg(&cluster_kubeconfig);
            if churn {
                c.args(["--churn-interval-millis", "100", "--churn-stop-file"])
                    .arg(dir.join("stop-churn"));
            }
            c
        });
        cluster.listening("kube-sim");

        let nlb_pod = network.pod("nlb", [0, 100]);
        let nlb = nlb_pod.run(|| {
            let listener = TcpListener::bind((nlb_pod.ip, 443)).unwrap();
            Balancer::on(listener, &[], None, true)
        });

        let mut d = Deployment {
            dir: dir.to_owned(),
            objects,
            data,
            sidecars: Vec::new(),
            gateways: Vec::new(),
            agent: Running {
                pod: agent_pod,
                proc: None,
            },
            _cluster: cluster,
            cluster_kubeconfig,
            api: Running {
                pod: api_pod,
                proc: Some(api),
            },
            api_kubeconfig,
            nlb,
            _nlb_pod: nlb_pod,
            db,
            starts: 0,
            next_host: 10,
            network,
            store,
        };
        for _ in 0..3 {
            let s = d.start_sidecar();
            d.sidecars.push(s);
        }
        d.publish_endpoints(None);
        let replicas = chart::find(&d.objects, "Deployment", &format!("{FULLNAME}-gateway"))
            ["spec"]["replicas"]
            .as_u64()
            .unwrap();
        assert_eq!(replicas, 2, "the chart renders two gateways");
        for _ in 0..replicas {
            let g = d.start_gateway();
            d.gateways.push(g);
        }
        d.set_nlb_targets();
        d.start_agent();
        d.owner();
        d
    }

    fn stop_churn(&self) {
        std::fs::write(self.dir.join("stop-churn"), "").unwrap();
    }

    fn next_pod(&mut self, what: &str) -> Pod {
        self.starts += 1;
        self.next_host += 1;
        let host = self.next_host;
        let group = if what == "gw" { 0 } else { 1 };
        self.network
            .pod(&format!("{what}{}", self.starts), [group, host])
    }

    /// A new Clouddriver pod with the sidecar container the chart's patch
    /// adds, started; not yet in the EndpointSlice.
    fn start_sidecar(&mut self) -> Running {
        let pod = self.next_pod("cd");
        let patch = &self.data[&format!("{FULLNAME}-clouddriver-patch")]["patch.yaml"];
        let patch: Value = serde_norway::from_str(patch).unwrap();
        let spec = &patch["spec"]["template"]["spec"];
        let root = self.dir.join(&pod.name);
        let container = chart::container(
            spec,
            "spinlink-sidecar",
            &self.data,
            &root,
            &[
                ("status.podIP", pod.ip.to_string()),
                ("metadata.name", format!("spin-clouddriver-{}", pod.name)),
            ],
        );
        let proc = self.spawn(&pod, &container, &[]);
        let mut s = Running {
            pod,
            proc: Some(proc),
        };
        let p = s.proc.as_mut().unwrap();
        p.listening("sidecar-tunnel");
        p.listening("sidecar-facade");
        s
    }

    /// A new gateway pod from the rendered Deployment, started and ready.
    fn start_gateway(&mut self) -> Running {
        let pod = self.next_pod("gw");
        let deployment = chart::find(&self.objects, "Deployment", &format!("{FULLNAME}-gateway"));
        let spec = deployment["spec"]["template"]["spec"].clone();
        let root = self.dir.join(&pod.name);
        let container = chart::container(
            &spec,
            "gateway",
            &self.data,
            &root,
            &[("status.podIP", pod.ip.to_string())],
        );
        // The kube client's credentials, as a service account's would be.
        let kubeconfig = self.api_kubeconfig.display().to_string();
        let mut proc = self.spawn(&pod, &container, &[("KUBECONFIG", &kubeconfig)]);
        proc.listening("gateway");
        let g = Running {
            pod,
            proc: Some(proc),
        };
        wait_for("a new gateway to be ready", || {
            g.pod
                .run(|| try_http(([127, 0, 0, 1], 9090).into(), "GET", "/readyz", &[]))
                .is_some_and(|(status, _)| status == 200)
                .then_some(())
        });
        g
    }

    fn spawn(&self, pod: &Pod, container: &chart::Container, extra_env: &[(&str, &str)]) -> Proc {
        let mut command = pod.command(SPINLINK);
        command.args(&container.args);
        for (k, v) in &container.env {
            command.env(k, v);
        }
        for (k, v) in extra_env {
            command.env(k, v);
        }
        Proc::spawn(&pod.name, &self.dir, command)
    }

    fn start_agent(&mut self) {
        let secret = &self.data[&format!("{FULLNAME}-agent-{AGENT}")];
        let dir = self.dir.join("agent-tls");
        std::fs::create_dir_all(&dir).unwrap();
        for (k, v) in secret {
            std::fs::write(dir.join(k), v).unwrap();
        }
        let yaml = format!(
            "agentId: {AGENT}\ngateway:\n  url: https://{}:443\n  serverName: {GATEWAY_DNS}\n  \
             caFile: {d}/ca.crt\n  certFile: {d}/tls.crt\n  keyFile: {d}/tls.key\n\
             reconnect:\n  initialBackoffMillis: 100\n  maxBackoffMillis: 1000\n\
             kubernetes:\n  accounts:\n  - name: {ACCOUNT}\n    kubeconfigFile: {}\n",
            self.nlb.addr.ip(),
            self.cluster_kubeconfig.display(),
            d = dir.display(),
        );
        self.starts += 1;
        let cfg = support::write_file(&self.dir, "agent.yaml", &yaml);
        let mut command = self.agent.pod.command(SPINLINK);
        command.args(["agent", "--config", &cfg]);
        let name = format!("agent.{}", self.starts);
        self.agent.proc = Some(Proc::spawn(&name, &self.dir, command));
    }

    /// The EndpointSlice controller: every running sidecar pod ready, and
    /// a `terminating` one serving but not ready (as a pod being deleted is).
    fn publish_endpoints(&self, terminating: Option<&Pod>) {
        let endpoint = |pod: &Pod, t: bool| {
            json!({"addresses": [pod.ip.to_string()],
                   "conditions": {"ready": !t, "serving": true, "terminating": t},
                   "targetRef": {"kind": "Pod", "name": pod.name, "namespace": NAMESPACE}})
        };
        let mut endpoints: Vec<Value> = self
            .sidecars
            .iter()
            .filter(|s| s.proc.is_some())
            .map(|s| endpoint(&s.pod, false))
            .chain(terminating.map(|p| endpoint(p, true)))
            .collect();
        endpoints.sort_by_key(|e| e["addresses"][0].as_str().unwrap().to_owned());
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{FULLNAME}-sidecar-x1"), "namespace": NAMESPACE,
                "labels": {"kubernetes.io/service-name": format!("{FULLNAME}-sidecar"),
                           "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "ports": [{"name": "tunnel", "port": TUNNEL_PORT, "protocol": "TCP"}],
            "endpoints": endpoints});
        let admin =
            Kubectl::new(&self.dir, "api-admin", &self.api_kubeconfig).in_pod(&self.api.pod);
        admin.ok_with_input(&["apply", "-f", "-"], Some(&slice.to_string()));
    }

    /// The NLB's targets: port 443 forwarded to each running gateway pod's
    /// tunnel port.
    fn set_nlb_targets(&self) {
        let targets: Vec<SocketAddr> = self
            .gateways
            .iter()
            .filter(|g| g.proc.is_some())
            .map(|g| (g.pod.ip, GATEWAY_PORT).into())
            .collect();
        self.nlb.set_backends(&targets);
    }

    /// Index of the sidecar that owns the account and serves it, once one does.
    fn owner(&self) -> usize {
        wait_for("a sidecar pod to own and serve the account", || {
            self.sidecars
                .iter()
                .position(|s| s.proc.is_some() && s.pod.run(|| ready(ACCOUNT)))
        })
    }

    fn kubectl(&self, s: &Running) -> Kubectl {
        let kubeconfig = self.dir.join(format!("{}.kubeconfig", s.pod.name));
        write_kubeconfig(
            &kubeconfig,
            &format!("http://127.0.0.1:{FACADE_PORT}/accounts/{ACCOUNT}"),
        );
        Kubectl::new(&self.dir, &s.pod.name, &kubeconfig).in_pod(&s.pod)
    }

    fn direct(&self) -> Kubectl {
        Kubectl::new(&self.dir, "direct", &self.cluster_kubeconfig).in_pod(&self.agent.pod)
    }

    /// Waits until every running sidecar pod's facade lists exactly what
    /// the cluster holds (uid and resourceVersion of every object).
    fn converge(&self, within: Duration) {
        let direct = self.direct();
        let deadline = Instant::now() + within;
        let views: Vec<(String, Kubectl)> = self
            .sidecars
            .iter()
            .filter(|s| s.proc.is_some())
            .map(|s| (s.pod.name.clone(), self.kubectl(s)))
            .collect();
        loop {
            let want = workload::objects(&direct).expect("the cluster lists");
            let mut differences = Vec::new();
            for (name, kubectl) in &views {
                match workload::objects(kubectl) {
                    Some(got) if got == want => {}
                    Some(got) => differences.push(format!("{name}: {}", diff(&want, &got))),
                    None => differences.push(format!("{name}: the list failed")),
                }
            }
            if differences.is_empty() {
                eprintln!("every cache equals the cluster ({} objects)", want.len());
                return;
            }
            assert!(
                Instant::now() < deadline,
                "caches differ from the cluster after {within:?}:\n{}",
                differences.join("\n")
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Replaces sidecar pod `i` with a new one (new name, new address):
    /// `crash` kills it first, as a node failure would; otherwise, as a
    /// rolling update does, the new pod is ready before the old one is
    /// marked terminating and gets SIGTERM.
    fn replace_sidecar(&mut self, i: usize, crash: bool) {
        if crash {
            self.sidecars[i].kill();
            self.sidecars[i].proc = None;
            self.publish_endpoints(None);
        }
        let new = self.start_sidecar();
        let mut old = std::mem::replace(&mut self.sidecars[i], new);
        if !crash {
            // Both in the slice, the old one terminating, then SIGTERM.
            self.publish_endpoints(Some(&old.pod));
            old.terminate();
        }
        old.proc = None;
        self.publish_endpoints(None);
        self.network.delete(&old.pod);
    }

    /// Replaces gateway pod `i`: `crash` kills it; otherwise the new one is
    /// an NLB target before the old one is taken out and drained.
    fn replace_gateway(&mut self, i: usize, crash: bool) {
        if crash {
            self.gateways[i].kill();
            self.gateways[i].proc = None;
            self.set_nlb_targets();
        }
        let new = self.start_gateway();
        let mut old = std::mem::replace(&mut self.gateways[i], new);
        if !crash {
            self.set_nlb_targets();
            old.terminate();
        }
        self.set_nlb_targets();
        old.proc = None;
        self.network.delete(&old.pod);
    }
}

/// Whether `account` is online at this pod's facade with its relay and
/// every kind listed (called on a thread inside the pod).
fn ready(account: &str) -> bool {
    support::scale::ready_at(([127, 0, 0, 1], FACADE_PORT).into(), account)
}

fn diff(want: &Objects, got: &Objects) -> String {
    let missing = want.keys().filter(|k| !got.contains_key(*k)).count();
    let phantom = got.keys().filter(|k| !want.contains_key(*k)).count();
    let stale = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
        .count();
    format!("{missing} missing, {phantom} phantom, {stale} stale")
}

/// A kubectl loop in one Clouddriver pod (`workload::run`, writing a
/// ConfigMap of the pod's own).
struct Loop {
    pod: String,
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicUsize>,
    thread: JoinHandle<Workload>,
}

impl Loop {
    fn start(d: &Deployment, s: &Running) -> Loop {
        let kubectl = d.kubectl(s);
        // Warms kubectl's discovery cache; creates what the loop changes.
        kubectl.ok_with_input(&["apply", "-f", "-"], Some(&workload::configmap(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, rounds) = (stop.clone(), rounds.clone());
            std::thread::spawn(move || workload::run(&kubectl, &stop, &rounds))
        };
        Loop {
            pod: s.pod.name.clone(),
            stop,
            rounds,
            thread,
        }
    }

    /// Stops the loop after its current round (the pod is going away).
    fn finish(self) -> (String, Workload) {
        self.stop.store(true, Ordering::Relaxed);
        (self.pod, self.thread.join().expect("a kubectl loop"))
    }
}

fn no_failures(results: &[(String, Workload)]) {
    failures_but(results, 0);
}

/// As [`no_failures`], but each loop may have up to `unanswered` writes that
/// were in flight when the agent's connection went away: their relay
/// stream closed before the agent answered, so they may or may not have
/// been applied, and the sidecar does not send them twice (503 by design,
/// docs/architecture.md). Any other failure, and any failed read, fails.
fn failures_but(results: &[(String, Workload)], unanswered: usize) {
    let mut failures = Vec::new();
    for (pod, w) in results {
        eprintln!(
            "in {pod}: {} rounds, {} kubectl commands, {} failed ({} writes unanswered)",
            w.rounds,
            w.commands,
            w.failures.len(),
            w.unanswered_writes.len()
        );
        let allowed = if w.unanswered_writes.len() <= unanswered {
            &w.unanswered_writes[..]
        } else {
            &[]
        };
        failures.extend(
            w.failures
                .iter()
                .filter(|f| !allowed.contains(f))
                .map(|f| format!("in {pod}: {f}")),
        );
        assert!(w.rounds >= 2, "the loop in {pod} ran ({} rounds)", w.rounds);
    }
    assert!(
        failures.is_empty(),
        "kubectl commands failed:\n{}",
        failures.join("\n")
    );
}

/// Waits until every running loop has done `n` more rounds.
fn progress(loops: &[Option<Loop>], what: &str, n: usize) {
    let live: Vec<&Loop> = loops.iter().flatten().collect();
    let from: Vec<usize> = live
        .iter()
        .map(|l| l.rounds.load(Ordering::Relaxed))
        .collect();
    wait_for(
        &format!("{n} kubectl rounds in every pod after {what}"),
        || {
            live.iter()
                .zip(&from)
                .all(|(l, f)| l.rounds.load(Ordering::Relaxed) >= f + n || l.thread.is_finished())
                .then_some(())
        },
    );
}

fn start_loops(d: &Deployment) -> Vec<Option<Loop>> {
    d.sidecars.iter().map(|s| Some(Loop::start(d, s))).collect()
}

/// The pod that owns the account dies (SIGKILL, with its Clouddriver: its
/// lease is not released, its cache not handed over) and is replaced by a
/// new pod at a new address; then the gateway the agent is connected to
/// dies. kubectl in every other pod keeps working throughout, but for a
/// write that was in flight when the agent's gateway died: its outcome is
/// unknown, and the sidecar answers it 503 rather than send it twice (at
/// most one per pod).
#[test]
fn failover_in_pods_fails_no_kubectl_command() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Deployment::new(tmp.path(), "slf", false);
    let owner = d.owner();
    eprintln!("{ACCOUNT} is owned by {}", d.sidecars[owner].pod.name);
    let mut loops = start_loops(&d);
    progress(&loops, "the start", 2);

    // The owner's pod dies with its Clouddriver: its loop ends with it.
    let mut results = vec![loops[owner].take().unwrap().finish()];
    let killed = Instant::now();
    d.replace_sidecar(owner, true);
    let new_owner = d.owner();
    eprintln!(
        "{} owns {ACCOUNT} {:?} after the owner's pod died",
        d.sidecars[new_owner].pod.name,
        killed.elapsed()
    );
    progress(&loops, "the owner's pod died", 3);
    loops[owner] = Some(Loop::start(&d, &d.sidecars[owner]));

    // The gateway the agent is on dies; the agent comes back through the
    // NLB to the other one.
    let on = wait_for("the agent's connection through the NLB", || {
        d.gateways.iter().position(|g| {
            d.nlb
                .open_to(SocketAddr::new(g.pod.ip.into(), GATEWAY_PORT))
                > 0
        })
    });
    eprintln!("the agent is on {}", d.gateways[on].pod.name);
    d.replace_gateway(on, true);
    d.owner();
    progress(&loops, "the agent's gateway died", 3);

    results.extend(loops.into_iter().flatten().map(Loop::finish));
    // A write in flight when the agent's gateway died may have been
    // applied: one per loop may fail with the sidecar's 503 for that.
    failures_but(&results, 1);
    d.converge(Duration::from_secs(60));
}

/// A Deployment's rolling update of every Clouddriver pod, then of every
/// gateway pod: each new pod (a new address) is ready before the old one
/// is marked terminating and gets SIGTERM; the old sidecar hands its
/// account over as it drains, the old gateway sends the agent away.
#[test]
fn rolling_restarts_in_pods_fail_no_kubectl_command() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Deployment::new(tmp.path(), "slr", false);
    let mut loops = start_loops(&d);
    let mut results = Vec::new();
    progress(&loops, "the start", 2);
    for i in 0..d.sidecars.len() {
        let old = d.sidecars[i].pod.name.clone();
        // The old pod's Clouddriver stops with it.
        results.push(loops[i].take().unwrap().finish());
        d.replace_sidecar(i, false);
        let owner = d.owner();
        eprintln!(
            "{old} replaced by {}; {ACCOUNT} is owned by {}",
            d.sidecars[i].pod.name, d.sidecars[owner].pod.name
        );
        loops[i] = Some(Loop::start(&d, &d.sidecars[i]));
        progress(&loops, &format!("replacing {old}"), 2);
    }
    for i in 0..d.gateways.len() {
        let old = d.gateways[i].pod.name.clone();
        d.replace_gateway(i, false);
        d.owner();
        progress(&loops, &format!("replacing {old}"), 2);
    }
    results.extend(loops.into_iter().flatten().map(Loop::finish));
    no_failures(&results);
    d.converge(Duration::from_secs(60));
}

/// Seeded faults while the cluster churns: pods crash and are replaced,
/// the agent restarts, the NLB drops its connections, and pods are cut off
/// the network (their link down: packets dropped, nothing reset) for a few
/// seconds — a sidecar, a gateway, the agent's pod, the database. Then the
/// churn stops and every pod's cache must equal the cluster.
/// `SPINLINK_NETNS_CHAOS_SEED=<n>` replays a run's choices,
/// `SPINLINK_NETNS_CHAOS_FAULTS=<n>` runs more.
#[test]
fn seeded_chaos_in_pods_converges_to_the_cluster() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = env("SPINLINK_NETNS_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    let faults = env("SPINLINK_NETNS_CHAOS_FAULTS").unwrap_or(6);
    eprintln!("chaos in pods: seed {seed} (SPINLINK_NETNS_CHAOS_SEED={seed}), {faults} faults");
    let mut rng = Rng(seed);
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Deployment::new(tmp.path(), "slc", true);
    let postgres = matches!(d.store, Store::Postgres { .. });
    for n in 1..=faults {
        let what = match rng.below(if postgres { 8 } else { 7 }) {
            0 => {
                let i = rng.below(d.sidecars.len());
                let name = d.sidecars[i].pod.name.clone();
                d.replace_sidecar(i, true);
                format!("crashed sidecar pod {name}")
            }
            1 => {
                let i = rng.below(d.gateways.len());
                let name = d.gateways[i].pod.name.clone();
                d.replace_gateway(i, true);
                format!("crashed gateway pod {name}")
            }
            2 => {
                d.agent.kill();
                d.start_agent();
                "restarted the agent".to_owned()
            }
            3 => format!("the NLB dropped {} connections", d.nlb.cut(None)),
            k => {
                let pod = match k {
                    4 => d.sidecars[rng.below(d.sidecars.len())].pod.clone(),
                    5 => d.gateways[rng.below(d.gateways.len())].pod.clone(),
                    6 => d.agent.pod.clone(),
                    _ => d.db.as_ref().unwrap().1.clone(),
                };
                let t = rng.millis(1000, 5000);
                pod.set_link(false);
                std::thread::sleep(t);
                pod.set_link(true);
                format!("cut {} off the network for {t:?}", pod.name)
            }
        };
        eprintln!("fault {n}/{faults}: {what}");
        std::thread::sleep(rng.millis(200, 2000));
    }
    d.stop_churn();
    d.owner();
    d.converge(Duration::from_secs(120));
}
