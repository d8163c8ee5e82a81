//! Connections counted by the real client's network
//! (`spinlink_gateway_client_connections_total{client_network, result}`):
//! the address after PROXY-protocol resolution, cut to its IPv4 /24 or IPv6
//! /64, so an operator sees which sites reach the gateway and which are
//! turned away without one series per client address. Distinct networks are
//! capped ([`MAX_CLIENT_NETWORKS`]); the ones past the cap share
//! `client_network="other"`, so a scan from the whole internet adds one
//! series, not millions.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Most distinct client networks given their own series.
pub const MAX_CLIENT_NETWORKS: usize = 256;
/// The `client_network` of every network past the cap.
pub const OTHER_NETWORK: &str = "other";

/// Label set `{client_network="203.0.113.0/24", result="accepted"|"refused"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ClientNetworkLabel {
    /// The client's /24 (IPv4) or /64 (IPv6), or `other`.
    pub client_network: String,
    /// `accepted` or `refused`.
    pub result: &'static str,
}

/// What became of a connection, for [`ClientNetworks::count`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientResult {
    /// Its TLS handshake succeeded (on the insecure listener: it got past
    /// the PROXY header).
    Accepted,
    /// The listener turned it away before serving it: a connection-level
    /// refusal (`refusals_total`) or a failed TLS handshake.
    Refused,
}

impl ClientResult {
    fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Refused => "refused",
        }
    }
}

/// The counter family and the networks given a series so far.
#[derive(Debug)]
pub struct ClientNetworks {
    family: Family<ClientNetworkLabel, Counter>,
    /// Networks with their own series; never more than `cap`.
    tracked: Mutex<HashSet<String>>,
    cap: usize,
}

impl Default for ClientNetworks {
    fn default() -> Self {
        Self::with_cap(MAX_CLIENT_NETWORKS)
    }
}

impl ClientNetworks {
    /// Tracks at most `cap` networks by name.
    pub fn with_cap(cap: usize) -> Self {
        Self {
            family: Family::default(),
            tracked: Mutex::new(HashSet::new()),
            cap,
        }
    }

    /// The family to register.
    pub fn family(&self) -> Family<ClientNetworkLabel, Counter> {
        self.family.clone()
    }

    /// Counts one connection from `client`.
    pub fn count(&self, client: IpAddr, result: ClientResult) {
        let network = network_of(client);
        let client_network = {
            let mut tracked = self.tracked.lock().unwrap_or_else(|e| e.into_inner());
            if tracked.contains(&network) {
                network
            } else if tracked.len() < self.cap {
                tracked.insert(network.clone());
                network
            } else {
                OTHER_NETWORK.to_owned()
            }
        };
        self.family
            .get_or_create(&ClientNetworkLabel {
                client_network,
                result: result.as_str(),
            })
            .inc();
    }

    /// Connections counted for `client_network` (as labelled) and `result`.
    pub fn get(&self, client_network: &str, result: ClientResult) -> u64 {
        self.family
            .get(&ClientNetworkLabel {
                client_network: client_network.to_owned(),
                result: result.as_str(),
            })
            .map_or(0, |c| c.get())
    }
}

/// `client`'s IPv4 /24 or IPv6 /64 in CIDR notation; an IPv4-mapped IPv6
/// address counts as the IPv4 one.
pub fn network_of(client: IpAddr) -> String {
    match client.to_canonical() {
        IpAddr::V4(v4) => {
            let net = Ipv4Addr::from(v4.to_bits() & !0xff);
            format!("{net}/24")
        }
        IpAddr::V6(v6) => {
            let net = Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX));
            format!("{net}/64")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_are_cut_to_their_network() {
        assert_eq!(network_of(ip("203.0.113.7")), "203.0.113.0/24");
        assert_eq!(network_of(ip("::ffff:203.0.113.7")), "203.0.113.0/24");
        assert_eq!(network_of(ip("2001:db8:1:2:3:4:5:6")), "2001:db8:1:2::/64");
    }

    #[test]
    fn networks_past_the_cap_are_counted_as_other() {
        let networks = ClientNetworks::with_cap(2);
        networks.count(ip("192.0.2.1"), ClientResult::Accepted);
        networks.count(ip("198.51.100.1"), ClientResult::Refused);
        // A third network: no series of its own.
        networks.count(ip("203.0.113.7"), ClientResult::Accepted);
        networks.count(ip("203.0.113.8"), ClientResult::Refused);
        // A tracked network keeps its series after the cap is reached.
        networks.count(ip("192.0.2.200"), ClientResult::Accepted);

        assert_eq!(networks.get("192.0.2.0/24", ClientResult::Accepted), 2);
        assert_eq!(networks.get("198.51.100.0/24", ClientResult::Refused), 1);
        assert_eq!(networks.get("203.0.113.0/24", ClientResult::Accepted), 0);
        assert_eq!(networks.get(OTHER_NETWORK, ClientResult::Accepted), 1);
        assert_eq!(networks.get(OTHER_NETWORK, ClientResult::Refused), 1);
        assert_eq!(networks.tracked.lock().unwrap().len(), 2);
    }

    #[test]
    fn the_default_cap_bounds_the_series() {
        let networks = ClientNetworks::default();
        for i in 0..1000u32 {
            // A different /24 each time.
            networks.count(IpAddr::V4(Ipv4Addr::from(i << 8)), ClientResult::Refused);
        }
        let mut out = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("client_connections", "test", networks.family());
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        let series = out.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(series, MAX_CLIENT_NETWORKS + 1, "{out}");
        assert_eq!(
            networks.get(OTHER_NETWORK, ClientResult::Refused),
            1000 - MAX_CLIENT_NETWORKS as u64
        );
    }
}
