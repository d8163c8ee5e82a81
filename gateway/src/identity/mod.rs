//! Who an agent is and what it may serve: the [`Policy`] that maps identities
//! to accounts (glob rules, nothing granted by default), and the [`AgentPeer`]
//! the listener attaches to every request of an authenticated connection;
//! [`owners`] keeps one identity per account, [`jwt`] checks bootstrap JWTs
//! for agents without certificates.

pub mod jwt;
pub mod owners;

use std::net::SocketAddr;
use std::sync::Arc;

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use spinlink_tls::binding::ConnectionBinding;

use crate::config::PolicyRule;

/// A policy rule that could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A glob pattern is not valid.
    #[error("invalid glob {pattern:?}: {source}")]
    InvalidGlob {
        /// Index of the rule in `policy`.
        rule: usize,
        /// `identities` or `accounts`.
        field: &'static str,
        /// Index of the pattern in that list.
        index: usize,
        /// The pattern.
        pattern: String,
        /// The glob error.
        #[source]
        source: globset::Error,
    },
    /// A rule with an empty list would never match anything.
    #[error("must list at least one pattern (a rule without one grants nothing)")]
    EmptyList {
        /// Index of the rule in `policy`.
        rule: usize,
        /// `identities` or `accounts`.
        field: &'static str,
    },
}

impl Error {
    /// The configuration key the error is about, e.g. `policy[0].accounts[1]`.
    pub fn key(&self) -> String {
        match self {
            Self::InvalidGlob {
                rule, field, index, ..
            } => format!("policy[{rule}].{field}[{index}]"),
            Self::EmptyList { rule, field } => format!("policy[{rule}].{field}"),
        }
    }
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// On an insecure (development) listener, the header a request names its
/// agent identity in. Never trusted on a TLS listener, never forwarded.
pub const DEV_IDENTITY_HEADER: &str = "spinlink-dev-identity";

/// The proven identity of an agent and the connection it spoke on, put into
/// request extensions by the listener.
#[derive(Debug, Clone)]
pub struct AgentPeer {
    /// The identity from the agent's certificate (or its bootstrap JWT's
    /// `sub`, or, insecure, its header).
    pub identity: Arc<str>,
    /// The binding of the connection the request arrived on.
    pub binding: ConnectionBinding,
    /// The agent's address.
    pub remote: SocketAddr,
    /// The accounts this connection was granted; released when it ends.
    pub grants: Arc<owners::ConnGrants>,
    /// On a connection without a certificate: the verified bootstrap JWT of
    /// this `Hello`, whose accounts claim grants instead of the policy.
    pub bootstrap: Option<Arc<jwt::Bootstrap>>,
    /// The channel tokens already verified on the connection.
    pub tokens: Arc<crate::token::VerifiedTokens>,
}

#[derive(Debug, Clone)]
struct Rule {
    identities: GlobSet,
    accounts: GlobSet,
    /// `accounts` as configured, for [`Policy::account_patterns`].
    account_patterns: Vec<String>,
}

/// Which identities may serve which accounts. An empty policy grants nothing.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    rules: Vec<Rule>,
}

impl Policy {
    /// Compiles the configured rules. In patterns `*` does not cross `/`
    /// (so `spiffe://d/agent/*` does not match `spiffe://d/agent/x/y`); `**` does.
    pub fn compile(rules: &[PolicyRule]) -> Result<Self> {
        let mut compiled = Vec::with_capacity(rules.len());
        for (rule, r) in rules.iter().enumerate() {
            compiled.push(Rule {
                identities: glob_set(rule, "identities", &r.identities)?,
                accounts: glob_set(rule, "accounts", &r.accounts)?,
                account_patterns: r.accounts.clone(),
            });
        }
        Ok(Self { rules: compiled })
    }

    /// The account patterns of every rule that matches `identity` (globs in
    /// which `*` does not cross `/`): the accounts it may serve. Sent to the
    /// sidecar with an `Assignments` stream, which assigns no other
    /// account's kubeconfig to it.
    pub fn account_patterns(&self, identity: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for rule in self
            .rules
            .iter()
            .filter(|r| r.identities.is_match(identity))
        {
            for pattern in &rule.account_patterns {
                if !out.contains(pattern) {
                    out.push(pattern.clone());
                }
            }
        }
        out
    }

    /// Whether `identity` may serve `account`: some rule matches both.
    pub fn allows(&self, identity: &str, account: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.identities.is_match(identity) && r.accounts.is_match(account))
    }
}

fn glob_set(rule: usize, field: &'static str, patterns: &[String]) -> Result<GlobSet> {
    if patterns.is_empty() {
        return Err(Error::EmptyList { rule, field });
    }
    let mut set = GlobSetBuilder::new();
    for (index, pattern) in patterns.iter().enumerate() {
        let glob: Glob = GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|source| Error::InvalidGlob {
                rule,
                field,
                index,
                pattern: pattern.clone(),
                source,
            })?;
        set.add(glob);
    }
    set.build().map_err(|source| Error::InvalidGlob {
        rule,
        field,
        index: 0,
        pattern: patterns.join(","),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(identities: &[&str], accounts: &[&str]) -> PolicyRule {
        PolicyRule {
            identities: identities.iter().map(|s| s.to_string()).collect(),
            accounts: accounts.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn empty_policy_grants_nothing() {
        let policy = Policy::compile(&[]).unwrap();
        assert!(!policy.allows("spiffe://spinlink.dev/agent/a1", "dev-1"));
        assert!(!policy.allows("", ""));
    }

    #[test]
    fn both_identity_and_account_must_match_one_rule() {
        let policy = Policy::compile(&[
            rule(&["spiffe://spinlink.dev/agent/*"], &["dev-*", "staging"]),
            rule(&["spiffe://spinlink.dev/agent/prod"], &["prod"]),
        ])
        .unwrap();
        let a1 = "spiffe://spinlink.dev/agent/a1";
        assert!(policy.allows(a1, "dev-1"));
        assert!(policy.allows(a1, "staging"));
        assert!(!policy.allows(a1, "staging-2"));
        assert!(!policy.allows(a1, "prod"));
        assert!(policy.allows("spiffe://spinlink.dev/agent/prod", "prod"));
        // Rules do not mix: prod's identity matches rule 0 for dev accounts
        // only, and rule 1 for prod only.
        assert!(policy.allows("spiffe://spinlink.dev/agent/prod", "dev-x"));
        assert!(!policy.allows("spiffe://other.dev/agent/a1", "dev-1"));
        // `*` stays within one path segment.
        assert!(!policy.allows("spiffe://spinlink.dev/agent/a1/extra", "dev-1"));
    }

    #[test]
    fn bad_and_empty_patterns_name_their_key() {
        let err = Policy::compile(&[rule(&["ok"], &["fine", "[unclosed"])]).unwrap_err();
        assert_eq!(err.key(), "policy[0].accounts[1]");
        let err = Policy::compile(&[rule(&["a"], &["b"]), rule(&[], &["b"])]).unwrap_err();
        assert_eq!(err.key(), "policy[1].identities");
    }
}
