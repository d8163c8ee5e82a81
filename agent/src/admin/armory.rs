//! The Armory Scale Agent's admin endpoints on the admin port, so probes
//! and dashboards written for it keep working: `GET /accounts` with
//! Armory's filters (`Config.Name`, `Config.Dynamic`, `State.Name`) and
//! paging (`limit`, `offset`), and `GET /accounts/{name}/version`. `/health`,
//! `/operations` and `/version` are answered in [`super::answer`]. Start
//! with [`AccountQuery::parse`]; [`state_name`] maps spinlink's account
//! states onto Armory's three names.

use serde::Serialize;

use crate::state::{AccountState, AgentState};

/// The query parameters that ask `/accounts` for Armory's shape.
pub const QUERY_KEYS: [&str; 5] = [
    "Config.Name",
    "Config.Dynamic",
    "State.Name",
    "limit",
    "offset",
];

/// Armory's account state names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum StateName {
    /// Loaded from the configuration; not (yet) serving.
    ConfigLoaded,
    /// Serving: its streams are up and its kinds listed, or (leader
    /// election) it relays while another replica caches.
    Healthy,
    /// It cannot be served: the gateway refused it.
    DiscoveryError,
}

impl StateName {
    fn parse(s: &str) -> Option<Self> {
        [Self::ConfigLoaded, Self::Healthy, Self::DiscoveryError]
            .into_iter()
            .find(|n| n.as_str().eq_ignore_ascii_case(s))
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::ConfigLoaded => "ConfigLoaded",
            Self::Healthy => "Healthy",
            Self::DiscoveryError => "DiscoveryError",
        }
    }
}

/// spinlink's state of an account in Armory's names, with a message and
/// spinlink's own name of it. `None`: no stream state on this connection
/// (disconnected, or not answered yet).
pub fn state_name(state: Option<&AccountState>) -> (StateName, String, &'static str) {
    match state {
        None => (StateName::ConfigLoaded, String::new(), "configured"),
        Some(AccountState::Streaming) => (StateName::ConfigLoaded, String::new(), "streaming"),
        Some(AccountState::Synced) => (StateName::Healthy, String::new(), "synced"),
        Some(AccountState::Standby) => (StateName::Healthy, String::new(), "standby"),
        Some(AccountState::Refused(reason)) => (
            StateName::DiscoveryError,
            format!("refused by the gateway: {reason}"),
            "refused",
        ),
    }
}

/// `/accounts`'s Armory filters and paging.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccountQuery {
    /// `Config.Name` (repeatable): only these accounts.
    pub names: Vec<String>,
    /// `Config.Dynamic`: only dynamic (assigned) accounts, or only
    /// configured ones.
    pub dynamic: Option<bool>,
    /// `State.Name`: only accounts in this state.
    pub state: Option<StateName>,
    /// `limit`: at most this many (≥ 1); all when absent.
    pub limit: Option<usize>,
    /// `offset`: skip this many, after filtering (sorted by name).
    pub offset: usize,
}

/// Whether `query` (the raw query string) names an Armory parameter.
pub fn asks_armory(query: &str) -> bool {
    pairs(query).any(|(k, _)| QUERY_KEYS.contains(&k.as_str()))
}

/// `key=value` pairs of a raw query, percent-decoded (`+` is a space);
/// undecodable text is kept raw, to be refused by the parser that reads it.
fn pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        percent_encoding::percent_decode_str(&s)
            .decode_utf8()
            .map_or_else(|_| s.clone(), |d| d.into_owned())
    };
    query.split('&').filter(|p| !p.is_empty()).map(move |p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        (decode(k), decode(v))
    })
}

impl AccountQuery {
    /// Reads the Armory parameters of `query`; other parameters are
    /// ignored. A value that cannot be read is an error naming the
    /// parameter and what it accepts.
    pub fn parse(query: &str) -> Result<Self, String> {
        let mut q = Self::default();
        for (key, value) in pairs(query) {
            match key.as_str() {
                "Config.Name" => q.names.push(value),
                "Config.Dynamic" => {
                    q.dynamic = Some(match value.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(format!("Config.Dynamic: {value:?} is not true or false"));
                        }
                    });
                }
                "State.Name" => {
                    q.state = Some(StateName::parse(&value).ok_or_else(|| {
                        format!(
                            "State.Name: {value:?} is not one of DiscoveryError, Healthy, ConfigLoaded"
                        )
                    })?);
                }
                "limit" => match value.parse::<usize>() {
                    Ok(n) if n >= 1 => q.limit = Some(n),
                    _ => {
                        return Err(format!(
                            "limit: {value:?} is not a whole number of at least 1"
                        ));
                    }
                },
                "offset" => {
                    q.offset = value.parse::<usize>().map_err(|_| {
                        format!("offset: {value:?} is not a whole number of at least 0")
                    })?;
                }
                _ => {}
            }
        }
        Ok(q)
    }
}

/// One account in Armory's `/accounts` shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ArmoryAccount {
    /// Its configuration.
    pub config: AccountConfigView,
    /// Its state.
    pub state: AccountStateView,
    /// The kinds it watches now (`resource` or `resource.group`).
    pub kinds: Vec<String>,
    /// The cluster's version as discovered (empty until read).
    pub kubernetes_version: String,
}

/// `Config` of an [`ArmoryAccount`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct AccountConfigView {
    /// The account name.
    pub name: String,
    /// Assigned over `Assignments` rather than in the configuration file.
    pub dynamic: bool,
    /// The namespaces it is limited to (all when empty).
    pub namespaces: Vec<String>,
}

/// `State` of an [`ArmoryAccount`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct AccountStateView {
    /// Armory's name of the state.
    pub name: StateName,
    /// Why, for `DiscoveryError`.
    pub message: String,
    /// spinlink's name of the state (`configured`, `streaming`, `synced`,
    /// `standby`, `refused`).
    pub spinlink_state: &'static str,
}

/// The accounts `query` selects, sorted by name, and how many matched
/// before paging.
pub fn accounts(
    state: &AgentState,
    watched: &[crate::activity::watches::WatchStatus],
    query: &AccountQuery,
) -> (Vec<ArmoryAccount>, usize) {
    let matching: Vec<ArmoryAccount> = state
        .configured
        .iter()
        .filter(|(name, _)| query.names.is_empty() || query.names.contains(name))
        .filter(|(_, c)| query.dynamic.is_none_or(|d| d == c.dynamic))
        .map(|(name, c)| {
            let (armory, message, spinlink) = state_name(state.accounts.get(name));
            let mut kinds: Vec<String> = watched
                .iter()
                .filter(|w| &w.account == name)
                .map(|w| w.kind.clone())
                .collect();
            kinds.dedup();
            ArmoryAccount {
                config: AccountConfigView {
                    name: name.clone(),
                    dynamic: c.dynamic,
                    namespaces: c.namespaces.clone(),
                },
                state: AccountStateView {
                    name: armory,
                    message,
                    spinlink_state: spinlink,
                },
                kinds,
                kubernetes_version: c.kubernetes_version.clone(),
            }
        })
        .filter(|a| query.state.is_none_or(|s| s == a.state.name))
        .collect();
    let total = matching.len();
    let page = matching
        .into_iter()
        .skip(query.offset)
        .take(query.limit.unwrap_or(usize::MAX))
        .collect();
    (page, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Configured;

    fn state() -> AgentState {
        let mut s = AgentState {
            connected: true,
            ..AgentState::default()
        };
        for (name, dynamic) in [("a", false), ("b", true), ("c", false), ("d", true)] {
            s.configured.insert(
                name.into(),
                Configured {
                    dynamic,
                    ..Configured::default()
                },
            );
        }
        s.accounts.insert("a".into(), AccountState::Synced);
        s.accounts.insert("b".into(), AccountState::Streaming);
        s.accounts
            .insert("c".into(), AccountState::Refused("no rule".into()));
        s
    }

    fn names(query: &str) -> (Vec<String>, usize) {
        let q = AccountQuery::parse(query).unwrap();
        let (page, total) = accounts(&state(), &[], &q);
        (page.into_iter().map(|a| a.config.name).collect(), total)
    }

    #[test]
    fn filters_and_pages_select_accounts_by_name_order() {
        assert_eq!(
            names(""),
            (vec!["a".into(), "b".into(), "c".into(), "d".into()], 4)
        );
        assert_eq!(names("Config.Name=c"), (vec!["c".into()], 1));
        assert_eq!(
            names("Config.Name=a&Config.Name=d"),
            (vec!["a".into(), "d".into()], 2)
        );
        assert_eq!(
            names("Config.Dynamic=true"),
            (vec!["b".into(), "d".into()], 2)
        );
        assert_eq!(
            names("Config.Dynamic=FALSE"),
            (vec!["a".into(), "c".into()], 2)
        );
        // Not connected yet and still listing are both ConfigLoaded.
        assert_eq!(
            names("State.Name=ConfigLoaded"),
            (vec!["b".into(), "d".into()], 2)
        );
        assert_eq!(names("State.Name=Healthy"), (vec!["a".into()], 1));
        assert_eq!(names("State.Name=DiscoveryError"), (vec!["c".into()], 1));
        assert_eq!(names("limit=2"), (vec!["a".into(), "b".into()], 4));
        assert_eq!(names("limit=2&offset=3"), (vec!["d".into()], 4));
        assert_eq!(names("offset=9"), (vec![], 4));
        assert_eq!(
            names("Config.Dynamic=true&limit=1&offset=1&cachebuster=7"),
            (vec!["d".into()], 2)
        );
        assert_eq!(names("Config.Name=a%2Fb"), (vec![], 0));
    }

    #[test]
    fn bad_values_are_refused_naming_the_parameter() {
        for (query, names) in [
            ("limit=abc", "limit"),
            ("limit=0", "limit"),
            ("limit=-1", "limit"),
            ("offset=-1", "offset"),
            ("offset=x", "offset"),
            ("Config.Dynamic=yes", "Config.Dynamic"),
            ("State.Name=Running", "State.Name"),
        ] {
            let e = AccountQuery::parse(query).unwrap_err();
            assert!(e.starts_with(names), "{query}: {e}");
        }
    }

    #[test]
    fn armory_parameters_are_recognised_others_not() {
        assert!(asks_armory("limit=1"));
        assert!(asks_armory("x=1&State.Name=Healthy"));
        assert!(asks_armory("Config%2EName=a"));
        assert!(!asks_armory(""));
        assert!(!asks_armory("pretty=true"));
    }

    #[test]
    fn every_spinlink_state_has_an_armory_name() {
        let cases = [
            (None, StateName::ConfigLoaded),
            (Some(AccountState::Streaming), StateName::ConfigLoaded),
            (Some(AccountState::Synced), StateName::Healthy),
            (Some(AccountState::Standby), StateName::Healthy),
            (
                Some(AccountState::Refused("r".into())),
                StateName::DiscoveryError,
            ),
        ];
        for (spinlink, armory) in cases {
            assert_eq!(state_name(spinlink.as_ref()).0, armory, "{spinlink:?}");
        }
    }
}
