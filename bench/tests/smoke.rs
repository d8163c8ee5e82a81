//! The benchmark entry points run end to end in a tiny mode, so they cannot
//! rot. Nothing here asserts on speed: only that each benchmark completes and
//! reports its figures.
//!
//! They drive the `spinlink` binary beside the benchmark binary in the target
//! directory, which `cargo nextest run --workspace` builds for the end-to-end
//! tests of `cli`.

use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_spinlink-bench");

fn bench(args: &[&str]) -> String {
    let spinlink = std::path::Path::new(BENCH).with_file_name("spinlink");
    assert!(
        spinlink.exists(),
        "{} is missing: build it with `cargo build -p spinlink` (or run the whole workspace)",
        spinlink.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BENCH)
        .arg("--dir")
        .arg(dir.path())
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "spinlink-bench {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn facade_list_runs_tiny() {
    let out = bench(&["facade-list", "--pods", "100", "--runs", "1"]);
    assert!(out.contains("ratio facade / direct"), "{out}");
    assert!(out.contains("- machine: "), "{out}");
}

#[test]
fn selector_latency_runs_tiny() {
    let out = bench(&["selector-latency", "--pods", "2000", "--requests", "20"]);
    assert!(out.contains("facade (sidecar cache): p50"), "{out}");
    assert!(
        out.contains("direct kube-sim (peer, same run): p50"),
        "{out}"
    );
}

#[test]
fn cache_memory_runs_tiny() {
    let out = bench(&["cache-memory", "--pods", "200"]);
    assert!(out.contains("× the JSON size"), "{out}");
    assert!(out.contains("RSS delta / gauge delta"), "{out}");
}

#[test]
fn grpc_proxy_runs_tiny() {
    // No peers: the backend directly and the gateway's agent path only.
    let out = bench(&[
        "grpc-proxy",
        "run",
        "--runs",
        "1",
        "--seconds",
        "0.3",
        "--bidi-streams",
        "4",
        "--latency-requests",
        "20",
        "--handshake-concurrency",
        "1",
        "--idle-conns",
        "10",
    ]);
    assert!(out.contains("| direct | "), "{out}");
    assert!(out.contains("| gateway | "), "{out}");
    assert!(out.contains("memory gateway: RSS"), "{out}");
}

#[test]
fn grpc_proxy_instructions_runs_tiny() {
    // The gateway alone under callgrind, a few messages: the count is read
    // from callgrind's own dumps, so a nonzero figure means the zero, the
    // dump and the parsing all worked.
    let out = bench(&[
        "grpc-proxy",
        "instructions",
        "--runs",
        "1",
        "--bidi-streams",
        "2",
        "--bidi-messages",
        "3",
        "--unary-inflight",
        "2",
        "--unary-requests",
        "3",
        "--conns",
        "1",
        "--handshakes",
        "3",
        "--handshake-concurrency",
        "1",
    ]);
    let row = |front: &str| {
        let row = out
            .lines()
            .find(|l| l.starts_with(&format!("| {front} | ")))
            .unwrap_or_else(|| panic!("no {front} row:\n{out}"));
        row.split('|')
            .skip(2)
            .take(3)
            .map(|c| c.trim().parse::<f64>().ok())
            .collect::<Vec<_>>()
    };
    // Per bidi message, per unary request, per new connection (a TLS
    // handshake with two ECDSA verifications is over a million).
    let gateway = row("gateway");
    assert!(
        gateway[..2].iter().all(|c| c.is_some_and(|c| c > 1000.0))
            && gateway[2].is_some_and(|c| c > 1e6),
        "{gateway:?}"
    );
    // The backend's own TLS port: new connections only.
    let direct = row("direct");
    assert!(
        direct[..2] == [None, None] && direct[2].is_some_and(|c| c > 1e6),
        "{direct:?}"
    );
}

#[test]
fn hostile_runs_tiny() {
    // No peers: the gateway alone, two floods of a second each. Its answer
    // to a rapid reset is part of what the bench reports, so it is checked.
    let out = bench(&[
        "hostile",
        "--seconds",
        "1",
        "--attackers",
        "2",
        "--floods",
        "rapid-reset,idle-connections",
    ]);
    let row = |flood: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("| {flood} | gateway | ")))
            .unwrap_or_else(|| panic!("no {flood} row for the gateway:\n{out}"))
            .to_owned()
    };
    assert!(row("rapid-reset").contains("ENHANCE_YOUR_CALM"), "{out}");
    assert!(row("idle-connections").contains(" / "), "{out}");
    assert!(out.contains("- rapid-reset: gateway peak +"), "{out}");
}

#[test]
fn agent_storm_runs_tiny() {
    // 20 simulated agents: every one online, a gateway SIGKILLed and
    // restarted and then drained, and every agent it carried back each time
    // (the bench fails otherwise).
    let out = bench(&[
        "agent-storm",
        "--agents",
        "20",
        "--identities",
        "2",
        "--runs",
        "1",
        "--ramp",
        "0.5",
        "--settle",
        "0",
        // Accounts that land on another sidecar wait out the old owner's
        // lease: a short one keeps the test short.
        "--lease-seconds",
        "3",
    ]);
    assert!(
        out.contains("Medians of 1 run(s): all 20 online in"),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("| 1 | "))
        .unwrap_or_else(|| panic!("no row for run 1:\n{out}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // | run | online | failed | RSS | cut | back | agents' view | failed | refusals | moved | ...
    let cut: usize = cells[5].parse().unwrap();
    let moved: usize = cells[10].parse().unwrap();
    assert!(cut > 0 && cut <= 20, "{row}");
    assert!(moved > 0 && moved <= 20, "{row}");
    assert!(out.contains("- machine: "), "{out}");
}
