//! Generates the released `spinlink.v1` client from the descriptor set of the
//! release (`proto/released/spinlink.v1.binpb`), never from today's
//! `tunnel.proto`: the types know only the fields that release knew.

use prost::Message as _;

const RELEASED: &str = "../proto/released/spinlink.v1.binpb";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={RELEASED}");
    // A buf image is a FileDescriptorSet on the wire (its `file` is field 1);
    // buf's own extra fields are skipped as unknown.
    let image = std::fs::read(RELEASED)?;
    let descriptors = tonic_prost_build::FileDescriptorSet::decode(image.as_slice())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(descriptors)?;
    Ok(())
}
