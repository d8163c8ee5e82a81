//! Compiles the vendored Kubernetes schemas (`proto/k8s.io`, see
//! `proto/vendor.py`) into one descriptor set with protox (no system
//! `protoc`), without comments, for [`crate::protobuf`] to read at run time.

use std::path::{Path, PathBuf};

use prost::Message;

fn protos(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("proto directory is readable")
        .map(|e| e.expect("proto entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            protos(&path, out);
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!("cargo:rerun-if-changed=proto");
    let mut files = Vec::new();
    protos(&root.join("k8s.io"), &mut files);
    let mut set = protox::compile(&files, [&root])?;
    for file in &mut set.file {
        file.source_code_info = None;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("k8s.fds");
    std::fs::write(out, set.encode_to_vec())?;
    Ok(())
}
