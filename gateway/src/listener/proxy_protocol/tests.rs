use proptest::prelude::*;

use super::*;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
    let mut b = V2_SIGNATURE.to_vec();
    b.push(0x20 | command);
    b.push(family);
    b.extend_from_slice(&(body.len() as u16).to_be_bytes());
    b.extend_from_slice(body);
    b
}

#[test]
fn v1_tcp4_and_tcp6() {
    let h = b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 7443\r\n\x16\x03\x01";
    assert_eq!(
        parse(h).unwrap(),
        Parse::Done {
            header: ProxyHeader::Proxied {
                source: sa("192.0.2.7:56324"),
                destination: sa("10.0.0.1:7443"),
            },
            len: h.len() - 3,
        }
    );
    let h = b"PROXY TCP6 2001:db8::1 ::1 1 65535\r\n";
    assert_eq!(
        parse(h).unwrap(),
        Parse::Done {
            header: ProxyHeader::Proxied {
                source: sa("[2001:db8::1]:1"),
                destination: sa("[::1]:65535"),
            },
            len: h.len(),
        }
    );
    assert_eq!(
        parse(b"PROXY UNKNOWN whatever\r\n").unwrap(),
        Parse::Done {
            header: ProxyHeader::Unknown,
            len: 24
        }
    );
}

#[test]
fn v1_incomplete_and_errors() {
    let full = b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 7443\r\n";
    for n in 1..full.len() {
        assert_eq!(parse(&full[..n]).unwrap(), Parse::Incomplete, "{n}");
    }
    for bad in [
        &b"PROXY TCP4 192.0.2.7 10.0.0.1 56324\r\n"[..],
        b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 7443 x\r\n",
        b"PROXY TCP4 ::1 10.0.0.1 1 2\r\n",
        b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.4 +1 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.4 01 2\r\n",
        b"PROXY TCP4 1.2.3.4 1.2.3.4 65536 2\r\n",
        b"PROXY UDP4 1.2.3.4 1.2.3.4 1 2\r\n",
        b"PROXY TCP4 1.2.3.4\n",
    ] {
        assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
    let long = [b"PROXY ".as_slice(), &[b'A'; 200]].concat();
    assert_eq!(parse(&long), Err(Error::TooLong));
}

#[test]
fn v2_proxy_local_and_tlvs() {
    let mut body = vec![192, 0, 2, 7, 10, 0, 0, 1];
    body.extend_from_slice(&56324u16.to_be_bytes());
    body.extend_from_slice(&7443u16.to_be_bytes());
    // A TLV (type 0xEA, AWS VPC endpoint id), skipped.
    body.extend_from_slice(&[0xea, 0x00, 0x03, b'v', b'p', b'c']);
    let mut h = v2(1, 0x11, &body);
    let len = h.len();
    h.extend_from_slice(b"\x16\x03\x01 client hello");
    assert_eq!(
        parse(&h).unwrap(),
        Parse::Done {
            header: ProxyHeader::Proxied {
                source: sa("192.0.2.7:56324"),
                destination: sa("10.0.0.1:7443"),
            },
            len,
        }
    );
    for n in 1..len {
        assert_eq!(parse(&h[..n]).unwrap(), Parse::Incomplete, "{n}");
    }

    let mut body6 = Vec::new();
    body6.extend_from_slice(&"2001:db8::7".parse::<Ipv6Addr>().unwrap().octets());
    body6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
    body6.extend_from_slice(&[0, 80, 0, 81]);
    assert_eq!(
        parse(&v2(1, 0x21, &body6)).unwrap(),
        Parse::Done {
            header: ProxyHeader::Proxied {
                source: sa("[2001:db8::7]:80"),
                destination: sa("[::1]:81"),
            },
            len: 16 + 36,
        }
    );
    // LOCAL (health check), with or without addresses.
    assert_eq!(
        parse(&v2(0, 0x00, &[])).unwrap(),
        Parse::Done {
            header: ProxyHeader::Local,
            len: 16
        }
    );
    assert!(matches!(
        parse(&v2(0, 0x11, &body)).unwrap(),
        Parse::Done {
            header: ProxyHeader::Local,
            ..
        }
    ));
    assert!(matches!(
        parse(&v2(1, 0x00, &[])).unwrap(),
        Parse::Done {
            header: ProxyHeader::Unknown,
            ..
        }
    ));
}

#[test]
fn v2_errors() {
    assert_eq!(parse(&v2(1, 0x11, &[1, 2, 3])), Err(Error::V2Short));
    assert_eq!(parse(&v2(1, 0x21, &[0; 12])), Err(Error::V2Short));
    assert_eq!(parse(&v2(2, 0x11, &[0; 12])), Err(Error::V2Command(2)));
    assert_eq!(parse(&v2(1, 0x41, &[0; 12])), Err(Error::V2Family(0x41)));
    let mut bad_version = v2(1, 0x11, &[0; 12]);
    bad_version[12] = 0x11;
    assert_eq!(parse(&bad_version), Err(Error::V2Version(1)));
    let mut huge = v2(1, 0x11, &[]);
    huge[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
    assert_eq!(parse(&huge), Err(Error::TooLong));
}

#[test]
fn tls_and_http_are_not_proxy() {
    assert_eq!(parse(b"\x16\x03\x01\x02\x00").unwrap(), Parse::NotProxy);
    assert_eq!(parse(b"GET / HTTP/1.1\r\n").unwrap(), Parse::NotProxy);
    assert_eq!(parse(b"PRI * HTTP/2.0").unwrap(), Parse::NotProxy);
    assert_eq!(parse(b"PROXZ").unwrap(), Parse::NotProxy);
    assert_eq!(parse(b"").unwrap(), Parse::Incomplete);
}

proptest! {
    #[test]
    fn never_panics_and_len_is_in_bounds(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(Parse::Done { len, .. }) = parse(&bytes) {
            prop_assert!(len <= bytes.len());
        }
    }

    #[test]
    fn never_panics_after_a_signature(
        v in any::<bool>(),
        rest in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let sig: &[u8] = if v { V1_SIGNATURE } else { &V2_SIGNATURE };
        let bytes = [sig, &rest].concat();
        if let Ok(Parse::Done { len, .. }) = parse(&bytes) {
            prop_assert!(len <= bytes.len());
        }
    }

    #[test]
    fn v1_round_trip(a in any::<[u8; 4]>(), b in any::<[u8; 4]>(), p in any::<u16>(), q in any::<u16>()) {
        let (src, dst) = (Ipv4Addr::from(a), Ipv4Addr::from(b));
        let line = format!("PROXY TCP4 {src} {dst} {p} {q}\r\n");
        prop_assert_eq!(
            parse(line.as_bytes()).unwrap(),
            Parse::Done {
                header: ProxyHeader::Proxied {
                    source: SocketAddr::new(src.into(), p),
                    destination: SocketAddr::new(dst.into(), q),
                },
                len: line.len(),
            }
        );
    }
}
