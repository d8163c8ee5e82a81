//! Embeds the discovery and OpenAPI fixtures so the binary serves them from anywhere.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("fixtures directory is readable")
        .map(|e| e.expect("fixture entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(root, &path, out);
        } else {
            let rel = path
                .strip_prefix(root)
                .expect("fixture under root")
                .to_string_lossy()
                .replace('\\', "/");
            out.push((rel, path));
        }
    }
}

fn main() {
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("fixtures");
    println!("cargo:rerun-if-changed=fixtures/discovery");
    println!("cargo:rerun-if-changed=fixtures/openapi");
    let mut files = Vec::new();
    for sub in ["discovery", "openapi"] {
        walk(&root, &root.join(sub), &mut files);
    }
    let mut src = String::from(
        "/// Embedded fixture files: (path under `fixtures/`, bytes).\npub(crate) static FILES: &[(&str, &[u8])] = &[\n",
    );
    for (rel, path) in files {
        writeln!(
            src,
            "    ({rel:?}, include_bytes!({:?})),",
            path.display().to_string()
        )
        .unwrap();
    }
    src.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("out dir")).join("fixtures.rs");
    std::fs::write(out, src).expect("write fixtures.rs");
}
