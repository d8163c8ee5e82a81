//! IP networks in CIDR notation (`10.0.0.0/8`, `fd00::/8`, or a bare address
//! for a single host), for `listener.trustedProxies`.

use std::net::IpAddr;

/// Why a CIDR did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The address part is not an IP address.
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// The prefix length is not a number in range for the address family.
    #[error("prefix length {0:?} out of range")]
    Prefix(String),
}

/// An IP network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `addr/prefix` or a bare address (a /32 or /128).
    pub fn parse(s: &str) -> Result<Self, Error> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| Error::Address(addr.to_owned()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| Error::Prefix(p.to_owned()))?,
        };
        Ok(Self { addr, prefix })
    }

    /// Whether `ip` is in this network. IPv4-mapped IPv6 addresses
    /// (`::ffff:a.b.c.d`, as a dual-stack socket reports IPv4 peers) match
    /// IPv4 networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    let rest = prefix % 8;
    if a[..full] != b[..full] {
        return false;
    }
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    (a[full] & mask) == (b[full] & mask)
}

/// The client network `ip` belongs to for per-source limits: its IPv4 /24
/// or IPv6 /64 (one site, one subnet: what one operator controls), as the
/// network's first address. IPv4-mapped IPv6 addresses count as IPv4.
pub fn client_network(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => client_network(IpAddr::V4(v4)),
            None => {
                let mut o = v6.octets();
                o[8..].fill(0);
                IpAddr::from(o)
            }
        },
        IpAddr::V4(v4) => {
            let mut o = v4.octets();
            o[3] = 0;
            IpAddr::from(o)
        }
    }
}

/// Whether any of `nets` contains `ip`.
pub fn any_contains(nets: &[Cidr], ip: IpAddr) -> bool {
    nets.iter().any(|n| n.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn contains_by_prefix() {
        let net = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(net.contains(ip("10.1.255.3")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(net.contains(ip("::ffff:10.1.2.3")));
        let host = Cidr::parse("127.0.0.2").unwrap();
        assert!(host.contains(ip("127.0.0.2")));
        assert!(!host.contains(ip("127.0.0.1")));
        let odd = Cidr::parse("192.168.0.128/25").unwrap();
        assert!(odd.contains(ip("192.168.0.200")));
        assert!(!odd.contains(ip("192.168.0.127")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")));
        assert!(!v6.contains(ip("fe80::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
    }

    #[test]
    fn client_networks_are_v4_24_and_v6_64() {
        assert_eq!(client_network(ip("203.0.113.7")), ip("203.0.113.0"));
        assert_eq!(client_network(ip("::ffff:203.0.113.7")), ip("203.0.113.0"));
        assert_eq!(
            client_network(ip("2001:db8:1:2:3:4:5:6")),
            ip("2001:db8:1:2::")
        );
    }

    #[test]
    fn bad_cidrs_are_refused() {
        assert!(matches!(Cidr::parse("10.0.0.0/33"), Err(Error::Prefix(_))));
        assert!(matches!(Cidr::parse("nope/8"), Err(Error::Address(_))));
        assert!(matches!(Cidr::parse("::/129"), Err(Error::Prefix(_))));
        assert!(matches!(Cidr::parse("10.0.0.0/x"), Err(Error::Prefix(_))));
    }
}
