//! Argument syntaxes: nginx's time (`ngx_parse_time`), size
//! (`ngx_parse_offset`), `on`/`off`, addresses (`ngx_parse_url`) and CIDRs.
//! Each returns `None` (or a reason) for a value nginx would reject.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `NGX_MAX_INT_T_VALUE` on 64-bit builds.
const MAX_INT: u64 = i64::MAX as u64;

/// nginx time syntax in milliseconds, as `ngx_conf_set_msec_slot` reads it:
/// `500ms`, `30s`, `5m`, `1h 30m`, `1d`, `1w`; a bare number is seconds.
/// (`y` and `M` are allowed only where nginx counts seconds, so not here.)
pub(crate) fn parse_msec(s: &str) -> Option<u64> {
    parse_time(s, false)
}

/// `ngx_parse_time`: `is_sec` counts in seconds, else in milliseconds.
pub(crate) fn parse_time(s: &str, is_sec: bool) -> Option<u64> {
    // The steps of ngx_parse_time, in the order units must appear.
    const START: u8 = 0;
    const YEAR: u8 = 1;
    const MONTH: u8 = 2;
    const WEEK: u8 = 3;
    const DAY: u8 = 4;
    const HOUR: u8 = 5;
    const MIN: u8 = 6;
    const SEC: u8 = 7;
    const MSEC: u8 = 8;
    const LAST: u8 = 9;

    let b = s.as_bytes();
    let mut step = if is_sec { START } else { MONTH };
    let mut valid = false;
    let mut value: u64 = 0;
    let mut total: u64 = 0;
    let mut p = 0;
    while let Some(&c) = b.get(p) {
        if c.is_ascii_digit() {
            value = value.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            if value > MAX_INT {
                return None;
            }
            valid = true;
            p += 1;
            continue;
        }
        p += 1;
        let (next, mut max, mut scale): (u8, u64, u64) = match c {
            b'y' if step == START => (YEAR, MAX_INT / (60 * 60 * 24 * 365), 60 * 60 * 24 * 365),
            b'M' if step < MONTH => (MONTH, MAX_INT / (60 * 60 * 24 * 30), 60 * 60 * 24 * 30),
            b'w' if step < WEEK => (WEEK, MAX_INT / (60 * 60 * 24 * 7), 60 * 60 * 24 * 7),
            b'd' if step < DAY => (DAY, MAX_INT / (60 * 60 * 24), 60 * 60 * 24),
            b'h' if step < HOUR => (HOUR, MAX_INT / (60 * 60), 60 * 60),
            b'm' if b.get(p) == Some(&b's') => {
                if is_sec || step >= MSEC {
                    return None;
                }
                p += 1;
                (MSEC, MAX_INT, 1)
            }
            b'm' if step < MIN => (MIN, MAX_INT / 60, 60),
            b's' if step < SEC => (SEC, MAX_INT, 1),
            b' ' if step < SEC => (LAST, MAX_INT, 1),
            _ => return None,
        };
        step = next;
        if step != MSEC && !is_sec {
            scale *= 1000;
            max /= 1000;
        }
        if value > max {
            return None;
        }
        value *= scale;
        if total > MAX_INT - value {
            return None;
        }
        total += value;
        value = 0;
        while b.get(p) == Some(&b' ') {
            p += 1;
        }
    }
    if !valid {
        return None;
    }
    if !is_sec {
        if value > MAX_INT / 1000 {
            return None;
        }
        value *= 1000;
    }
    if total > MAX_INT - value {
        return None;
    }
    Some(total + value)
}

/// `ngx_parse_offset`: bytes, with an optional `k`, `m` or `g` suffix
/// (either case, powers of 1024).
pub(crate) fn parse_size(s: &str) -> Option<u64> {
    let (digits, scale): (&str, u64) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1024),
        b'm' | b'M' => (&s[..s.len() - 1], 1024 * 1024),
        b'g' | b'G' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    if n > MAX_INT / scale {
        return None;
    }
    Some(n * scale)
}

/// `ngx_conf_set_flag_slot`: `on` or `off`, any case.
pub(crate) fn parse_flag(s: &str) -> Option<bool> {
    if s.eq_ignore_ascii_case("on") {
        Some(true)
    } else if s.eq_ignore_ascii_case("off") {
        Some(false)
    } else {
        None
    }
}

/// A host and port as `ngx_parse_url` splits them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPort {
    /// Host without IPv6 brackets; `*` for a wildcard listen.
    pub(crate) host: String,
    /// `None` when no port was written.
    pub(crate) port: Option<u16>,
}

/// Splits `host[:port]`, `[v6][:port]` or (when `port_only_ok`) a bare port.
/// The error is nginx's wording.
pub(crate) fn parse_host_port(s: &str, port_only_ok: bool) -> Result<HostPort, String> {
    if s.is_empty() {
        return Err("no host".into());
    }
    if let Some(rest) = s.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err("invalid host".into());
        };
        let host = &rest[..end];
        if host.parse::<Ipv6Addr>().is_err() {
            return Err("invalid IPv6 address".into());
        }
        let after = &rest[end + 1..];
        let port = if after.is_empty() {
            None
        } else if let Some(p) = after.strip_prefix(':') {
            Some(parse_port(p)?)
        } else {
            return Err("invalid host".into());
        };
        return Ok(HostPort {
            host: host.to_string(),
            port,
        });
    }
    if let Some((host, port)) = s.split_once(':') {
        if host.is_empty() {
            return Err("no host".into());
        }
        check_host(host)?;
        return Ok(HostPort {
            host: host.to_string(),
            port: Some(parse_port(port)?),
        });
    }
    if port_only_ok && s.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(HostPort {
            host: "*".into(),
            port: Some(parse_port(s)?),
        });
    }
    check_host(s)?;
    Ok(HostPort {
        host: s.to_string(),
        port: None,
    })
}

fn parse_port(s: &str) -> Result<u16, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("invalid port".into());
    }
    match s.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => u16::try_from(n).map_err(|_| "invalid port".into()),
        _ => Err("invalid port".into()),
    }
}

/// Host names: letters, digits, `-`, `.`, `_` (and `*` for listen). Anything
/// else (a `$variable`, a `/`) is refused here rather than resolved.
fn check_host(host: &str) -> Result<(), String> {
    if host == "*" || host.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    if host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        Ok(())
    } else {
        Err(format!("invalid host \"{host}\""))
    }
}

/// `set_real_ip_from` values: an address or `address/bits`, normalised to
/// the network (`10.1.2.3/8` → `10.0.0.0/8`, as `ngx_ptocidr` does with a
/// warning).
pub(crate) fn parse_cidr(s: &str) -> Option<String> {
    let (addr, bits) = match s.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    let addr: IpAddr = addr.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let bits: u32 = match bits {
        None => max,
        Some(b) if !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()) => b.parse().ok()?,
        Some(_) => return None,
    };
    if bits > max {
        return None;
    }
    let net = match addr {
        IpAddr::V4(a) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
        }
    };
    Some(format!("{net}/{bits}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_units_and_bare_seconds() {
        assert_eq!(parse_msec("60"), Some(60_000));
        assert_eq!(parse_msec("60s"), Some(60_000));
        assert_eq!(parse_msec("5m"), Some(300_000));
        assert_eq!(parse_msec("500ms"), Some(500));
        assert_eq!(parse_msec("1h 30m"), Some(5_400_000));
        assert_eq!(parse_msec("1h30m"), Some(5_400_000));
        assert_eq!(parse_msec("1d"), Some(86_400_000));
        assert_eq!(parse_msec("1w"), Some(604_800_000));
        assert_eq!(parse_msec("1m 5"), Some(65_000));
        // A space ends a unitless number like "s" would (ngx_parse_time).
        assert_eq!(parse_msec("1 2"), Some(3_000));
    }

    #[test]
    fn time_rejects_what_nginx_rejects() {
        for bad in [
            "",
            "s",
            "1y",
            "1M",
            "5x",
            "30m 1h",
            "1s1s",
            "-1",
            "99999999999999999999",
        ] {
            assert_eq!(parse_msec(bad), None, "{bad:?}");
        }
        assert_eq!(parse_time("1y", true), Some(31_536_000));
        assert_eq!(parse_time("5ms", true), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("10k"), Some(10 * 1024));
        assert_eq!(parse_size("10K"), Some(10 * 1024));
        assert_eq!(parse_size("8m"), Some(8 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        for bad in ["", "m", "1.5m", "-1", "1t", "1kb", "99999999999g"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn host_ports() {
        let hp = |s| parse_host_port(s, true);
        assert_eq!(
            hp("443"),
            Ok(HostPort {
                host: "*".into(),
                port: Some(443)
            })
        );
        assert_eq!(
            hp("[::]:443"),
            Ok(HostPort {
                host: "::".into(),
                port: Some(443)
            })
        );
        assert_eq!(
            hp("127.0.0.1"),
            Ok(HostPort {
                host: "127.0.0.1".into(),
                port: None
            })
        );
        assert!(hp("host:0").is_err());
        assert!(hp("host:70000").is_err());
        assert!(hp("[::1").is_err());
        assert!(hp("$upstream:80").is_err());
        assert!(parse_host_port("8080", false).is_ok());
    }

    #[test]
    fn cidrs() {
        assert_eq!(parse_cidr("10.1.2.3/8").as_deref(), Some("10.0.0.0/8"));
        assert_eq!(parse_cidr("10.1.2.3").as_deref(), Some("10.1.2.3/32"));
        assert_eq!(parse_cidr("::1").as_deref(), Some("::1/128"));
        assert_eq!(parse_cidr("0.0.0.0/0").as_deref(), Some("0.0.0.0/0"));
        assert_eq!(parse_cidr("10.0.0.0/33"), None);
        assert_eq!(parse_cidr("example.com"), None);
    }
}
