//! Running one relayed request against the API server and streaming the
//! response back as `ResponseHead` + `BodyChunk`s (or a `RelayError`).
//!
//! Responses from secrets paths are rewritten before they leave (unless the
//! account's relay policy sets `readSecrets`): whole bodies are buffered and
//! scrubbed, watches are scrubbed line by line, and anything that is not JSON
//! is refused.

use bytes::Bytes;
use http_body_util::BodyExt;
use spinlink_proto::v1::{self, RelayUp, relay_up};
use tokio::sync::mpsc;
use tracing::debug;

use crate::scrub::{self, WatchScrubber};

/// Largest body chunk sent up.
pub const MAX_CHUNK: usize = 64 * 1024;
/// Largest non-watch secrets response buffered for scrubbing.
pub const MAX_BUFFERED_SECRET_BODY: usize = 64 * 1024 * 1024;

/// Request headers passed on to the API server; all others are dropped (the
/// agent's own credentials are used, and impersonation is not relayed).
pub const REQUEST_HEADERS: [&str; 4] = ["content-type", "accept", "kubectl-command", "user-agent"];
/// Response headers passed back.
pub const RESPONSE_HEADERS: [&str; 6] = [
    "content-type",
    "warning",
    "audit-id",
    "cache-control",
    "retry-after",
    "location",
];

/// A `RelayError` message for a request the agent took at `started`
/// ([`unix_micros`]).
pub fn error(id: u64, status: u32, message: &str, started: i64) -> RelayUp {
    RelayUp {
        msg: Some(relay_up::Msg::Error(v1::RelayError {
            id,
            status,
            message: message.to_owned(),
            timing: timing(started),
        })),
    }
}

/// This host's clock in microseconds since the Unix epoch, the unit of
/// `AgentTiming`.
pub fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The timing of a request taken at `started` and finished now.
pub fn timing(started: i64) -> Option<v1::AgentTiming> {
    Some(v1::AgentTiming {
        started_unix_micros: started,
        finished_unix_micros: unix_micros(),
    })
}

/// Why a relayed request failed, and the status reported for it.
#[derive(Debug)]
struct Failure {
    status: u32,
    message: String,
}

impl Failure {
    fn new(status: u32, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

/// How the response body is passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyMode {
    /// As it comes.
    Stream,
    /// Buffered whole, scrubbed of Secret values.
    ScrubWhole,
    /// Scrubbed line by line (watch events).
    ScrubLines,
}

/// How the account's requests are relayed.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Remove Secret values from secrets responses.
    pub scrub_secrets: bool,
    /// `Impersonate-User` and one `Impersonate-Group` per group.
    pub impersonate: Option<std::sync::Arc<(String, Vec<String>)>>,
}

/// Runs the request, which arrived whole at `started` ([`unix_micros`]);
/// sends the response (or an error) through `tx`. Returns when the response
/// is complete, failed, or the stream is gone.
pub async fn execute(
    client: kube::Client,
    head: v1::RequestHead,
    body: Vec<u8>,
    started: i64,
    options: Options,
    tx: mpsc::Sender<RelayUp>,
) {
    let id = head.id;
    let deadline = deadline(head.deadline_unix_millis);
    let run = run(&client, head, body, started, &options, &tx);
    let outcome = match deadline {
        Some(at) => match tokio::time::timeout_at(at, run).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Failure::new(504, "deadline exceeded")),
        },
        None => run.await,
    };
    if let Err(failure) = outcome {
        debug!(id, status = failure.status, message = %failure.message, "relayed request failed");
        let _ = tx
            .send(error(id, failure.status, &failure.message, started))
            .await;
    }
}

fn deadline(unix_millis: i64) -> Option<tokio::time::Instant> {
    if unix_millis <= 0 {
        return None;
    }
    let now = crate::clock::unix_millis();
    let left = u64::try_from(unix_millis.saturating_sub(now)).unwrap_or(0);
    Some(tokio::time::Instant::now() + std::time::Duration::from_millis(left))
}

async fn run(
    client: &kube::Client,
    head: v1::RequestHead,
    body: Vec<u8>,
    started: i64,
    options: &Options,
    tx: &mpsc::Sender<RelayUp>,
) -> Result<(), Failure> {
    let id = head.id;
    let secrets = options.scrub_secrets && scrub::path_targets_secrets(&head.path);
    let mode = match (secrets, crate::policy::is_watch(&head.path, &head.query)) {
        (false, _) => BodyMode::Stream,
        (true, false) => BodyMode::ScrubWhole,
        (true, true) => BodyMode::ScrubLines,
    };
    let mut request = build_request(&head, body, secrets)?;
    impersonate(&mut request, options)?;
    let response = client
        .send(request)
        .await
        .map_err(|e| Failure::new(502, format!("API server: {e}")))?;
    let status = response.status();
    let headers: Vec<v1::Header> = RESPONSE_HEADERS
        .iter()
        .flat_map(|name| {
            response
                .headers()
                .get_all(*name)
                .iter()
                .map(move |v| (name, v))
        })
        .map(|(name, value)| v1::Header {
            name: (*name).to_owned(),
            value: value.as_bytes().to_vec(),
        })
        .collect();
    if mode != BodyMode::Stream && !is_json(response.headers()) {
        return Err(Failure::new(
            502,
            "refusing a non-JSON response from a secrets path",
        ));
    }
    let mut body = response.into_body();
    // Stamped as it leaves, so the time spent scrubbing counts as the agent's.
    let response_head = |started| RelayUp {
        msg: Some(relay_up::Msg::Head(v1::ResponseHead {
            id,
            status: u32::from(status.as_u16()),
            headers,
            timing: timing(started),
        })),
    };

    if mode == BodyMode::ScrubWhole {
        // Buffer before the head goes out, so a body that cannot be scrubbed
        // can still be reported with a status.
        let mut whole = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Failure::new(502, format!("response body: {e}")))?;
            if let Ok(data) = frame.into_data() {
                if whole.len() + data.len() > MAX_BUFFERED_SECRET_BODY {
                    return Err(Failure::new(502, "secrets response too large to scrub"));
                }
                whole.extend_from_slice(&data);
            }
        }
        let clean =
            scrub::scrub_secret_body(&whole).map_err(|e| Failure::new(502, e.to_string()))?;
        drop(whole);
        send(tx, response_head(started)).await?;
        return send_body(tx, id, &clean, true).await;
    }

    send(tx, response_head(started)).await?;
    let mut lines = WatchScrubber::new();
    while let Some(frame) = body.frame().await {
        // After the head, a failure is reported as a RelayError that ends it.
        let frame = frame.map_err(|e| Failure::new(502, format!("response body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let data: Bytes = match mode {
            BodyMode::ScrubLines => lines
                .push(&data)
                .map_err(|e| Failure::new(502, e.to_string()))?
                .into(),
            _ => data,
        };
        send_body(tx, id, &data, false).await?;
    }
    let rest = match mode {
        BodyMode::ScrubLines => lines
            .finish()
            .map_err(|e| Failure::new(502, e.to_string()))?,
        _ => Vec::new(),
    };
    send_body(tx, id, &rest, true).await
}

/// Sends `data` in chunks of at most [`MAX_CHUNK`]; with `end`, the last
/// chunk (possibly empty) carries `end_stream`.
async fn send_body(
    tx: &mpsc::Sender<RelayUp>,
    id: u64,
    data: &[u8],
    end: bool,
) -> Result<(), Failure> {
    let mut chunks = data.chunks(MAX_CHUNK).peekable();
    if chunks.peek().is_none() {
        if end {
            send(tx, chunk(id, &[], true)).await?;
        }
        return Ok(());
    }
    while let Some(piece) = chunks.next() {
        let last = end && chunks.peek().is_none();
        send(tx, chunk(id, piece, last)).await?;
    }
    Ok(())
}

fn chunk(id: u64, data: &[u8], end_stream: bool) -> RelayUp {
    RelayUp {
        msg: Some(relay_up::Msg::Body(v1::BodyChunk {
            id,
            data: data.to_vec(),
            end_stream,
        })),
    }
}

async fn send(tx: &mpsc::Sender<RelayUp>, msg: RelayUp) -> Result<(), Failure> {
    // The stream is gone: nobody to report to; end quietly.
    tx.send(msg)
        .await
        .map_err(|_| Failure::new(499, "relay stream closed"))
}

fn build_request(
    head: &v1::RequestHead,
    body: Vec<u8>,
    secrets: bool,
) -> Result<http::Request<kube::client::Body>, Failure> {
    if !head.path.starts_with('/') || head.path.starts_with("//") {
        return Err(Failure::new(400, "request path must be absolute"));
    }
    let method = http::Method::from_bytes(head.method.as_bytes())
        .map_err(|_| Failure::new(400, format!("bad method {:?}", head.method)))?;
    let uri = if head.query.is_empty() {
        head.path.clone()
    } else {
        format!("{}?{}", head.path, head.query)
    };
    let mut builder = http::Request::builder().method(method).uri(uri);
    for header in &head.headers {
        let name = header.name.to_ascii_lowercase();
        if !REQUEST_HEADERS.contains(&name.as_str()) {
            continue;
        }
        if secrets && name == "accept" {
            // Only JSON can be scrubbed: never ask for protobuf here.
            continue;
        }
        let value = http::HeaderValue::from_bytes(&header.value)
            .map_err(|_| Failure::new(400, format!("bad value for header {name}")))?;
        builder = builder.header(name, value);
    }
    if secrets {
        builder = builder.header(http::header::ACCEPT, "application/json");
    }
    builder
        .body(kube::client::Body::from(body))
        .map_err(|e| Failure::new(400, format!("bad request: {e}")))
}

/// Adds the account's impersonation headers (the sidecar's own were dropped
/// by [`build_request`]).
fn impersonate<B>(request: &mut http::Request<B>, options: &Options) -> Result<(), Failure> {
    let Some(imp) = &options.impersonate else {
        return Ok(());
    };
    let (user, groups) = &**imp;
    let value = |v: &str| {
        http::HeaderValue::from_str(v).map_err(|_| Failure::new(500, "bad impersonation value"))
    };
    let headers = request.headers_mut();
    headers.insert("impersonate-user", value(user)?);
    for group in groups {
        headers.append("impersonate-group", value(group)?);
    }
    Ok(())
}

fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(path: &str, query: &str, headers: &[(&str, &str)]) -> v1::RequestHead {
        v1::RequestHead {
            id: 1,
            method: "GET".into(),
            path: path.into(),
            query: query.into(),
            headers: headers
                .iter()
                .map(|(n, v)| v1::Header {
                    name: (*n).into(),
                    value: v.as_bytes().to_vec(),
                })
                .collect(),
            deadline_unix_millis: 0,
            end_stream: true,
        }
    }

    #[test]
    fn only_selected_headers_pass() {
        let h = head(
            "/api/v1/pods",
            "limit=5",
            &[
                ("Accept", "application/json"),
                ("Authorization", "Bearer stolen"),
                ("Impersonate-User", "admin"),
                ("Kubectl-Command", "kubectl get"),
            ],
        );
        let req = build_request(&h, Vec::new(), false).unwrap();
        assert_eq!(req.uri(), "/api/v1/pods?limit=5");
        assert_eq!(req.headers().get("accept").unwrap(), "application/json");
        assert_eq!(req.headers().get("kubectl-command").unwrap(), "kubectl get");
        assert!(req.headers().get("authorization").is_none());
        assert!(req.headers().get("impersonate-user").is_none());
    }

    #[test]
    fn impersonation_headers_replace_the_sidecars() {
        let h = head(
            "/api/v1/pods",
            "",
            &[
                ("Impersonate-User", "admin"),
                ("Impersonate-Group", "system:masters"),
            ],
        );
        let options = Options {
            scrub_secrets: true,
            impersonate: Some(std::sync::Arc::new((
                "system:serviceaccount:a:deployer".into(),
                vec!["ops".into(), "dev".into()],
            ))),
        };
        let mut req = build_request(&h, Vec::new(), false).unwrap();
        impersonate(&mut req, &options).unwrap();
        let all = |n: &str| -> Vec<_> { req.headers().get_all(n).iter().cloned().collect() };
        assert_eq!(
            all("impersonate-user"),
            vec!["system:serviceaccount:a:deployer"]
        );
        assert_eq!(all("impersonate-group"), vec!["ops", "dev"]);
        let mut plain = build_request(&h, Vec::new(), false).unwrap();
        impersonate(&mut plain, &Options::default()).unwrap();
        assert!(plain.headers().get("impersonate-user").is_none());
    }

    #[test]
    fn secrets_requests_ask_for_json() {
        let h = head(
            "/api/v1/namespaces/a/secrets",
            "",
            &[("Accept", "application/vnd.kubernetes.protobuf")],
        );
        let req = build_request(&h, Vec::new(), true).unwrap();
        let accepts: Vec<_> = req.headers().get_all("accept").iter().collect();
        assert_eq!(accepts, vec!["application/json"]);
    }

    #[test]
    fn bad_requests_are_refused() {
        assert_eq!(
            build_request(&head("api/v1", "", &[]), Vec::new(), false)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            build_request(&head("//evil/x", "", &[]), Vec::new(), false)
                .unwrap_err()
                .status,
            400
        );
        let mut h = head("/api", "", &[]);
        h.method = "GE T".into();
        assert_eq!(
            build_request(&h, Vec::new(), false).unwrap_err().status,
            400
        );
    }

    #[tokio::test]
    async fn bodies_are_chunked_and_ended() {
        let (tx, mut rx) = mpsc::channel(16);
        let data = vec![7u8; MAX_CHUNK * 2 + 10];
        send_body(&tx, 9, &data, true).await.unwrap();
        send_body(&tx, 9, &[], true).await.unwrap();
        drop(tx);
        let mut sizes = Vec::new();
        while let Some(RelayUp {
            msg: Some(relay_up::Msg::Body(c)),
        }) = rx.recv().await
        {
            assert_eq!(c.id, 9);
            sizes.push((c.data.len(), c.end_stream));
        }
        assert_eq!(
            sizes,
            vec![
                (MAX_CHUNK, false),
                (MAX_CHUNK, false),
                (10, true),
                (0, true)
            ]
        );
    }
}
