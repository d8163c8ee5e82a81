//! Deleting a pod as an API server with a kubelet behind it does. A pod deleted
//! with a grace period is not removed: it is marked — `deletionTimestamp` (now plus
//! the grace period) and `deletionGracePeriodSeconds`, one MODIFIED event — and runs
//! on while its kubelet stops its containers; then the kubelet deletes it for good
//! (DELETED). Here the kubelet is [`Sim::run_kubelet`], which takes
//! [`SimConfig::pod_termination`](crate::SimConfig::pod_termination), at most the
//! grace period. A grace period of 0 (`--grace-period=0 --force`), a pod that was
//! never scheduled (no `spec.nodeName`) and one that already finished are removed at
//! once, as the real server's pod strategy decides.

use std::sync::MutexGuard;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::meta::{meta_mut, meta_str};
use super::{DeleteOptions, EventType, Key, Sim, State};
use crate::error::Status;

/// A pod waiting for its kubelet.
#[derive(Debug, Clone)]
pub(crate) struct Terminating {
    /// The pod's uid: a pod recreated under the same name is another pod.
    uid: String,
    /// When the kubelet removes it.
    at: Instant,
}

/// The grace period the server gives a pod: the one asked for, else the pod's
/// `terminationGracePeriodSeconds` (30 by default); 0 for a pod never scheduled or
/// already finished; a negative one counts as 1 s.
fn grace_period(pod: &Value, asked: Option<i64>) -> i64 {
    let spec = &pod["spec"];
    let unscheduled = spec["nodeName"].as_str().is_none_or(str::is_empty);
    let finished = matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    if unscheduled || finished {
        return 0;
    }
    let grace = asked
        .or_else(|| spec["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30);
    if grace < 0 { 1 } else { grace }
}

impl Sim {
    /// DELETE of a pod, preconditions already checked: marks it terminating, or
    /// removes it at once (see the module docs). Answers with the pod, as the real
    /// server does.
    pub(super) fn delete_pod(
        &self,
        mut st: MutexGuard<'_, State>,
        key: Key,
        old: &Value,
        opts: &DeleteOptions,
    ) -> Result<Value, Status> {
        let grace = grace_period(old, opts.grace_period);
        if grace > 0 && old["metadata"]["deletionTimestamp"].is_string() {
            // Already terminating: the kubelet is on it.
            return Ok(old.clone());
        }
        let mut marked = old.clone();
        let deleted_at = chrono::Utc::now() + chrono::TimeDelta::seconds(grace);
        let m = meta_mut(&mut marked);
        m.insert(
            "deletionTimestamp".into(),
            json!(deleted_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        );
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
        if opts.dry_run {
            return Ok(marked);
        }
        let answer = if grace == 0 {
            st.terminating.remove(&key);
            self.commit(&mut st, key, EventType::Deleted, marked)
        } else {
            let uid = meta_str(old, "uid").unwrap_or_default().to_owned();
            let stop = self
                .inner
                .config
                .pod_termination
                .min(Duration::from_secs(grace.unsigned_abs()));
            let at = Instant::now() + stop;
            st.terminating.insert(key.clone(), Terminating { uid, at });
            self.commit(&mut st, key, EventType::Modified, marked)
        };
        let rv = st.rv;
        drop(st);
        self.notify(rv);
        Ok((*answer).clone())
    }

    /// Removes the terminating pods whose time has come; returns when the next
    /// one's comes.
    fn remove_terminated_pods(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut st = self.lock();
        let due: Vec<(Key, Terminating)> = st
            .terminating
            .iter()
            .filter(|(_, t)| t.at <= now)
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        let mut removed = false;
        for (key, t) in due {
            st.terminating.remove(&key);
            let Some(pod) = st.objects.get(&key).cloned() else {
                continue;
            };
            if meta_str(&pod, "uid") == Some(t.uid.as_str()) {
                self.commit(&mut st, key, EventType::Deleted, (*pod).clone());
                removed = true;
            }
        }
        let next = st.terminating.values().map(|t| t.at).min();
        let rv = st.rv;
        drop(st);
        if removed {
            self.notify(rv);
        }
        next
    }

    /// The simulated kubelet: removes each pod deleted with a grace period when
    /// its containers would have stopped, until `shutdown`. [`Server::run`]
    /// (crate::Server::run) runs one; without it, such pods stay terminating, as
    /// on a cluster whose node is gone.
    pub async fn run_kubelet(self, shutdown: CancellationToken) {
        let mut changes = self.subscribe();
        loop {
            let next = self.remove_terminated_pods();
            let wait = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = wait => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimConfig;

    fn pod(name: &str, node: Option<&str>, grace: Option<i64>) -> Value {
        let mut spec = json!({"containers": [{"name": "c", "image": "nginx"}]});
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        if let Some(grace) = grace {
            spec["terminationGracePeriodSeconds"] = json!(grace);
        }
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn the_grace_period_is_the_servers() {
        let scheduled = pod("a", Some("n"), Some(5));
        assert_eq!(grace_period(&scheduled, None), 5);
        assert_eq!(grace_period(&scheduled, Some(2)), 2);
        assert_eq!(grace_period(&scheduled, Some(-3)), 1);
        assert_eq!(grace_period(&pod("a", Some("n"), None), None), 30);
        assert_eq!(grace_period(&pod("a", None, Some(5)), Some(9)), 0);
        let mut done = scheduled.clone();
        done["status"] = json!({"phase": "Succeeded"});
        assert_eq!(grace_period(&done, None), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_scheduled_pod_terminates_then_the_kubelet_removes_it() {
        let sim = Sim::with_config(SimConfig::default().pod_termination(Duration::from_secs(3)));
        let shutdown = CancellationToken::new();
        tokio::spawn(sim.clone().run_kubelet(shutdown.clone()));
        let created = sim.create(pod("web", Some("node-1"), Some(10))).unwrap();
        let rv = created["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned();

        let answer = sim.delete("pods", Some("default"), "web").unwrap();
        assert_eq!(answer["kind"], "Pod");
        assert_eq!(answer["metadata"]["deletionGracePeriodSeconds"], 10);
        let at = answer["metadata"]["deletionTimestamp"].as_str().unwrap();
        let at = chrono::DateTime::parse_from_rfc3339(at).unwrap();
        let ahead = at.signed_duration_since(chrono::Utc::now()).num_seconds();
        assert!(
            (8..=10).contains(&ahead),
            "now plus the grace period: {ahead}"
        );
        assert_ne!(answer["metadata"]["resourceVersion"], json!(rv));
        // Still there, terminating; deleting again changes nothing.
        let got = sim.get("pods", Some("default"), "web").unwrap();
        assert_eq!(got, answer);
        assert_eq!(sim.delete("pods", Some("default"), "web").unwrap(), answer);

        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(sim.get("pods", Some("default"), "web").is_some());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(sim.get("pods", Some("default"), "web").is_none());
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn force_and_unscheduled_pods_go_at_once() {
        let sim = Sim::new();
        sim.create(pod("forced", Some("node-1"), None)).unwrap();
        sim.create(pod("pending", None, None)).unwrap();
        let forced = sim
            .delete_in(
                sim.resource_by_name("pods").unwrap(),
                Some("default"),
                "forced",
                &DeleteOptions {
                    grace_period: Some(0),
                    ..DeleteOptions::default()
                },
            )
            .unwrap();
        assert_eq!(forced["metadata"]["deletionGracePeriodSeconds"], 0);
        assert!(forced["metadata"]["deletionTimestamp"].is_string());
        let pending = sim.delete("pods", Some("default"), "pending").unwrap();
        assert_eq!(pending["metadata"]["deletionGracePeriodSeconds"], 0);
        for name in ["forced", "pending"] {
            assert!(sim.get("pods", Some("default"), name).is_none());
        }
    }
}
