//! The same files through real nginx (`nginx -t`) and through this crate:
//! both accept, or both refuse with the same message and `file:line`.
//! Covers the tokenizer rules and the errors whose wording is nginx's.
//! Needs Debian's nginx (`apt-get install -y nginx`; `.ci/run` installs it):
//! without it these tests fail and say so, rather than pass having checked
//! nothing.
//!
//! Cases stay clear of what nginx checks and this crate leaves to the
//! gateway (certificate files that load, host names that resolve), and of
//! the documented differences (README "Where this differs").

use std::path::Path;
use std::process::Command;

use spinlink_nginx_compat::{Options, load};

/// Fails the test, saying what to install, when nginx is missing.
fn require_nginx() {
    assert!(
        Command::new("nginx").arg("-v").output().is_ok(),
        "nginx is not installed: the differential tests compare this crate with it \
         (apt-get install -y nginx; .ci/run installs it)"
    );
}

/// What `nginx -t` said: `Ok(warnings)` or `Err(first emerg message)`.
fn nginx_t(dir: &Path, file: &Path) -> Result<Vec<String>, String> {
    let out = Command::new("nginx")
        .args(["-t", "-e", "stderr", "-p"])
        .arg(dir)
        .arg("-c")
        .arg(file)
        .output()
        .expect("run nginx");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // "2026/11/23 11:01:23 [emerg] 32074#32074: message in file:line"
    let message = |line: &str| {
        line.split_once('#')
            .and_then(|(_, r)| r.split_once(": "))
            .map(|(_, m)| m.to_string())
    };
    if let Some(line) = stderr.lines().find(|l| l.contains("[emerg]")) {
        return Err(message(line).unwrap_or_else(|| line.to_string()));
    }
    assert!(
        out.status.success(),
        "nginx -t failed without [emerg]: {stderr}"
    );
    Ok(stderr
        .lines()
        .filter(|l| l.contains("[warn]"))
        .filter_map(message)
        .collect())
}

const E: &str = "events {}\n";

fn cases() -> Vec<(&'static str, String)> {
    let long = "x".repeat(5000);
    vec![
        // Tokenizer.
        (
            "comments, quotes, escapes",
            format!(
                "{E}# c\nworker_processes \"1\" ; # trailing\nhttp {{ server {{ listen 8080; server_name 'a b' \"c\\\"d\" e#f; location / {{ proxy_set_header X-A \"\\t\"; proxy_pass http://127.0.0.1:1; }} }} }}"
            ),
        ),
        (
            "a directive across lines with a comment",
            format!("{E}worker_processes\n 1 #c\n;"),
        ),
        (
            "text after a closing quote",
            format!("{E}worker_processes \"1\"c;"),
        ),
        ("stray semicolon", format!("{E}\n;")),
        ("stray brace", format!("{E}{{}}")),
        ("unbalanced close", format!("{E}}}")),
        (
            "close inside a statement",
            format!("{E}worker_processes 1 }}"),
        ),
        ("unclosed block", format!("{E}http {{\n")),
        ("unterminated statement", format!("{E}worker_processes 1")),
        ("unterminated quote", format!("{E}worker_processes \"1;\n")),
        ("too long word", format!("{E}worker_processes {long};")),
        (
            "too long comment",
            format!("{E}#{long}\nworker_processes 1;"),
        ),
        ("too long quoted", format!("{E}worker_processes \"{long};")),
        // Directive table.
        (
            "unknown directive",
            format!("{E}http {{ server {{ listen 8080; location / {{ foo_bar 1; }} }} }}"),
        ),
        ("not allowed here", format!("{E}http {{ listen 8080; }}")),
        (
            "argument count",
            format!("{E}http {{ server {{ listen; }} }}"),
        ),
        ("block without brace", format!("{E}http;")),
        (
            "brace on a simple directive",
            format!("{E}http {{ server {{ listen 8080 {{ }} }} }}"),
        ),
        ("bad flag", format!("{E}http {{ sendfile maybe; }}")),
        ("duplicate events", format!("{E}events {{}}")),
        ("missing events", "worker_processes 1;".to_string()),
        // Values.
        (
            "time with a space",
            format!(
                "{E}http {{ server {{ listen 8080; location / {{ proxy_read_timeout \"1 2\"; proxy_pass http://127.0.0.1:1; }} }} }}"
            ),
        ),
        ("bad time", format!("{E}http {{ proxy_read_timeout 1y; }}")),
        (
            "bad size",
            format!("{E}http {{ client_max_body_size 1x; }}"),
        ),
        (
            "duplicate timeout",
            format!("{E}http {{ proxy_read_timeout 5s; proxy_read_timeout 6s; }}"),
        ),
        ("bad port", format!("{E}http {{ server {{ listen 0; }} }}")),
        (
            "bad listen parameter",
            format!("{E}http {{ server {{ listen 8080 bogus; }} }}"),
        ),
        (
            "bad verify mode",
            format!("{E}http {{ server {{ listen 8080; ssl_verify_client maybe; }} }}"),
        ),
        (
            "bad protocol",
            format!("{E}http {{ ssl_protocols TLSv9; }}"),
        ),
        (
            "bad cidr",
            format!("{E}http {{ set_real_ip_from 10.0.0.0/99; }}"),
        ),
        (
            "real ip ok",
            format!(
                "{E}http {{ set_real_ip_from 10.0.0.0/8; real_ip_header proxy_protocol; server {{ listen 8080 proxy_protocol; }} }}"
            ),
        ),
        // Locations and passes.
        (
            "bad modifier",
            format!("{E}http {{ server {{ listen 8080; location ~~ /a {{ }} }} }}"),
        ),
        (
            "duplicate location",
            format!("{E}http {{ server {{ listen 8080; location / {{ }} location / {{ }} }} }}"),
        ),
        (
            "outside location",
            format!("{E}http {{ server {{ listen 8080; location /a {{ location /b {{ }} }} }} }}"),
        ),
        (
            "inside exact",
            format!(
                "{E}http {{ server {{ listen 8080; location = /a {{ location /a/b {{ }} }} }} }}"
            ),
        ),
        (
            "grpc without port",
            format!(
                "{E}http {{ server {{ listen 8080; location / {{ grpc_pass grpc://127.0.0.1; }} }} }}"
            ),
        ),
        (
            "upstream with port",
            format!(
                "{E}http {{ upstream u {{ server 127.0.0.1:1; }} server {{ listen 8080; location / {{ proxy_pass http://u:80; }} }} }}"
            ),
        ),
        (
            "bad url prefix",
            format!("{E}http {{ server {{ listen 8080; location / {{ proxy_pass foo; }} }} }}"),
        ),
        (
            "duplicate proxy_pass",
            format!(
                "{E}http {{ server {{ listen 8080; location / {{ proxy_pass http://127.0.0.1:1; proxy_pass http://127.0.0.1:2; }} }} }}"
            ),
        ),
        ("empty upstream", format!("{E}http {{ upstream u {{ }} }}")),
        (
            "upstream params",
            format!(
                "{E}http {{ upstream u {{ server 127.0.0.1:1 weight=2 max_fails=3 fail_timeout=5s backup; server 127.0.0.1:2 down; }} server {{ listen 8080; location / {{ proxy_pass http://u; }} }} }}"
            ),
        ),
        // TLS to upstreams.
        (
            "upstream tls settings",
            format!(
                "{E}http {{ proxy_ssl_server_name on; server {{ listen 8080; location / {{ proxy_pass https://127.0.0.1:1; proxy_ssl_name gate.internal; proxy_ssl_verify off; }} location /g {{ grpc_pass grpcs://127.0.0.1:2; grpc_ssl_server_name on; }} }} }}"
            ),
        ),
        (
            "upstream verify without trusted certificate",
            format!(
                "{E}http {{ server {{ listen 8080; location / {{ proxy_ssl_verify on; proxy_pass https://127.0.0.1:1; }} }} }}"
            ),
        ),
        (
            "grpc upstream verify without trusted certificate",
            format!(
                "{E}http {{ grpc_ssl_verify on; server {{ listen 8080; location / {{ grpc_pass grpcs://127.0.0.1:1; }} }} }}"
            ),
        ),
        (
            "duplicate upstream verify",
            format!("{E}http {{ proxy_ssl_verify on; proxy_ssl_verify off; }}"),
        ),
        (
            "bad upstream verify flag",
            format!("{E}http {{ proxy_ssl_verify maybe; }}"),
        ),
        // Servers.
        (
            "ssl without certificate",
            format!("{E}http {{ server {{ listen 8080 ssl; }} }}"),
        ),
        (
            "duplicate default server",
            format!(
                "{E}http {{ server {{ listen 8080 default_server; }} server {{ listen 8080 default_server; }} }}"
            ),
        ),
        (
            "conflicting names warn",
            format!(
                "{E}http {{ server {{ listen 8080; server_name a; }} server {{ listen 8080; server_name a; }} }}"
            ),
        ),
        // A bad wildcard is refused by both, but nginx names the address
        // ("… on 0.0.0.0:8080") where this crate names file:line.
        // More accepted forms.
        (
            "quoted directive name and odd listens",
            format!(
                "{E}http {{ server {{ \"listen\" *:8080; listen localhost:8081; server_name \"\"; location = {{ }} location ^~/b {{ }} location =/c {{ }} }} }}"
            ),
        ),
        (
            "nested location with its parent's path",
            format!("{E}http {{ server {{ listen 8080; location /a {{ location /a {{ }} }} }} }}"),
        ),
        (
            "uri and query in proxy_pass",
            format!(
                "{E}http {{ server {{ listen 8080; location / {{ proxy_pass http://127.0.0.1:1/x?y; }} }} }}"
            ),
        ),
        (
            "grpc_pass without scheme",
            format!(
                "{E}http {{ server {{ listen 8080; location / {{ grpc_pass 127.0.0.1:1; grpc_set_header A b; grpc_read_timeout 1h30m; }} }} }}"
            ),
        ),
        (
            "case-insensitive values",
            format!(
                "{E}http {{ ssl_protocols tlsv1.2 TLSV1.3; client_max_body_size 10M; sendfile ON; server {{ listen 8080; ssl_verify_client OFF; }} }}"
            ),
        ),
        (
            "weight zero",
            format!("{E}http {{ upstream u {{ server 127.0.0.1:1 weight=0; }} }}"),
        ),
        ("bad include pattern", format!("{E}http {{ include [; }}")),
        // Includes.
        (
            "missing include",
            format!("{E}http {{ include missing.conf; }}"),
        ),
        (
            "glob with no match",
            format!("{E}http {{ include missing/*.conf; }}"),
        ),
    ]
}

#[test]
fn nginx_knows_every_directive_said_to_be_outside_the_subset() {
    require_nginx();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nginx.conf");
    let mut unknown = Vec::new();
    // `stream` is a dynamic module in Debian's nginx (libnginx-mod-stream),
    // unknown until it is loaded.
    let dynamic = ["stream"];
    for name in spinlink_nginx_compat::directives::outside_subset_names() {
        // Wrong arguments or place, most of them: any complaint but
        // "unknown directive" shows nginx knows the name.
        std::fs::write(
            &file,
            format!("events {{}}\nhttp {{ server {{ location / {{ {name} x; }} }} }}\n"),
        )
        .unwrap();
        if let Err(e) = nginx_t(dir.path(), &file)
            && e.starts_with("unknown directive")
            && !dynamic.contains(&name)
        {
            unknown.push(e);
        }
        let ours = spinlink_nginx_compat::parse_str(
            &std::fs::read_to_string(&file).unwrap(),
            "nginx.conf",
            &Options::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(ours.contains("outside the subset"), "{name}: {ours}");
    }
    assert!(unknown.is_empty(), "{unknown:?}");
}

#[test]
fn nginx_and_this_crate_agree() {
    require_nginx();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nginx.conf");
    let mut disagreements = Vec::new();
    let cases = cases();
    for (name, src) in &cases {
        std::fs::write(&file, src).unwrap();
        let theirs = nginx_t(dir.path(), &file);
        let ours = load(&file, &Options::new())
            .map(|p| {
                p.warnings
                    .into_iter()
                    .map(|w| w.message)
                    .collect::<Vec<_>>()
            })
            .map_err(|e| e.to_string());
        // nginx reports errors it finds while merging a location (after
        // parsing) without a place; this crate names the location's line.
        let placed_by_us = matches!(
            (&theirs, &ours),
            (Err(t), Err(o)) if !t.contains(" in ")
                && o.strip_prefix(t.as_str()).is_some_and(|rest| rest.starts_with(" in "))
        );
        if theirs != ours && !placed_by_us {
            disagreements.push(format!("{name}:\n  nginx: {theirs:?}\n  ours:  {ours:?}"));
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} cases differ:\n{}",
        disagreements.len(),
        cases.len(),
        disagreements.join("\n")
    );
}

/// Copies `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// The documented example, with throwaway certificates where it names
/// them: nginx accepts it, and so does this crate, with no warning.
#[test]
fn nginx_accepts_the_spinnaker_example() {
    require_nginx();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spinnaker");
    copy_dir(&fixture, dir.path()).unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    for name in ["spinnaker", "agents", "clients-ca", "agents-ca"] {
        let ck = rcgen::generate_simple_self_signed(vec![format!("{name}.example.com")]).unwrap();
        std::fs::write(certs.join(format!("{name}.crt")), ck.cert.pem()).unwrap();
        std::fs::write(
            certs.join(format!("{name}.key")),
            ck.signing_key.serialize_pem(),
        )
        .unwrap();
    }
    let main = dir.path().join("nginx.conf");
    assert_eq!(nginx_t(dir.path(), &main), Ok(vec![]));
    let parsed = load(&main, &Options::new()).unwrap();
    assert_eq!(parsed.warnings, vec![]);
    assert_eq!(parsed.ingress.servers.len(), 3);
}

/// TLS checks nginx makes once certificates load.
#[test]
fn nginx_and_this_crate_agree_on_tls_settings() {
    require_nginx();
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["a.example.com".to_string()]).unwrap();
    std::fs::write(dir.path().join("a.crt"), ck.cert.pem()).unwrap();
    std::fs::write(dir.path().join("a.key"), ck.signing_key.serialize_pem()).unwrap();
    let file = dir.path().join("nginx.conf");
    let cases = [
        "listen 8443 ssl; ssl_certificate a.crt; ssl_certificate_key a.key;",
        "listen 8443 ssl; ssl_certificate a.crt;",
        "listen 8443 ssl; ssl_certificate a.crt; ssl_certificate_key a.key; ssl_verify_client on;",
        "listen 8443 ssl; ssl_certificate a.crt; ssl_certificate_key a.key; ssl_verify_client optional;",
        "listen 8443 ssl; ssl_certificate a.crt; ssl_certificate_key a.key; ssl_verify_client optional_no_ca;",
        "listen 8443 ssl; ssl_certificate a.crt; ssl_certificate_key a.key; ssl_client_certificate a.crt; ssl_verify_client on;",
    ];
    let mut disagreements = Vec::new();
    for body in cases {
        std::fs::write(&file, format!("{E}http {{ server {{ {body} }} }}")).unwrap();
        let theirs = nginx_t(dir.path(), &file);
        // nginx makes these checks when merging, and logs them without a
        // place and with paths as written; this crate names the server's
        // file:line and the path joined to the conf prefix.
        let prefix = format!("{}/", dir.path().display());
        let place = format!(" in {}:2", file.display());
        let ours = load(&file, &Options::new())
            .map(|p| {
                p.warnings
                    .into_iter()
                    .map(|w| w.message)
                    .collect::<Vec<_>>()
            })
            .map_err(|e| {
                let full = e.to_string();
                full.strip_suffix(&place)
                    .unwrap_or(&full)
                    .replace(&prefix, "")
            });
        if theirs != ours {
            disagreements.push(format!("{body}:\n  nginx: {theirs:?}\n  ours:  {ours:?}"));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}
