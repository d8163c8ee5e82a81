//! Certificate hot reload on the agent listener: files swapped on disk the
//! way Kubernetes updates a mounted Secret (the `..data` symlink moved
//! atomically) are served to the next connection, while a connection made
//! before keeps working; a bad new file is refused and the old certificate
//! stays in service; the expiry is exported.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use rustls::pki_types::CertificateDer;
use spinlink_gateway::admin::Stats;
use spinlink_gateway::admin::metrics::ResultLabel;
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
    let yaml = format!(
        "gatewayId: gw-test\nlisten: 127.0.0.1:0\n\
         tls:\n  certFile: {m}/tls.crt\n  keyFile: {m}/tls.key\n  clientCaFile: {m}/ca.crt\n  reloadIntervalSeconds: 1\n\
         policy:\n  - identities: ['spiffe://spinlink.dev/agent/*']\n    accounts: ['dev-*']\n\
         upstreams: [{{url: '{}'}}]\n",
        sidecar.url(),
        m = mount.display(),
    );
    let gw = start_gateway(&yaml).await;
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
    let (tx, mut down) = open_cache(&old, |s| with_metadata(s, "dev-1", &token))
        .await
        .unwrap();
    assert_eq!(next_ack(&mut down).await.unwrap(), 1);

    // Rotate: a new certificate and key from the same CA, swapped in atomically.
    let ca = DevCa::load(&pki.pki.dir).unwrap();
    let issued = ca
        .issue(&Leaf::server("gateway-rotated").with_dns("localhost"))
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
    // The exported notAfter is the new certificate's (issued later, so not earlier).
    assert!(gw.stats.metrics().cert_not_after.get() >= not_after_v1);
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
    assert_eq!(served_cert(gw.addr, &pki.pki).await, v2);
    token_for(&old, "dev-3").await;
}
