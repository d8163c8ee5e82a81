//! Runs kube-sim with the demo workload on a loopback port and writes a kubeconfig.
//!
//! `cargo run -p spinlink-kube-sim --example serve -- [PORT] [KUBECONFIG] [MINOR|recorded]`

use std::net::SocketAddr;

use spinlink_kube_sim::{Server, Sim, SimConfig, write_kubeconfig};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().map(|p| p.parse()).transpose()?.unwrap_or(0);
    let kubeconfig = args
        .next()
        .unwrap_or_else(|| "/tmp/kube-sim.kubeconfig".into());
    let minor = match args.next().as_deref() {
        None => SimConfig::default().reported_minor,
        Some("recorded") => None,
        Some(m) => Some(m.parse()?),
    };
    let sim = Sim::with_config(SimConfig::default().reported_minor(minor));
    sim.add_demo_workload();
    let server = Server::bind(sim, SocketAddr::from(([127, 0, 0, 1], port)), None).await?;
    write_kubeconfig(kubeconfig.as_ref(), &server.url(), "kube-sim", None)?;
    println!("{} {kubeconfig}", server.url());
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    server.run(shutdown).await?;
    Ok(())
}
