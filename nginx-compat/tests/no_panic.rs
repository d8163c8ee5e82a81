//! The parser takes untrusted files: whatever the bytes, it returns a value
//! or an error and never panics. Random bytes, random token soup and
//! mutations of the realistic example, a bounded number of cases each, so
//! the normal test run exercises what `fuzz/` explores without bound.

use proptest::prelude::*;
use spinlink_nginx_compat::{Ingress, MemorySource, Options, load_from, parse_str};

const FILE: &str = "/etc/nginx/nginx.conf";

/// The example with its includes inlined, so `parse_str` sees all of it.
const EXAMPLE: &str = concat!(
    "worker_processes auto;\nevents { worker_connections 1024; }\nhttp {\n",
    "set_real_ip_from 10.0.0.0/8; real_ip_header proxy_protocol;\n",
    "client_max_body_size 8m; proxy_read_timeout 120s; send_timeout 30s;\n",
    "client_body_buffer_size 64k; client_body_timeout 20s; proxy_request_buffering on;\n",
    "proxy_set_header Host $host; proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n",
    "upstream deck { server 127.0.0.1:9000; }\n",
    "upstream gate { server 127.0.0.1:8084 max_fails=3 fail_timeout=30s; server 127.0.0.1:8085 backup; }\n",
    "upstream spinlink_sidecar { server 127.0.0.1:7443; }\n",
    include_str!("fixtures/spinnaker/conf.d/10-deck.conf"),
    include_str!("fixtures/spinnaker/conf.d/20-gate.conf"),
    include_str!("fixtures/spinnaker/conf.d/30-agents.conf"),
    "}\n",
);

const TOKENS: &[&str] = &[
    "{",
    "}",
    ";",
    "\"",
    "'",
    "\\",
    "#",
    "$",
    "${",
    "(",
    ")",
    "\n",
    " ",
    "\t",
    "events",
    "http",
    "server",
    "location",
    "=",
    "^~",
    "~",
    "/",
    "/api/",
    "listen",
    "443",
    "[::]:443",
    "ssl",
    "http2",
    "proxy_protocol",
    "default_server",
    "server_name",
    "*.example.com",
    "ssl_certificate",
    "ssl_certificate_key",
    "ssl_client_certificate",
    "ssl_verify_client",
    "on",
    "optional",
    "ssl_protocols",
    "TLSv1.3",
    "proxy_pass",
    "http://gate",
    "https://a:1/x",
    "grpc_pass",
    "grpcs://s:7443",
    "proxy_set_header",
    "Host",
    "proxy_read_timeout",
    "grpc_read_timeout",
    "1h 30m",
    "500ms",
    "client_max_body_size",
    "8m",
    "client_body_buffer_size",
    "client_body_timeout",
    "proxy_request_buffering",
    "off",
    "send_timeout",
    "0",
    "upstream",
    "gate",
    "weight=2",
    "include",
    "set_real_ip_from",
    "10.0.0.0/8",
    "real_ip_header",
    "types",
    "sendfile",
];

fn check(src: &str) {
    for options in [Options::new(), Options::new().lenient(true)] {
        if let Ok(parsed) = parse_str(src, FILE, &options) {
            // Whatever parses must survive the trip through YAML.
            let yaml = serde_norway::to_string(&parsed.ingress).expect("serialize");
            let back: Ingress = serde_norway::from_str(&yaml).expect("deserialize");
            assert_eq!(back, parsed.ingress);
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize, usize),
    Insert(usize, usize),
    Duplicate(usize, usize),
    Replace(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0usize..40).prop_map(|(at, len)| Mutation::Delete(at, len)),
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(at, t)| Mutation::Insert(at, t)),
        (any::<usize>(), 0usize..200).prop_map(|(at, len)| Mutation::Duplicate(at, len)),
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Replace(at, b)),
    ]
}

fn apply(src: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut s = src.to_vec();
    for m in mutations {
        let n = s.len().max(1);
        match *m {
            Mutation::Delete(at, len) => {
                let at = at % n;
                let end = (at + len).min(s.len());
                if at < end {
                    s.drain(at..end);
                }
            }
            Mutation::Insert(at, t) => {
                let at = at % (s.len() + 1);
                s.splice(at..at, TOKENS[t].bytes());
            }
            Mutation::Duplicate(at, len) => {
                let at = at % n;
                let end = (at + len).min(s.len());
                if at < end {
                    let piece: Vec<u8> = s[at..end].to_vec();
                    s.splice(end..end, piece);
                }
            }
            Mutation::Replace(at, b) => {
                if !s.is_empty() {
                    let at = at % s.len();
                    s[at] = b;
                }
            }
        }
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn token_soup_never_panics(tokens in proptest::collection::vec(0..TOKENS.len(), 0..200)) {
        let src: String = tokens.iter().map(|&i| TOKENS[i]).collect::<Vec<_>>().join(" ");
        check(&src);
        check(&format!("events {{}}\nhttp {{\n{src}\n}}"));
    }

    #[test]
    fn mutated_example_never_panics(mutations in proptest::collection::vec(mutation(), 1..8)) {
        check(&String::from_utf8_lossy(&apply(EXAMPLE.as_bytes(), &mutations)));
    }

    #[test]
    fn mutated_includes_never_panic(
        mutations in proptest::collection::vec(mutation(), 1..6),
        pattern in prop::sample::select(vec!["*.conf", "a.conf", "[ab].conf", "?.conf", "nginx.conf", "[", "**"]),
    ) {
        let include = apply(b"server { listen 80; include b.conf; location / { proxy_pass http://a:1; } }", &mutations);
        let source = MemorySource::new()
            .with_file(FILE, format!("events {{}}\nhttp {{ include {pattern}; }}"))
            .with_file("/etc/nginx/a.conf", include.clone())
            .with_file("/etc/nginx/b.conf", include);
        let _ = load_from(FILE, &Options::new(), &source);
        let _ = load_from(FILE, &Options::new().lenient(true), &source);
    }
}

#[test]
fn unmutated_example_parses() {
    // Otherwise the mutations above would only ever explore error paths.
    let parsed = parse_str(EXAMPLE, FILE, &Options::new()).unwrap();
    assert_eq!(parsed.ingress.servers.len(), 3);
}

/// The cargo-fuzz target's body (`fuzz/fuzz_targets/parse.rs`) for a bounded
/// time (`SPINLINK_FUZZ_SECONDS`), mutating the example and token soup.
#[test]
fn fuzz_parse_bounded() {
    use spinlink_nginx_compat::Ast;
    spinlink_fuzzing::Fuzz::new("nginx-parse")
        .seeds([EXAMPLE.as_bytes()])
        .dictionary(TOKENS.iter().map(|t| t.as_bytes()))
        .max_len(8192)
        .run(|data| {
            if let Ok(ast) = Ast::parse(data, "/fuzz/nginx.conf") {
                let _ = Ingress::from_ast(&ast, &Options::new());
            }
            let text = String::from_utf8_lossy(data);
            let _ = parse_str(&text, "/fuzz/nginx.conf", &Options::new().lenient(true));
        });
}
