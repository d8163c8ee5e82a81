//! Generates the `spinlink.v1` code from `proto/` with protox: no system
//! `protoc` is needed to build spinlink.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/spinlink/v1/tunnel.proto"];
    for file in &files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Debug is written by hand in lib.rs so tokens and kubeconfigs are
        // redacted.
        .skip_debug(["spinlink.v1.ChannelGrant", "spinlink.v1.AccountAssigned"])
        .compile_fds(descriptors)?;
    Ok(())
}
