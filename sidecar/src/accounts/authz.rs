//! Who an account's cached reads are authorized as, and the decisions the
//! API server gave, kept briefly.
//!
//! The agent fills the cache with its own credentials. When an account's
//! writes impersonate a narrower identity (`impersonate:` in the agent's
//! configuration), its reads must not show more than that identity may
//! see: the facade asks the API server — a `SelfSubjectAccessReview`
//! relayed through the agent, which adds the impersonation — before it
//! answers a read from the cache, and relays the read live when the answer
//! is no, so the client gets the API server's own 403.
//!
//! Decisions are kept like the API server's webhook authorizer keeps them:
//! an allowance for [`ALLOWED_TTL`], a refusal for [`DENIED_TTL`] (a role
//! granted a moment ago is seen soon), at most [`MAX_DECISIONS`] per account.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// How long an allowance is kept. A revoked role stops cached reads after
/// at most this long; reads relayed live stop at once.
pub const ALLOWED_TTL: Duration = Duration::from_secs(30);

/// How long a refusal is kept.
pub const DENIED_TTL: Duration = Duration::from_secs(10);

/// Decisions kept per account; past it, expired ones go, then all.
pub const MAX_DECISIONS: usize = 4096;

/// Whom an account's relayed requests act as (its agent's impersonation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadIdentity {
    /// The user name (`system:serviceaccount:<ns>:<name>` for a service
    /// account).
    pub user: String,
    /// Groups impersonated with it.
    pub groups: Vec<String>,
}

/// One read, in the terms of a `SelfSubjectAccessReview`'s
/// `resourceAttributes`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReadAttributes {
    /// `get`, `list` or `watch`.
    pub verb: &'static str,
    /// API group, empty for the core group.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
    /// Empty for cluster-scoped and all-namespace reads.
    pub namespace: String,
    /// The object's name for a `get`, else empty.
    pub name: String,
}

impl ReadAttributes {
    /// The review the API server is asked to decide.
    pub fn review(&self) -> serde_json::Value {
        let mut attrs = serde_json::json!({
            "verb": self.verb,
            "group": self.group,
            "resource": self.resource,
        });
        if !self.namespace.is_empty() {
            attrs["namespace"] = self.namespace.clone().into();
        }
        if !self.name.is_empty() {
            attrs["name"] = self.name.clone().into();
        }
        serde_json::json!({
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {},
            "spec": {"resourceAttributes": attrs},
        })
    }
}

/// The decisions kept for one account.
#[derive(Debug, Default)]
pub struct Decisions {
    kept: HashMap<ReadAttributes, (bool, Instant)>,
}

impl Decisions {
    /// The decision kept for `read`, if it has not expired.
    pub fn get(&self, read: &ReadAttributes, now: Instant) -> Option<bool> {
        self.kept
            .get(read)
            .filter(|(_, until)| *until > now)
            .map(|(allowed, _)| *allowed)
    }

    /// Keeps a decision for its time to live.
    pub fn keep(&mut self, read: ReadAttributes, allowed: bool, now: Instant) {
        if self.kept.len() >= MAX_DECISIONS {
            self.kept.retain(|_, (_, until)| *until > now);
            if self.kept.len() >= MAX_DECISIONS {
                self.kept.clear();
            }
        }
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        self.kept.insert(read, (allowed, now + ttl));
    }

    /// Forgets every decision (the identity changed).
    pub fn clear(&mut self) {
        self.kept.clear();
    }

    /// Decisions kept, expired ones included.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(ns: &str) -> ReadAttributes {
        ReadAttributes {
            verb: "list",
            group: String::new(),
            resource: "configmaps".into(),
            namespace: ns.into(),
            name: String::new(),
        }
    }

    #[test]
    fn decisions_expire_refusals_first() {
        let now = Instant::now();
        let mut d = Decisions::default();
        d.keep(read("a"), true, now);
        d.keep(read("b"), false, now);
        assert_eq!(d.get(&read("a"), now), Some(true));
        assert_eq!(d.get(&read("b"), now), Some(false));
        assert_eq!(d.get(&read("c"), now), None);
        let later = now + DENIED_TTL;
        assert_eq!(d.get(&read("b"), later), None, "a refusal is asked again");
        assert_eq!(d.get(&read("a"), later), Some(true));
        assert_eq!(d.get(&read("a"), now + ALLOWED_TTL), None);
    }

    #[test]
    fn decisions_are_bounded() {
        let now = Instant::now();
        let mut d = Decisions::default();
        for i in 0..MAX_DECISIONS + 10 {
            d.keep(read(&i.to_string()), true, now);
            assert!(d.len() <= MAX_DECISIONS);
        }
    }

    #[test]
    fn the_review_names_only_what_the_read_names() {
        let mut r = read("");
        assert_eq!(
            r.review()["spec"],
            serde_json::json!({"resourceAttributes": {"verb": "list", "group": "", "resource": "configmaps"}})
        );
        r.verb = "get";
        r.namespace = "fx-a".into();
        r.name = "settings".into();
        let attrs = &r.review()["spec"]["resourceAttributes"];
        assert_eq!(
            (attrs["namespace"].as_str(), attrs["name"].as_str()),
            (Some("fx-a"), Some("settings"))
        );
    }
}
