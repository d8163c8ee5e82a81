//! Fuzz target bodies: one plain function per parser of network input, each
//! asserting what must hold for *any* bytes (no panic, plus the invariants
//! named on each). `gateway/fuzz` (cargo-fuzz) calls them with libFuzzer's
//! inputs; the unit tests below call them with a bounded number of proptest
//! inputs, so CI exercises the same bodies on a stable toolchain.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use spinlink_proto::v1::HelloRequest;
use spinlink_tls::binding::ConnectionBinding;

use crate::config::PolicyRule;
use crate::identity::{AgentPeer, Policy};
use crate::listener::proxy_protocol::{self, Parse};
use crate::stats::Stats;
use crate::token::{Claims, TokenKey};
use crate::tunnel::hello::{HelloService, MAX_ACCOUNTS_PER_HELLO};
use crate::tunnel::{Shared, TunnelLimits};

/// The gRPC message prefixes of carried streams (`engine::messages`): the
/// first byte is the limit's scale, the second a chunk size, the rest the
/// stream. The verdict never depends on how the stream is cut into frames,
/// and is the one a whole-message reading gives: refused exactly when a
/// prefix, read message by message, declares more than the limit.
pub fn message_sizes(data: &[u8]) {
    use crate::engine::messages::{Messages, TooLarge};
    let [scale, cut, stream @ ..] = data else {
        return;
    };
    let limit = u32::from(*scale) * 16;
    let whole = Messages::new(limit).read(stream);
    let mut chunked = Messages::new(limit);
    let verdict = stream
        .chunks(usize::from(*cut).max(1))
        .map(|c| chunked.read(c))
        .find(Result::is_err)
        .unwrap_or(Ok(()));
    assert_eq!(whole, verdict);
    // The oracle: walk the messages by their prefixes.
    let mut at = 0usize;
    let mut expected = Ok(());
    while at + 5 <= stream.len() {
        let declared = u32::from_be_bytes([
            stream[at + 1],
            stream[at + 2],
            stream[at + 3],
            stream[at + 4],
        ]);
        if declared > limit {
            expected = Err(TooLarge { declared, limit });
            break;
        }
        at += 5 + declared as usize;
    }
    assert_eq!(whole, expected);
}

/// The PROXY header parser: never panics; a complete header's length is
/// within the input and at most the version's bound; the header alone parses
/// to the same result, and so does the header with anything after it.
pub fn proxy_header(data: &[u8]) {
    let Ok(parsed) = proxy_protocol::parse(data) else {
        return;
    };
    if let Parse::Done { header, len } = parsed {
        assert!(len > 0 && len <= data.len(), "len {len} of {}", data.len());
        assert!(len <= proxy_protocol::V2_MAX_LEN);
        assert_eq!(
            proxy_protocol::parse(&data[..len]),
            Ok(Parse::Done { header, len })
        );
    }
}

/// The ClientHello peek that admission reads before TLS: never panics; a
/// ticket it finds lies within the first record; the verdict on a whole
/// record does not change with what follows it, and any shorter prefix of
/// a record with a ticket is `Incomplete`, never a different answer.
pub fn client_hello(data: &[u8]) {
    use crate::tls::client_hello::{Peek, RECORD_HEADER_LEN, peek};
    let verdict = peek(data);
    if let Peek::Ticket(t) = verdict {
        let record_len = usize::from(u16::from_be_bytes([data[3], data[4]]));
        let end = RECORD_HEADER_LEN + record_len;
        let start = t.as_ptr() as usize - data.as_ptr() as usize;
        assert!(start >= RECORD_HEADER_LEN && start + t.len() <= end);
        assert_eq!(peek(&data[..end]), Peek::Ticket(t));
        for n in [0, 1, RECORD_HEADER_LEN, end - 1] {
            assert_eq!(
                peek(&data[..n.min(end - 1)]),
                Peek::Incomplete,
                "prefix {n}"
            );
        }
    }
}

fn key() -> &'static TokenKey {
    static KEY: OnceLock<TokenKey> = OnceLock::new();
    KEY.get_or_init(|| TokenKey::generate().expect("system random"))
}

/// The channel token codec: any presented text is refused (nobody forges a
/// token without the key), without a panic; a token issued for claims derived
/// from the input verifies for exactly those claims and not for another
/// account or connection.
pub fn token(data: &[u8]) {
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let binding = ConnectionBinding([0x5a; 32]);
    let text = String::from_utf8_lossy(data);
    let (identity, account) = text.split_once('\n').unwrap_or((&text, "acct"));
    let claims = Claims {
        binding: &binding,
        identity,
        account,
    };
    assert!(key().verify(&text, claims, now).is_err());
    let (issued, expiry) = key()
        .issue(claims, now, Duration::from_secs(60))
        .expect("issue");
    assert_eq!(key().verify(issued.expose(), claims, now), Ok(expiry));
    let other_account = format!("{account}x");
    let other = Claims {
        account: &other_account,
        ..claims
    };
    assert!(key().verify(issued.expose(), other, now).is_err());
    let other_binding = ConnectionBinding([0xa5; 32]);
    let other = Claims {
        binding: &other_binding,
        ..claims
    };
    assert!(key().verify(issued.expose(), other, now).is_err());
}

struct JwtFixture {
    verifier: crate::identity::jwt::JwtVerifier,
    key: jsonwebtoken::EncodingKey,
}

fn jwt_fixture() -> &'static JwtFixture {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::signature::{self, KeyPair};
    static FIXTURE: OnceLock<JwtFixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let rng = ring::rand::SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("keygen");
        let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("key");
        let p = pair.public_key().as_ref();
        let jwks = serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "fuzz",
            "x": URL_SAFE_NO_PAD.encode(&p[1..33]), "y": URL_SAFE_NO_PAD.encode(&p[33..65])}]});
        let config = crate::config::JwtBootstrapConfig {
            audiences: vec!["fuzz".into()],
            ..Default::default()
        };
        JwtFixture {
            verifier: crate::identity::jwt::JwtVerifier::from_jwks(
                &serde_json::from_value(jwks).expect("jwks"),
                &config,
            )
            .expect("verifier"),
            key: jsonwebtoken::EncodingKey::from_ec_der(pkcs8.as_ref()),
        }
    })
}

/// The bootstrap JWT path: any presented text is refused without a panic
/// (nobody forges a signature), also when it is three base64url parts whose
/// header and claims come from the input; a JWT the key really signed, with
/// claims taken from the input, is accepted exactly when its `sub` and
/// accounts are usable, and then names that `sub`.
pub fn jwt(data: &[u8]) {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let fixture = jwt_fixture();
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let text = String::from_utf8_lossy(data);
    assert!(fixture.verifier.verify(&text, now).is_err());
    let mut parts = text.splitn(3, '\n');
    let (header, claims, sig) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let forged = [header, claims, sig]
        .map(|p| URL_SAFE_NO_PAD.encode(p))
        .join(".");
    assert!(fixture.verifier.verify(&forged, now).is_err());
    let forged = format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"ES256","kid":"fuzz"}"#),
        URL_SAFE_NO_PAD.encode(claims),
        URL_SAFE_NO_PAD.encode(sig)
    );
    assert!(fixture.verifier.verify(&forged, now).is_err());

    let accounts: Vec<&str> = claims.split(',').collect();
    let body = serde_json::json!({"sub": header, "aud": "fuzz", "exp": 1_700_000_100u64,
        "spinlink_accounts": accounts});
    let mut jwt_header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    jwt_header.kid = Some("fuzz".into());
    let signed = jsonwebtoken::encode(&jwt_header, &body, &fixture.key).expect("sign");
    match fixture.verifier.verify(&signed, now) {
        Ok(bootstrap) => {
            assert_eq!(&*bootstrap.identity, header);
            assert!(accounts.iter().all(|a| !a.is_empty()));
        }
        // Only an unusable `sub` or accounts claim (empty, or not a glob).
        Err(crate::identity::jwt::JwtError::MissingClaim(claim)) => {
            assert!(
                (claim == "sub" && header.is_empty()) || claim == "spinlink_accounts",
                "{claim}"
            );
        }
        Err(e) => panic!("a signed JWT refused: {e}"),
    }
}

fn hello_service() -> &'static HelloService {
    static SERVICE: OnceLock<HelloService> = OnceLock::new();
    SERVICE.get_or_init(|| {
        let policy = Policy::compile(&[PolicyRule {
            identities: vec!["spiffe://fuzz/*".into()],
            accounts: vec!["dev-*".into(), "a*".into()],
        }])
        .expect("policy");
        HelloService::new(Arc::new(Shared {
            gateway_id: "fuzz".into(),
            policy,
            tokens: TokenKey::generate().expect("system random"),
            token_ttl: Duration::from_secs(60),
            upstreams: Arc::default(),
            stats: Arc::new(Stats::default()),
            limits: TunnelLimits::default(),
            owners: Arc::default(),
            jwt: None,
        }))
    })
}

/// `Hello` decoding and validation: any bytes either fail to decode or get an
/// answer (or a status) without a panic; every offered account is either
/// granted or refused, never dropped; no account is granted twice.
pub fn hello(data: &[u8]) {
    let Ok(request) = HelloRequest::decode(data) else {
        return;
    };
    let peer = AgentPeer {
        identity: "spiffe://fuzz/agent".into(),
        binding: ConnectionBinding([1; 32]),
        remote: ([127, 0, 0, 1], 1).into(),
        grants: Arc::default(),
        bootstrap: None,
        tokens: Arc::default(),
    };
    match hello_service().answer(&peer, &request, SystemTime::now()) {
        Ok(response) => {
            assert_eq!(
                response.granted.len() + response.refused.len(),
                request.accounts.len()
            );
            // One token per account; a granted name is refused again only as
            // a repeat of itself.
            let mut granted = std::collections::HashSet::new();
            for g in &response.granted {
                assert!(granted.insert(g.account.as_str()), "granted twice");
            }
            for r in &response.refused {
                if granted.contains(r.account.as_str()) {
                    assert!(r.reason.contains("offered twice"), "{}", r.reason);
                }
            }
        }
        Err(_) => assert!(request.accounts.len() > MAX_ACCOUNTS_PER_HELLO),
    }
}

/// An agent connection fed any bytes after the client preface: the engine
/// never panics, always ends once the input does, never decodes a header
/// list past its SETTINGS_MAX_HEADER_LIST_SIZE (counted as RFC 7541 §4.1
/// does), and everything it writes is well-formed HTTP/2 (each frame
/// parses, whatever the peer sent).
pub fn relay_server(data: &[u8]) {
    use crate::engine::conn::{Conn, InStream, Local, Role, Signal, Target};
    use crate::engine::link::{Failure, Fields, Link, Side, Sink, grpc_status_fields};
    use spinlink_http2::frame::{self, Frame, HEAD_LEN, Head};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const MAX_HEADER_LIST: u32 = 4096;

    /// Answers odd-numbered streams at once, lets the others be.
    struct Answer;
    impl Role for Answer {
        const SIDE: Side = Side::Server;
        fn open(&mut self, link: &Arc<Link>, id: u32, fields: Fields, end: bool) -> InStream {
            let list: usize = fields.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
            assert!(
                list <= MAX_HEADER_LIST as usize,
                "a header list of {list} octets decoded"
            );
            link.accept(id, None);
            if id % 4 == 1 {
                link.headers(id, grpc_status_fields(0, "", true), true);
            } else {
                link.headers(id, grpc_status_fields(0, "", true)[..2].to_vec(), false);
                link.data(id, b"\0\0\0\0\x01x", false);
            }
            InStream::new(Target::Discard, frame::DEFAULT_WINDOW).recv_closed(end)
        }
        fn poll_signal(
            &mut self,
            _: &mut std::task::Context<'_>,
            _: usize,
            _: &Arc<Link>,
        ) -> Signal {
            Signal::None
        }
        fn failure(&self) -> Failure {
            Failure::Cancel
        }
    }

    thread_local! {
        static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
    }
    RT.with(|rt| {
        rt.block_on(async {
            let local = Local {
                max_concurrent_streams: 8,
                stream_window: frame::DEFAULT_WINDOW,
                conn_window: frame::DEFAULT_WINDOW,
                max_header_list_size: MAX_HEADER_LIST,
                header_table_size: 4096,
                keepalive: Duration::from_secs(30),
                keepalive_timeout: Duration::from_secs(10),
                preface_timeout: Some(Duration::from_secs(10)),
            };
            let (mut peer, io) = tokio::io::duplex(1 << 20);
            let link = Link::new(
                Side::Server,
                Arc::from("fuzz"),
                local.preamble(Side::Server),
                spinlink_http2::hpack::Encoder::new(0),
            );
            let mut conn = Conn::new(io, link, Answer, local);
            let mut input = frame::PREFACE.to_vec();
            input.extend_from_slice(data);
            peer.write_all(&input)
                .await
                .expect("the pipe takes the input");
            peer.shutdown().await.expect("end of input");
            let run = std::future::poll_fn(|cx| conn.poll_run(cx));
            let ended = tokio::time::timeout(Duration::from_secs(5), run).await;
            assert!(ended.is_ok(), "the connection outlived its input");
            conn.shut();
            drop(conn);
            let mut out = Vec::new();
            peer.read_to_end(&mut out).await.expect("the pipe reads");
            let mut at = 0;
            while at < out.len() {
                let head = Head::parse(&out[at..]).expect("a whole frame head");
                let payload = &out[at + HEAD_LEN..at + HEAD_LEN + head.len];
                assert!(
                    Frame::parse(head, payload).is_ok(),
                    "wrote a bad frame: {head:?}"
                );
                at += HEAD_LEN + head.len;
            }
        });
    });
}

/// A request's host (`Host` or `:authority`) as the ingress reads it to
/// pick a server: any bytes are read or refused without a panic; a name
/// read is not empty, lowercase, has no `/`, NUL or two dots in a row, and
/// is what the value says before its port (one trailing dot dropped).
pub fn host(data: &[u8]) {
    let Ok(name) = crate::ingress::validate_host(data) else {
        return;
    };
    assert!(!name.is_empty());
    assert!(
        !name
            .bytes()
            .any(|b| b.is_ascii_uppercase() || b == b'/' || b == 0)
    );
    assert!(!name.contains(".."), "{name:?}");
    if !data.contains(&b':') && !data.starts_with(b"[") && data.is_ascii() {
        let written = std::str::from_utf8(data).unwrap().to_ascii_lowercase();
        assert_eq!(written.strip_suffix('.').unwrap_or(&written), name);
    }
}

/// An HTTP/1.1 answer from an upstream server, as the ingress's own
/// exchange reads it (`ingress::h1`): the first byte is the size of the
/// reads the rest arrives in (the high bit: the answer is to a `HEAD`).
/// Never panics; read in pieces it gives what it gives read whole (head,
/// body, trailers, whether the connection is kept, the verdict); a body
/// whose head declared its length is exactly that long.
pub fn h1_answer(data: &[u8]) {
    use crate::ingress::h1::read_pieces;
    let [first, answer @ ..] = data else {
        return;
    };
    let head_request = first & 0x80 != 0;
    let cut = usize::from(first & 0x7f).max(1);
    let whole = read_pieces(&[answer], head_request);
    let pieces: Vec<&[u8]> = answer.chunks(cut).collect();
    assert_eq!(read_pieces(&pieces, head_request), whole, "cut every {cut}");
    if let Ok(reading) = whole
        && let Some(n) = reading.length
    {
        assert_eq!(reading.body.len() as u64, n);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The bodies above for a bounded time, mutating valid inputs
    /// (`SPINLINK_FUZZ_SECONDS` each).
    mod bounded {
        use prost::Message as _;
        use spinlink_fuzzing::Fuzz;

        #[test]
        fn fuzz_proxy_header() {
            Fuzz::new("proxy-header")
                .seeds([
                    &b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nrest"[..],
                    b"PROXY TCP6 ::1 ::2 3 4\r\n",
                    b"PROXY UNKNOWN\r\n",
                ])
                .dictionary([&crate::listener::proxy_protocol::V2_SIGNATURE[..], b"\r\n"])
                .max_len(600)
                .run(super::proxy_header);
        }

        #[test]
        fn fuzz_client_hello() {
            // A ClientHello offering a ticket, as the agent's rustls sends it
            // (shortened): record, handshake header, hello, extensions.
            let mut hello = vec![3, 3];
            hello.extend_from_slice(&[9; 32]);
            hello.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
            let psk = [0, 9, 0, 3, b't', b'k', b't', 0, 0, 0, 0, 0, 3, 2, 0, 0];
            hello.extend_from_slice(&(psk.len() as u16 + 4).to_be_bytes());
            hello.extend_from_slice(&[0, 41]);
            hello.extend_from_slice(&(psk.len() as u16).to_be_bytes());
            hello.extend_from_slice(&psk);
            let mut hs = vec![1, 0];
            hs.extend_from_slice(&(hello.len() as u16).to_be_bytes());
            hs.extend_from_slice(&hello);
            let mut record = vec![0x16, 3, 1];
            record.extend_from_slice(&(hs.len() as u16).to_be_bytes());
            record.extend_from_slice(&hs);
            assert!(matches!(
                crate::tls::client_hello::peek(&record),
                crate::tls::client_hello::Peek::Ticket(b"tkt")
            ));
            Fuzz::new("client-hello")
                .seeds([&record[..], &[0x16, 3, 1, 0, 4, 1, 0, 0, 0][..]])
                .dictionary([&[0u8, 41][..], &[0x16, 3, 1][..]])
                .max_len(600)
                .run(super::client_hello);
        }

        #[test]
        fn fuzz_h1_answer() {
            Fuzz::new("h1-answer")
                .seeds([
                    &b"\x07HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"[..],
                    b"\x03HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nt: 1\r\n\r\n",
                    b"\x83HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
                    b"\x01HTTP/1.0 200 OK\r\n\r\nuntil close",
                ])
                .dictionary([
                    &b"\r\n"[..],
                    b"content-length: ",
                    b"transfer-encoding: chunked",
                    b"connection: close",
                    b"HTTP/1.1 ",
                ])
                .max_len(1024)
                .run(super::h1_answer);
        }

        #[test]
        fn fuzz_host() {
            Fuzz::new("host")
                .seeds([
                    &b"Deck.Test:8443"[..],
                    b"[::1]:443",
                    b"a.b.",
                    b"a..b",
                    b"x/y",
                ])
                .dictionary([&b"."[..], b":", b"[", b"]", b"/"])
                .max_len(64)
                .run(super::host);
        }

        #[test]
        fn fuzz_token() {
            Fuzz::new("token")
                .seeds([&b"spiffe://a\nacct"[..]])
                .max_len(200)
                .run(super::token);
        }

        #[test]
        fn fuzz_jwt() {
            Fuzz::new("jwt")
                .seeds([&b"sub\naccount-*\nsig"[..], b"a.b.c"])
                .dictionary([&b"."[..], b"eyJ", b"\n"])
                .max_len(1024)
                .run(super::jwt);
        }

        #[test]
        fn fuzz_hello() {
            let request = spinlink_proto::v1::HelloRequest {
                agent_id: "a".into(),
                agent_version: "v".into(),
                accounts: vec![spinlink_proto::v1::AccountInfo {
                    name: "dev-1".into(),
                    ..Default::default()
                }],
            };
            Fuzz::new("hello")
                .seeds([request.encode_to_vec()])
                .max_len(2048)
                .run(super::hello);
        }

        #[test]
        fn fuzz_relay_server() {
            use bytes::BytesMut;
            use spinlink_http2::frame;
            let mut seed = BytesMut::new();
            frame::Settings::default().write(&mut seed);
            frame::write_headers(&mut seed, 1, &[0x83, 0x86, 0x84], false, 16_384);
            frame::write_data(&mut seed, 1, b"\0\0\0\0\x01x", true);
            frame::write_headers(&mut seed, 3, &[0x83, 0x86, 0x84], true, 16_384);
            frame::write_ping(&mut seed, false, [1; 8]);
            frame::write_reset(&mut seed, 3, frame::Reason::CANCEL);
            frame::write_window_update(&mut seed, 0, 1000);
            // An HPACK bomb: a 233-octet entry, then references to it.
            let mut bomb_block = vec![0x83, 0x86, 0x84, 0x40, 0x01, b'x', 0x7f, 200 - 127];
            bomb_block.extend_from_slice(&[b'v'; 200]);
            bomb_block.extend_from_slice(&[0xbe; 20]);
            let mut bomb = BytesMut::new();
            frame::Settings::default().write(&mut bomb);
            frame::write_headers(&mut bomb, 1, &bomb_block, false, 16_384);
            Fuzz::new("relay-server")
                .seeds([seed.to_vec(), bomb.to_vec()])
                .max_len(2048)
                .run(super::relay_server);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn proxy_header_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            proxy_header(&data);
        }

        #[test]
        fn proxy_header_after_a_signature(
            v2 in any::<bool>(),
            tail in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            // Random bytes rarely start with a signature; these always do.
            let mut data = if v2 {
                proxy_protocol::V2_SIGNATURE.to_vec()
            } else {
                b"PROXY TCP4 ".to_vec()
            };
            data.extend_from_slice(&tail);
            proxy_header(&data);
        }

        #[test]
        fn message_sizes_any_stream(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            message_sizes(&data);
        }

        #[test]
        fn message_sizes_of_well_formed_messages(
            scale in any::<u8>(),
            cut in 1u8..40,
            lens in proptest::collection::vec(0u32..300, 0..8),
        ) {
            // Random bytes rarely declare small lengths; these messages do.
            let mut data = vec![scale, cut];
            for len in lens {
                data.push(0);
                data.extend_from_slice(&len.to_be_bytes());
                data.extend(std::iter::repeat_n(0xa5, len as usize));
            }
            message_sizes(&data);
        }

        #[test]
        fn token_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..120)) {
            token(&data);
        }

        #[test]
        fn jwt_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            jwt(&data);
        }

        #[test]
        fn jwt_any_claims(sub in "[a-z:/\\-]{0,12}", accounts in "[a-z*,\\-]{0,20}") {
            jwt(format!("{sub}\n{accounts}\nsig").as_bytes());
        }

        #[test]
        fn hello_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            hello(&data);
        }

        #[test]
        fn hello_any_accounts(names in proptest::collection::vec("[a-z\\-]{0,8}", 0..20)) {
            let request = HelloRequest {
                agent_id: "a".into(),
                agent_version: "v".into(),
                accounts: names
                    .into_iter()
                    .map(|name| spinlink_proto::v1::AccountInfo { name, ..Default::default() })
                    .collect(),
            };
            hello(&request.encode_to_vec());
        }
    }

    #[test]
    fn a_repeated_account_passes_the_checks() {
        let account = |name: &str| spinlink_proto::v1::AccountInfo {
            name: name.into(),
            ..Default::default()
        };
        let request = HelloRequest {
            accounts: vec![account("dev-1"), account("dev-1"), account("prod")],
            ..Default::default()
        };
        hello(&request.encode_to_vec());
    }

    #[test]
    fn a_valid_v1_header_passes_the_checks() {
        proxy_header(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nrest");
    }
}
