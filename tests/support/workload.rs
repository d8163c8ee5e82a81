//! A steady, bounded kubectl loop of reads and writes, run on a thread of
//! its own while a test restarts or kills components: `get pods -o json`,
//! `get deploy`, `apply` of a ConfigMap with a changing value, `scale` of
//! the demo workload's `web`. Every failed command is recorded with its
//! stderr.

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
    /// The ConfigMap value and the replica count the last writes set.
    pub last: Option<(usize, usize)>,
}

/// The ConfigMap `rolling` in namespace `demo` the loop writes.
pub fn configmap(round: usize) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rolling\n  namespace: demo\n\
         data:\n  round: \"{round}\"\n"
    )
}

/// Reads and writes through `kubectl` until `stop` (or [`MAX_ROUNDS`]),
/// publishing the rounds completed in `rounds`.
pub fn run(kubectl: &Kubectl, stop: &AtomicBool, rounds: &AtomicUsize) -> Workload {
    let mut w = Workload {
        rounds: 0,
        commands: 0,
        failures: Vec::new(),
        last: None,
    };
    for round in 1..=MAX_ROUNDS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let replicas = round % 3 + 1;
        let replicas_arg = format!("--replicas={replicas}");
        let manifest = configmap(round);
        let steps: [(&[&str], Option<&str>); 4] = [
            (&["get", "pods", "-n", "demo", "-o", "json"], None),
            (&["get", "deploy", "-n", "demo"], None),
            (&["apply", "-f", "-"], Some(&manifest)),
            (
                &["scale", "deployment/web", "-n", "demo", &replicas_arg],
                None,
            ),
        ];
        let mut wrote = true;
        for (args, input) in steps {
            let started = Instant::now();
            let out = kubectl.run_with_input(args, input);
            w.commands += 1;
            if !out.status.success() {
                wrote &= args[0] != "apply" && args[0] != "scale";
                w.failures.push(format!(
                    "round {round}, kubectl {args:?} after {:?}: {}",
                    started.elapsed(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        if wrote {
            w.last = Some((round, replicas));
        }
        w.rounds = round;
        rounds.store(round, Ordering::Relaxed);
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
