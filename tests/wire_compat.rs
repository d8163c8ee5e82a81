//! Wire compatibility of `spinlink.v1` with the released protocol
//! (`proto/released/`): `buf breaking` with the `WIRE` rules passes for the
//! current protocol, and fails for each kind of change an older agent,
//! gateway or sidecar would misread — a field renumbered, a field retyped, a
//! field removed without reserving its number — while a removal that
//! reserves the number passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `buf`, from `SPINLINK_BUF` or the PATH; the suite needs it (`.ci/run`
/// installs it), so its absence fails rather than skips.
fn buf(args: &[&str], dir: &Path) -> Output {
    let bin = std::env::var("SPINLINK_BUF").unwrap_or_else(|_| "buf".into());
    Command::new(&bin)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("running {bin}: {e}; install it with `npm install -g @bufbuild/buf@1.75.0`")
        })
}

/// `buf breaking` of the module in `module` against the released image.
fn breaking(module: &Path) -> Output {
    let released = root().join("proto/released/spinlink.v1.binpb");
    buf(
        &["breaking", ".", "--against", released.to_str().unwrap()],
        module,
    )
}

/// A copy of the current module with `edit` applied to `tunnel.proto`.
fn edited(edit: impl FnOnce(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let from = root().join("proto/proto");
    std::fs::create_dir_all(dir.path().join("spinlink/v1")).unwrap();
    std::fs::copy(from.join("buf.yaml"), dir.path().join("buf.yaml")).unwrap();
    let proto = std::fs::read_to_string(from.join("spinlink/v1/tunnel.proto")).unwrap();
    let changed = edit(proto.clone());
    assert_ne!(changed, proto, "the edit changed nothing");
    std::fs::write(dir.path().join("spinlink/v1/tunnel.proto"), changed).unwrap();
    dir
}

/// `proto` with `from` replaced by `to` once, inside `message`.
fn in_message(proto: String, message: &str, from: &str, to: &str) -> String {
    let start = proto
        .find(&format!("message {message} {{"))
        .unwrap_or_else(|| panic!("no message {message}"));
    let at = start
        + proto[start..]
            .find(from)
            .unwrap_or_else(|| panic!("no {from:?} in {message}"));
    format!("{}{to}{}", &proto[..at], &proto[at + from.len()..])
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_current_protocol_is_wire_compatible_with_the_released_one() {
    let out = breaking(&root().join("proto/proto"));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn incompatible_changes_fail_the_check() {
    for (what, edit, named) in [
        (
            "renumbered",
            Box::new(|p| in_message(p, "CacheOpen", "string account = 1;", "string account = 9;"))
                as Box<dyn FnOnce(String) -> String>,
            "\"account\"",
        ),
        (
            "retyped",
            Box::new(|p| {
                in_message(
                    p,
                    "CacheOpen",
                    "string agent_id = 2;",
                    "int64 agent_id = 2;",
                )
            }),
            "\"agent_id\"",
        ),
        (
            "removed without reserving its number",
            Box::new(|p| in_message(p, "CacheOpen", "string ca_fingerprint = 3;", "")),
            "\"ca_fingerprint\"",
        ),
    ] {
        let module = edited(edit);
        let out = breaking(module.path());
        assert!(!out.status.success(), "{what}: passed\n{}", text(&out));
        assert!(text(&out).contains(named), "{what}: {}", text(&out));
    }
}

#[test]
fn a_removal_that_reserves_the_number_passes() {
    let module = edited(|p| {
        in_message(
            p,
            "CacheOpen",
            "string ca_fingerprint = 3;",
            "reserved 3;\n  reserved \"ca_fingerprint\";",
        )
    });
    let out = breaking(module.path());
    assert!(out.status.success(), "{}", text(&out));
}
