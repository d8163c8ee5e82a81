//! Certificate hot reload on the agent listener: files swapped on disk the
//! way Kubernetes updates a mounted Secret (the `..data` symlink moved
//! atomically) are served to the next connection, while a connection made
//! before keeps working; a bad new file is refused and the old certificate
//! stays in service (with a log line); the expiry is exported. A rotated
//! client CA bundle decides who the next handshakes admit, while connections
//! made under the old one keep their streams.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rustls::pki_types::CertificateDer;
use spinlink_gateway::stats::Stats;
use spinlink_gateway::stats::metrics::ResultLabel;
use spinlink_tls::dev::{DevCa, Leaf};
use tokio::net::TcpStream;

/// Writes one Secret "version" directory and points `..data` at it
/// atomically (new symlink, then rename over the old one), as the kubelet does.
fn publish(mount: &Path, version: &str, cert: &[u8], key: &[u8], ca: &[u8]) {
    let dir = mount.join(version);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
    std::fs::write(dir.join("tls.key"), key).unwrap();
    std::fs::write(dir.join("ca.crt"), ca).unwrap();
    let tmp = mount.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, mount.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key", "ca.crt"] {
        let link = mount.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
        }
    }
}

/// A gateway reading its TLS files from the Secret mounted at `mount`,
/// checking them every second, carrying to `sidecar`.
fn mounted_gateway_yaml(mount: &Path, sidecar: &FakeSidecar) -> String {
    format!(
        "gatewayId: gw-test\nlisten: 127.0.0.1:0\n\
         tls:\n  certFile: {m}/tls.crt\n  keyFile: {m}/tls.key\n  clientCaFile: {m}/ca.crt\n  reloadIntervalSeconds: 1\n\
         policy:\n  - identities: ['spiffe://spinlink.dev/agent/*']\n    accounts: ['dev-*']\n\
         upstreams: [{{url: '{}'}}]\n",
        sidecar.url(),
        m = mount.display(),
    )
}

async fn served_cert(addr: std::net::SocketAddr, pki: &spinlink_tls::dev::DevPki) -> Vec<u8> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = agent_tls_over(tcp, pki, "agent-a1").await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0]
        .as_ref()
        .to_vec()
}

fn der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec()
}

/// A DER certificate's notAfter, Unix seconds.
fn not_after(der: &[u8]) -> i64 {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.validity().not_after.timestamp()
}

async fn wait_reloads(stats: &Arc<Stats>, result: &'static str, n: u64) {
    let label = ResultLabel { result };
    tokio::time::timeout(
        WAIT,
        stats.wait_until(|s| s.metrics().cert_reloads.get(&label).map_or(0, |c| c.get()) >= n),
    )
    .await
    .unwrap_or_else(|_| panic!("no {n} {result} reloads"));
}

#[tokio::test]
async fn rotated_certificate_reaches_new_connections_and_old_ones_survive() {
    capture_logs();
    let pki = pki();
    let mount = pki.dir.path().join("secret");
    let read = |p: std::path::PathBuf| std::fs::read(p).unwrap();
    let ca_pem = read(pki.pki.ca_cert());
    publish(
        &mount,
        "..v1",
        &read(pki.pki.cert("gateway")),
        &read(pki.pki.key("gateway")),
        &ca_pem,
    );

    let sidecar = FakeSidecar::plain().await;
    let gw = start_gateway(&mounted_gateway_yaml(&mount, &sidecar)).await;
    let expiry = gw.stats.metrics().cert_expiry.get();
    assert!(
        expiry > 86_400.0,
        "certificate expiry not exported: {expiry}"
    );
    let not_after_v1 = gw.stats.metrics().cert_not_after.get();
    assert!(not_after_v1 > 1_700_000_000, "{not_after_v1}");

    let v1 = served_cert(gw.addr, &pki.pki).await;
    assert_eq!(
        v1,
        der(&String::from_utf8(read(pki.pki.cert("gateway"))).unwrap())
    );
    // A connection with a stream open across the rotation.
    let old = agent_a1(gw.addr, &pki.pki).await;
    let token = token_for(&old, "dev-1").await;
    let (tx, mut down) = acked_cache(&old, "dev-1", &token).await;

    // Rotate: a new certificate and key from the same CA, valid for two days
    // instead of the first one's ninety, swapped in atomically.
    let ca = DevCa::load(&pki.pki.dir).unwrap();
    let issued = ca
        .issue(
            &Leaf::server("gateway-rotated")
                .with_dns("localhost")
                .with_validity(Duration::from_secs(2 * 86_400)),
        )
        .unwrap();
    publish(
        &mount,
        "..v2",
        issued.cert_pem.as_bytes(),
        issued.key_pem.as_bytes(),
        &ca_pem,
    );
    wait_reloads(&gw.stats, "ok", 1).await;
    let v2 = served_cert(gw.addr, &pki.pki).await;
    assert_eq!(v2, der(&issued.cert_pem));
    // The exported expiry is the new certificate's, to the second.
    let not_after_v2 = not_after(&v2);
    assert_eq!(not_after_v1, not_after(&v1));
    assert_ne!(not_after_v2, not_after_v1);
    assert_eq!(gw.stats.metrics().cert_not_after.get(), not_after_v2);
    let left = gw.stats.metrics().cert_expiry.get();
    assert!(
        left > 86_400.0 && left <= 2.0 * 86_400.0,
        "expiry after the rotation: {left}"
    );
    assert_ne!(v1, v2);

    // The old connection and its stream carry on, and it can still say Hello.
    tx.send(spinlink_proto::v1::CacheUp { seq: 2, msg: None })
        .await
        .unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 2);
    token_for(&old, "dev-2").await;

    // A broken rotation (garbage certificate) is refused; v2 stays in service.
    publish(
        &mount,
        "..v3",
        b"-----BEGIN CERTIFICATE-----\ngarbage\n",
        issued.key_pem.as_bytes(),
        &ca_pem,
    );
    wait_reloads(&gw.stats, "failed", 1).await;
    wait_log_line(&[
        "ERROR",
        "new TLS files refused",
        "still serving the previous certificate",
    ])
    .await;
    assert_eq!(served_cert(gw.addr, &pki.pki).await, v2);
    token_for(&old, "dev-3").await;
}

async fn wait_handshake_failures(stats: &Stats, n: u64) {
    tokio::time::timeout(WAIT, stats.wait_for(|s| s.handshake_failures >= n))
        .await
        .unwrap_or_else(|_| panic!("no {n} failed handshakes"));
}

/// Whether an agent presenting `cert`/`key` gets through a new connection's
/// handshake and a `Hello`.
async fn admitted(
    addr: std::net::SocketAddr,
    pki: &spinlink_tls::dev::DevPki,
    cert: &Path,
    key: &Path,
    account: &str,
) -> bool {
    match agent_channel(addr, pki, Some((cert, key))).await {
        // With TLS 1.3 the client learns of a refused certificate on its
        // first read: the `Hello`.
        Ok(channel) => hello(&channel, &[account])
            .await
            .is_ok_and(|r| r.granted.len() == 1),
        Err(_) => false,
    }
}

#[tokio::test]
async fn rotated_client_ca_decides_the_next_handshakes_and_old_streams_survive() {
    let pki = pki();
    let mount = pki.dir.path().join("secret");
    let read = |p: std::path::PathBuf| std::fs::read(p).unwrap();
    let (cert, key) = (read(pki.pki.cert("gateway")), read(pki.pki.key("gateway")));
    publish(&mount, "..v1", &cert, &key, &read(pki.pki.ca_cert()));

    // An agent whose certificate comes from a new CA, same identity.
    let new_ca = DevCa::generate("rotated agent CA").unwrap();
    let (new_cert, new_key) = new_ca
        .issue(&Leaf::client("agent-a1").with_uri(A1))
        .unwrap()
        .write(pki.dir.path(), "agent-new-ca")
        .unwrap();
    let (old_cert, old_key) = (pki.pki.cert("agent-a1"), pki.pki.key("agent-a1"));

    let sidecar = FakeSidecar::plain().await;
    let gw = start_gateway(&mounted_gateway_yaml(&mount, &sidecar)).await;
    assert!(!admitted(gw.addr, &pki.pki, &new_cert, &new_key, "dev-1").await);
    wait_handshake_failures(&gw.stats, 1).await;

    // An old-CA agent with a stream open across the rotation.
    let old = agent_a1(gw.addr, &pki.pki).await;
    let token = token_for(&old, "dev-1").await;
    let (tx, mut down) = acked_cache(&old, "dev-1", &token).await;

    // The bundle now holds the new CA only.
    publish(&mount, "..v2", &cert, &key, new_ca.cert_pem().as_bytes());
    wait_reloads(&gw.stats, "ok", 1).await;
    assert!(admitted(gw.addr, &pki.pki, &new_cert, &new_key, "dev-2").await);
    assert!(!admitted(gw.addr, &pki.pki, &old_cert, &old_key, "dev-3").await);
    wait_handshake_failures(&gw.stats, 2).await;

    // The connection made under the old bundle keeps its stream.
    tx.send(spinlink_proto::v1::CacheUp { seq: 2, msg: None })
        .await
        .unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 2);
}
