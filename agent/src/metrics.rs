//! The agent's Prometheus metrics (`prometheus-client`), served in text
//! format by the admin port. One [`Metrics`] per agent, cloned into every
//! task that counts something.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels: account and kind (`resource.group`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// The account.
    pub account: String,
    /// `resource` or `resource.group`.
    pub kind: String,
}

/// Labels: the result of an operation.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// What happened.
    pub result: String,
}

/// Labels: account, verb and outcome of a relayed request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RelayLabels {
    /// The account.
    pub account: String,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, …).
    pub verb: String,
    /// `relayed`, `denied`, `error` or `busy`.
    pub outcome: String,
}

/// Labels: account only.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccountLabels {
    /// The account.
    pub account: String,
}

/// Labels: account and the state it is in on the current connection.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccountStateLabels {
    /// The account.
    pub account: String,
    /// `streaming`, `synced`, `standby` or `refused`.
    pub state: String,
}

/// Labels: which certificate.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabels {
    /// `client`: the one the agent presents to the gateway.
    pub certificate: String,
}

/// The states of [`AccountStateLabels`], in the order they are exported.
const ACCOUNT_STATES: [&str; 4] = ["streaming", "synced", "standby", "refused"];

/// Every metric the agent keeps.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Watch events sent, per account and kind.
    pub events: Family<KindLabels, Counter>,
    /// Object bytes sent, per account and kind.
    pub bytes: Family<KindLabels, Counter>,
    /// Watches running, per account and kind.
    pub watches: Family<KindLabels, Gauge>,
    /// Listings started (initial, after 410, resync), per account and kind.
    pub relists: Family<KindLabels, Counter>,
    /// 410 Gone answers to watches, per account and kind.
    pub gone: Family<KindLabels, Counter>,
    /// Relayed requests, per account, verb and outcome.
    pub relays: Family<RelayLabels, Counter>,
    /// Gateway connections made.
    pub reconnects: Counter,
    /// Moves to a new connection on the gateway's `Reconnect`.
    pub moves: Counter,
    /// Channel token renewals (one `Hello` each).
    pub token_renewals: Counter,
    /// Configuration reloads by result (`applied`, `refused`).
    pub reloads: Family<ResultLabels, Counter>,
    /// Messages in the unacked window, per account.
    pub unacked: Family<AccountLabels, Gauge>,
    /// Age of the oldest unacknowledged message, in seconds, per account:
    /// how far the sidecar's cache is behind what the agent has seen.
    pub lag: Family<AccountLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The gateway's clock minus this host's, in seconds, from the last
    /// `Heartbeat` on `Control` (0 until one arrives).
    pub gateway_clock_offset: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `Heartbeat`s received from the gateway on `Control`.
    pub control_heartbeats: Counter,
    /// Open TCP connections to the account's API server, per account.
    pub apiserver_connections: Family<AccountLabels, Gauge>,
    /// 1 while a gateway connection is up and `Hello` was answered (set
    /// from the agent's state at each scrape).
    pub connected: Gauge,
    /// Per account, 1 for the state it is in on the current connection
    /// (set from the agent's state at each scrape; none while disconnected).
    pub account_state: Family<AccountStateLabels, Gauge>,
    /// The client certificate's notAfter, Unix seconds, read at each
    /// attempt to connect to the gateway (no series without a client
    /// certificate).
    pub certificate_not_after: Family<CertificateLabels, Gauge>,
    /// The watches running now (the admin port's `/watches`; not exported
    /// as metrics).
    pub active: crate::activity::watches::WatchTable,
    /// The relayed requests executing now (the admin port's `/operations`;
    /// not exported as metrics).
    pub operations: crate::activity::operations::OperationTable,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("spinlink_agent");
        let events = Family::<KindLabels, Counter>::default();
        let bytes = Family::<KindLabels, Counter>::default();
        let watches = Family::<KindLabels, Gauge>::default();
        let relists = Family::<KindLabels, Counter>::default();
        let gone = Family::<KindLabels, Counter>::default();
        let relays = Family::<RelayLabels, Counter>::default();
        let reconnects = Counter::default();
        let moves = Counter::default();
        let token_renewals = Counter::default();
        let reloads = Family::<ResultLabels, Counter>::default();
        let unacked = Family::<AccountLabels, Gauge>::default();
        let lag = Family::<AccountLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let gateway_clock_offset = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        let control_heartbeats = Counter::default();
        let apiserver_connections = Family::<AccountLabels, Gauge>::default();
        let connected = Gauge::default();
        let account_state = Family::<AccountStateLabels, Gauge>::default();
        let certificate_not_after = Family::<CertificateLabels, Gauge>::default();
        registry.register("events", "Watch events sent", events.clone());
        registry.register("bytes", "Object bytes sent", bytes.clone());
        registry.register("watches", "Watches running", watches.clone());
        registry.register("relists", "Listings started", relists.clone());
        registry.register("watch_gone", "410 Gone answers to watches", gone.clone());
        registry.register(
            "relays",
            "Relayed requests by verb and outcome",
            relays.clone(),
        );
        registry.register(
            "connections",
            "Gateway connections made",
            reconnects.clone(),
        );
        registry.register(
            "connection_moves",
            "Moves to a new gateway connection asked for by the gateway",
            moves.clone(),
        );
        registry.register(
            "token_renewals",
            "Channel token renewals",
            token_renewals.clone(),
        );
        registry.register(
            "config_reloads",
            "Configuration file changes, by result",
            reloads.clone(),
        );
        registry.register(
            "unacked_messages",
            "Messages sent and not acknowledged",
            unacked.clone(),
        );
        registry.register_with_unit(
            "delivery_lag",
            "Age of the oldest message not yet acknowledged by the sidecar",
            prometheus_client::registry::Unit::Seconds,
            lag.clone(),
        );
        registry.register_with_unit(
            "gateway_clock_offset",
            "The gateway's clock minus this host's, from its last Control heartbeat",
            prometheus_client::registry::Unit::Seconds,
            gateway_clock_offset.clone(),
        );
        registry.register(
            "control_heartbeats",
            "Heartbeats received from the gateway on Control",
            control_heartbeats.clone(),
        );
        registry.register(
            "apiserver_connections",
            "Open TCP connections to the account's API server",
            apiserver_connections.clone(),
        );
        registry.register(
            "connected",
            "1 while connected to a gateway with Hello answered",
            connected.clone(),
        );
        registry.register(
            "account_state",
            "1 for the state each account is in on the current gateway connection (streaming, synced, standby, refused)",
            account_state.clone(),
        );
        // A family, so an agent without a client certificate (JWT
        // bootstrap, plaintext) exports no series rather than a notAfter of
        // 1970 that every expiry alert would take for an expired one.
        registry.register_with_unit(
            "certificate_not_after",
            "The client certificate's notAfter as a Unix time, read at each attempt to connect to the gateway",
            prometheus_client::registry::Unit::Seconds,
            certificate_not_after.clone(),
        );
        Self {
            registry: Arc::new(registry),
            events,
            bytes,
            watches,
            relists,
            gone,
            relays,
            reconnects,
            moves,
            token_renewals,
            reloads,
            unacked,
            lag,
            gateway_clock_offset,
            control_heartbeats,
            apiserver_connections,
            connected,
            account_state,
            certificate_not_after,
            active: crate::activity::watches::WatchTable::default(),
            operations: crate::activity::operations::OperationTable::default(),
        }
    }

    /// Labels of `kind` in `account`.
    pub fn kind(account: &str, kind: &crate::kinds::WatchedKind) -> KindLabels {
        KindLabels {
            account: account.to_owned(),
            kind: kind.qualified(),
        }
    }

    /// The gauge of `account`'s open API server connections.
    pub fn apiserver_connections(&self, account: &str) -> Gauge {
        self.apiserver_connections
            .get_or_create(&AccountLabels {
                account: account.to_owned(),
            })
            .clone()
    }

    /// Counts a configuration reload.
    pub fn reload(&self, result: &str) {
        self.reloads
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// Counts one relayed request.
    pub fn relay(&self, account: &str, verb: &str, outcome: &str) {
        self.relays
            .get_or_create(&RelayLabels {
                account: account.to_owned(),
                verb: verb.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Records the client certificate's notAfter (Unix seconds).
    pub fn client_certificate(&self, not_after: i64) {
        self.certificate_not_after
            .get_or_create(&CertificateLabels {
                certificate: "client".to_owned(),
            })
            .set(not_after);
    }

    /// The metrics in Prometheus text format, with the connection and
    /// account gauges set from `state` first, so a scrape always agrees
    /// with `/readyz` and `/accounts`.
    pub fn encode_with_state(&self, state: &crate::state::AgentState) -> String {
        use crate::state::AccountState;
        self.connected.set(i64::from(state.connected));
        // Accounts gone since the last scrape lose their series.
        self.account_state.clear();
        for (account, s) in &state.accounts {
            let current = match s {
                AccountState::Streaming => "streaming",
                AccountState::Synced => "synced",
                AccountState::Standby => "standby",
                AccountState::Refused(_) => "refused",
            };
            for name in ACCOUNT_STATES {
                self.account_state
                    .get_or_create(&AccountStateLabels {
                        account: account.clone(),
                        state: name.to_owned(),
                    })
                    .set(i64::from(name == current));
            }
        }
        self.encode()
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format_names_labels() {
        let m = Metrics::new();
        m.relay("dev", "delete", "denied");
        m.events
            .get_or_create(&KindLabels {
                account: "dev".into(),
                kind: "pods".into(),
            })
            .inc_by(3);
        m.lag
            .get_or_create(&AccountLabels {
                account: "dev".into(),
            })
            .set(1.5);
        let text = m.encode();
        assert!(
            text.contains("spinlink_agent_delivery_lag_seconds{account=\"dev\"} 1.5"),
            "{text}"
        );
        assert!(
            text.contains(
                "spinlink_agent_relays_total{account=\"dev\",verb=\"delete\",outcome=\"denied\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("spinlink_agent_events_total{account=\"dev\",kind=\"pods\"} 3"),
            "{text}"
        );
        assert!(
            !text.contains("spinlink_agent_certificate_not_after_seconds{"),
            "no client certificate read yet: {text}"
        );
    }

    #[test]
    fn state_and_certificate_gauges_follow_the_agent() {
        use crate::state::{AccountState, AgentState};
        let m = Metrics::new();
        m.client_certificate(1_900_000_000);
        let mut state = AgentState {
            connected: true,
            ..AgentState::default()
        };
        state.accounts.insert("dev".into(), AccountState::Synced);
        state
            .accounts
            .insert("prod".into(), AccountState::Refused("policy".into()));
        let text = m.encode_with_state(&state);
        for line in [
            "spinlink_agent_connected 1",
            "spinlink_agent_account_state{account=\"dev\",state=\"synced\"} 1",
            "spinlink_agent_account_state{account=\"dev\",state=\"streaming\"} 0",
            "spinlink_agent_account_state{account=\"prod\",state=\"refused\"} 1",
            "spinlink_agent_certificate_not_after_seconds{certificate=\"client\"} 1900000000",
        ] {
            assert!(text.contains(line), "{line} missing: {text}");
        }
        // Disconnected: no account has a state any more.
        let text = m.encode_with_state(&AgentState::default());
        assert!(text.contains("spinlink_agent_connected 0"), "{text}");
        assert!(
            !text.contains("spinlink_agent_account_state{"),
            "stale account series: {text}"
        );
    }
}
