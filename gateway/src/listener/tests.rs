use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;

use super::*;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

async fn read(bytes: &[u8], peer: &str, required: bool) -> ProxyOutcome {
    let trusted = [Cidr::parse("10.0.0.0/8").unwrap()];
    let (mut a, mut b) = tokio::io::duplex(4096);
    b.write_all(bytes).await.unwrap();
    drop(b);
    read_proxy_header(&mut a, addr(peer), &trusted, required).await
}

#[tokio::test]
async fn trusted_v1_header_names_the_client_and_keeps_the_rest() {
    let (rest, client) = read(
        b"PROXY TCP4 203.0.113.7 10.0.0.1 51000 7443\r\n\x16\x03\x01",
        "10.1.2.3:4000",
        true,
    )
    .await
    .unwrap();
    assert_eq!(client, addr("203.0.113.7:51000"));
    assert_eq!(&rest[..], b"\x16\x03\x01");
}

#[tokio::test]
async fn untrusted_or_missing_headers_are_refused_by_reason() {
    let v1 = b"PROXY TCP4 203.0.113.7 10.0.0.1 51000 7443\r\n";
    assert_eq!(
        read(v1, "192.0.2.1:1", false).await.unwrap_err(),
        Some(Refusal::UntrustedProxy)
    );
    assert_eq!(
        read(b"\x16\x03\x01", "192.0.2.1:1", true)
            .await
            .unwrap_err(),
        Some(Refusal::UntrustedSource)
    );
    assert_eq!(
        read(b"\x16\x03\x01", "10.0.0.9:1", true).await.unwrap_err(),
        Some(Refusal::ProxyHeaderMissing)
    );
    assert_eq!(
        read(b"PROXY TCP4 nonsense\r\n", "10.0.0.9:1", true)
            .await
            .unwrap_err(),
        Some(Refusal::ProxyHeaderInvalid)
    );
    // Closed before a byte: a TCP health check, not a refusal.
    assert_eq!(read(b"", "10.0.0.9:1", true).await.unwrap_err(), None);
}

#[tokio::test]
async fn direct_clients_pass_unchanged_when_not_required() {
    let (rest, client) = read(b"\x16\x03\x01abc", "192.0.2.1:1", false)
        .await
        .unwrap();
    assert_eq!(client, addr("192.0.2.1:1"));
    assert_eq!(&rest[..], b"\x16\x03\x01abc");
}

#[test]
fn max_age_jitter_stays_in_its_band() {
    let m = MaxAge {
        age: Duration::from_secs(100),
        jitter_percent: 10,
        grace: Duration::ZERO,
    };
    let picks: Vec<_> = (0..200).map(|_| m.pick().as_secs_f64()).collect();
    assert!(
        picks.iter().all(|p| (90.0..=110.0).contains(p)),
        "{picks:?}"
    );
    // Spread, not one value for every connection.
    assert!(picks.iter().any(|p| (*p - picks[0]).abs() > 0.5));
}
