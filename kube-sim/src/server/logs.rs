//! `GET .../pods/{name}/log`: deterministic container logs for simulated pods, with
//! `container`, `tailLines`, `timestamps`, `limitBytes`, `previous` and `follow=true`
//! (the response stays open and a new line is written every
//! [`FOLLOW_INTERVAL`] until the client goes, the pod is deleted or the server stops).
//!
//! Line `i` of a container is the same on every request: its timestamp is the pod's
//! start time plus `i` seconds, so tests and the facade comparison can rely on it.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::router::Body;
use crate::error::Status;
use crate::resources::ResourceInfo;
use crate::store::Sim;

/// Lines a container has logged when its log is first read.
pub const INITIAL_LINES: u64 = 10;
/// Time between two lines of a followed log.
pub const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);
/// Chunks buffered between a follow task and its response body.
const FOLLOW_BUFFER: usize = 16;

/// Options of one log request (`PodLogOptions`).
#[derive(Debug, Clone, Default)]
pub(crate) struct LogOptions {
    pub container: Option<String>,
    pub follow: bool,
    pub tail_lines: Option<u64>,
    pub timestamps: bool,
    pub limit_bytes: Option<usize>,
    pub previous: bool,
}

fn names(pod: &Value, field: &str) -> Vec<String> {
    pod["spec"][field]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The container whose log is asked for, or the error the real server gives.
pub(crate) fn container(pod: &Value, opts: &LogOptions) -> Result<String, Status> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let containers = names(pod, "containers");
    let init = names(pod, "initContainers");
    let name = match &opts.container {
        Some(c) if !c.is_empty() => {
            if !containers.contains(c) && !init.contains(c) {
                return Err(Status::bad_request(format!(
                    "container {c} is not valid for pod {pod_name}"
                )));
            }
            c.clone()
        }
        _ if containers.len() == 1 => containers[0].clone(),
        _ => {
            let mut msg = format!(
                "a container name must be specified for pod {pod_name}, choose one of: [{}]",
                containers.join(" ")
            );
            if !init.is_empty() {
                msg.push_str(&format!(
                    " or one of the init containers: [{}]",
                    init.join(" ")
                ));
            }
            return Err(Status::bad_request(msg));
        }
    };
    let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
    if !matches!(phase, "Running" | "Succeeded" | "Failed") {
        return Err(Status::bad_request(format!(
            "container \"{name}\" in pod \"{pod_name}\" is waiting to start: ContainerCreating"
        )));
    }
    if opts.previous {
        return Err(Status::bad_request(format!(
            "previous terminated container \"{name}\" in pod \"{pod_name}\" not found"
        )));
    }
    Ok(name)
}

fn start_time(pod: &Value) -> DateTime<Utc> {
    [
        &pod["status"]["startTime"],
        &pod["metadata"]["creationTimestamp"],
    ]
    .into_iter()
    .filter_map(Value::as_str)
    .find_map(|s| DateTime::parse_from_rfc3339(s).ok())
    .map(|t| t.with_timezone(&Utc))
    .unwrap_or_default()
}

/// Line `i` (from 1) of `container` in `pod`, newline-terminated.
pub(crate) fn line(pod: &Value, container: &str, i: u64, timestamps: bool) -> String {
    let t = start_time(pod) + chrono::Duration::seconds(i as i64);
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let msg = format!(
        "{} INFO [{name}/{container}] request {i}: GET /healthz 200\n",
        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    if timestamps {
        format!(
            "{} {msg}",
            t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
        )
    } else {
        msg
    }
}

/// The log response for `pod` (already looked up).
pub(crate) fn respond(
    sim: Sim,
    res: &'static ResourceInfo,
    pod: Value,
    opts: LogOptions,
    shutdown: CancellationToken,
) -> Response<Body> {
    let container = match container(&pod, &opts) {
        Ok(c) => c,
        Err(s) => return s.to_http().map(|b| Full::new(b).boxed()),
    };
    let first = opts
        .tail_lines
        .map_or(1, |n| INITIAL_LINES.saturating_sub(n) + 1);
    let mut text = String::new();
    for i in first..=INITIAL_LINES {
        text.push_str(&line(&pod, &container, i, opts.timestamps));
    }
    let body = if !opts.follow {
        if let Some(limit) = opts.limit_bytes {
            text.truncate(limit.min(text.len()));
        }
        Full::new(Bytes::from(text)).boxed()
    } else {
        let (tx, mut rx) = mpsc::channel::<Bytes>(FOLLOW_BUFFER);
        tokio::spawn(follow(sim, res, pod, container, opts, text, tx, shutdown));
        let stream = futures::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
                .map(|o| o.map(|b| Ok::<_, Infallible>(Frame::data(b))))
        });
        StreamBody::new(stream).boxed()
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    resp
}

#[allow(clippy::too_many_arguments)]
async fn follow(
    sim: Sim,
    res: &'static ResourceInfo,
    pod: Value,
    container: String,
    opts: LogOptions,
    initial: String,
    tx: mpsc::Sender<Bytes>,
    shutdown: CancellationToken,
) {
    let mut budget = opts.limit_bytes.unwrap_or(usize::MAX);
    let send = |mut chunk: String, budget: &mut usize| {
        chunk.truncate((*budget).min(chunk.len()));
        *budget -= chunk.len();
        Bytes::from(chunk)
    };
    if tx.send(send(initial, &mut budget)).await.is_err() {
        return;
    }
    let ns = pod["metadata"]["namespace"].as_str().map(str::to_string);
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let uid = pod["metadata"]["uid"].clone();
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + FOLLOW_INTERVAL,
        FOLLOW_INTERVAL,
    );
    let mut i = INITIAL_LINES;
    while budget > 0 {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tx.closed() => return,
            _ = ticker.tick() => {}
        }
        // The stream ends with the pod (or its replacement under the same name).
        match sim.get_in(res, ns.as_deref(), &name) {
            Ok(p)
                if p["metadata"]["uid"] == uid && p["metadata"]["deletionTimestamp"].is_null() => {}
            _ => return,
        }
        i += 1;
        let chunk = send(line(&pod, &container, i, opts.timestamps), &mut budget);
        if tx.send(chunk).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Value {
        json!({"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running"}})
    }

    #[test]
    fn container_choice_and_errors() {
        let opts = |c: Option<&str>| LogOptions {
            container: c.map(str::to_string),
            ..Default::default()
        };
        assert_eq!(container(&pod(), &opts(Some("b"))).unwrap(), "b");
        let e = container(&pod(), &opts(None)).unwrap_err();
        assert_eq!(
            e.message,
            "a container name must be specified for pod p, choose one of: [a b]"
        );
        let e = container(&pod(), &opts(Some("x"))).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "container x is not valid for pod p")
        );
        let mut pending = pod();
        pending["status"]["phase"] = json!("Pending");
        assert!(
            container(&pending, &opts(Some("a")))
                .unwrap_err()
                .message
                .contains("waiting to start")
        );
    }

    #[test]
    fn lines_are_deterministic() {
        assert_eq!(line(&pod(), "a", 3, false), line(&pod(), "a", 3, false));
        assert_eq!(
            line(&pod(), "a", 3, true),
            "2026-01-01T00:00:03.000000000Z 2026-01-01T00:00:03Z INFO [p/a] request 3: GET /healthz 200\n"
        );
    }
}
