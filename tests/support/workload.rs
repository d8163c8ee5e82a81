//! A steady, bounded kubectl loop of reads and writes, run on a thread of
//! its own while a test restarts or kills components: by default
//! ([`demo_round`]) `get pods -o json`, `get deploy`, `apply` of a ConfigMap
//! with a changing value, `scale` of the demo workload's `web`; a test may
//! give its own rounds ([`run_rounds`]). Every failed command is recorded
//! with its stderr.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use super::Kubectl;

/// The loop's bound: it stops when told, or after this many rounds.
pub const MAX_ROUNDS: usize = 1000;

/// What the loop did.
pub struct Workload {
    /// Rounds completed.
    pub rounds: usize,
    /// kubectl commands run.
    pub commands: usize,
    /// Every failed command: round, arguments, time taken, stderr.
    pub failures: Vec<String>,
    /// Those of them that were writes whose relay stream closed before
    /// the agent answered: the agent may have applied them, so the sidecar
    /// does not send them again and answers 503 (docs/architecture.md,
    /// "a write is not").
    pub unanswered_writes: Vec<String>,
    /// The last round whose writes all succeeded: what the cluster holds.
    pub last: Option<usize>,
}

/// One kubectl command of a round.
pub struct Step {
    /// Its arguments.
    pub args: Vec<String>,
    /// Its standard input, if any.
    pub input: Option<String>,
    /// Whether it writes (a failed write leaves the round out of
    /// [`Workload::last`]).
    pub writes: bool,
}

impl Step {
    /// A read: `kubectl args`.
    pub fn read(args: &[&str]) -> Step {
        Step {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            input: None,
            writes: false,
        }
    }

    /// A write: `kubectl args`, `input` on its standard input.
    pub fn write(args: &[&str], input: Option<String>) -> Step {
        Step {
            input,
            writes: true,
            ..Step::read(args)
        }
    }
}

/// The ConfigMap `rolling` in namespace `demo` the loop writes.
pub fn configmap(round: usize) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rolling\n  namespace: demo\n\
         data:\n  round: \"{round}\"\n"
    )
}

/// The replicas round `round` of [`demo_round`] scales `web` to.
pub fn replicas(round: usize) -> usize {
    round % 3 + 1
}

/// A round against kube-sim's demo workload: two reads, `apply` of
/// [`configmap`], `scale` to [`replicas`].
pub fn demo_round(round: usize) -> Vec<Step> {
    let replicas = format!("--replicas={}", replicas(round));
    vec![
        Step::read(&["get", "pods", "-n", "demo", "-o", "json"]),
        Step::read(&["get", "deploy", "-n", "demo"]),
        Step::write(&["apply", "-f", "-"], Some(configmap(round))),
        Step::write(&["scale", "deployment/web", "-n", "demo", &replicas], None),
    ]
}

/// [`demo_round`]s through `kubectl` until `stop` (or [`MAX_ROUNDS`]),
/// publishing the rounds completed in `rounds`.
pub fn run(kubectl: &Kubectl, stop: &AtomicBool, rounds: &AtomicUsize) -> Workload {
    run_rounds(kubectl, stop, rounds, demo_round)
}

/// Runs round after round of `round(n)`'s commands through `kubectl` until
/// `stop` (or [`MAX_ROUNDS`]), publishing the rounds completed in `rounds`.
pub fn run_rounds(
    kubectl: &Kubectl,
    stop: &AtomicBool,
    rounds: &AtomicUsize,
    round: impl Fn(usize) -> Vec<Step>,
) -> Workload {
    let mut w = Workload {
        rounds: 0,
        commands: 0,
        failures: Vec::new(),
        unanswered_writes: Vec::new(),
        last: None,
    };
    for n in 1..=MAX_ROUNDS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let mut wrote = true;
        for step in round(n) {
            let args: Vec<&str> = step.args.iter().map(String::as_str).collect();
            let started = Instant::now();
            let out = kubectl.run_with_input(&args, step.input.as_deref());
            w.commands += 1;
            if !out.status.success() {
                wrote &= !step.writes;
                let stderr = String::from_utf8_lossy(&out.stderr);
                let failure = format!(
                    "round {n}, kubectl {args:?} after {:?}: {}",
                    started.elapsed(),
                    stderr.trim()
                );
                if step.writes
                    && stderr.contains(spinlink_sidecar::facade::relay::CLOSED_BEFORE_ANSWER)
                {
                    w.unanswered_writes.push(failure.clone());
                }
                w.failures.push(failure);
            }
        }
        if wrote {
            w.last = Some(n);
        }
        w.rounds = n;
        rounds.store(n, Ordering::Relaxed);
    }
    w
}

/// The kinds the chaos tests compare between a cluster and a cache
/// (everything the demo workload and the churn touch, namespaced and
/// cluster-scoped).
pub const KINDS: &str =
    "pods,configmaps,secrets,services,deployments.apps,replicasets.apps,namespaces";

/// (kind, namespace, name) → (uid, resourceVersion).
pub type Objects = std::collections::BTreeMap<(String, String, String), (String, String)>;

/// Every object of [`KINDS`] `kubectl` lists, in one unpaginated list;
/// `None` when the list fails.
pub fn objects(kubectl: &Kubectl) -> Option<Objects> {
    let out = kubectl.run_with_input(&["get", KINDS, "-A", "-o", "json", "--chunk-size=0"], None);
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    Some(
        v["items"]
            .as_array()?
            .iter()
            .map(|o| {
                let m = &o["metadata"];
                (
                    (s(&o["kind"]), s(&m["namespace"]), s(&m["name"])),
                    (s(&m["uid"]), s(&m["resourceVersion"])),
                )
            })
            .collect(),
    )
}
