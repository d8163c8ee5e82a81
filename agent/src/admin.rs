//! The admin port (`admin.listen`): `/healthz` (the process serves),
//! `/readyz` (connected to a gateway), `/metrics` (Prometheus text format,
//! [`crate::metrics`]), `/accounts` (each account's state, JSON), `/watches`
//! (each running watch per account and kind, JSON:
//! [`crate::cache::active`]). Plain HTTP/1.1, meant for the kubelet and a scraper
//! inside the cluster; it never carries cluster data.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::metrics::Metrics;
use crate::state::{AccountState, AgentState};

/// Content type of `/metrics`.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the admin endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    state: watch::Receiver<AgentState>,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: try again shortly.
                    debug!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        let _ = stream.set_nodelay(true);
        let (metrics, state, shutdown) = (metrics.clone(), state.clone(), shutdown.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let response =
                        answer(req.method(), req.uri().path(), &metrics, &state.borrow());
                    async move { Ok::<_, Infallible>(response) }
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
}

/// The response to one admin request.
pub fn answer(
    method: &http::Method,
    path: &str,
    metrics: &Metrics,
    state: &AgentState,
) -> http::Response<Full<Bytes>> {
    let reply = |status: http::StatusCode, content_type: &str, body: String| {
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_default()
    };
    let text = "text/plain; charset=utf-8";
    if method != http::Method::GET {
        return reply(
            http::StatusCode::METHOD_NOT_ALLOWED,
            text,
            "GET only\n".into(),
        );
    }
    match path {
        "/healthz" => reply(http::StatusCode::OK, text, "ok\n".into()),
        "/readyz" if state.connected => reply(http::StatusCode::OK, text, "ready\n".into()),
        "/readyz" => reply(
            http::StatusCode::SERVICE_UNAVAILABLE,
            text,
            "not connected to a gateway\n".into(),
        ),
        "/metrics" => reply(
            http::StatusCode::OK,
            METRICS_CONTENT_TYPE,
            metrics.encode_with_state(state),
        ),
        "/accounts" => {
            let accounts: serde_json::Map<String, serde_json::Value> = state
                .accounts
                .iter()
                .map(|(name, s)| {
                    let v = match s {
                        AccountState::Refused(reason) => {
                            serde_json::json!({"state": "refused", "reason": reason})
                        }
                        AccountState::Streaming => serde_json::json!({"state": "streaming"}),
                        AccountState::Synced => serde_json::json!({"state": "synced"}),
                        AccountState::Standby => serde_json::json!({"state": "standby"}),
                    };
                    (name.clone(), v)
                })
                .collect();
            let body = serde_json::json!({"connected": state.connected, "accounts": accounts});
            reply(http::StatusCode::OK, "application/json", body.to_string())
        }
        "/watches" => {
            let body = serde_json::json!({"watches": metrics.active.snapshot()});
            reply(http::StatusCode::OK, "application/json", body.to_string())
        }
        _ => reply(http::StatusCode::NOT_FOUND, text, "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(r: http::Response<Full<Bytes>>) -> (u16, String) {
        let status = r.status().as_u16();
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn endpoints() {
        let m = Metrics::new();
        m.relay("dev", "get", "relayed");
        let get = http::Method::GET;
        let mut state = AgentState::default();
        assert_eq!(body(answer(&get, "/healthz", &m, &state)).await.0, 200);
        assert_eq!(body(answer(&get, "/readyz", &m, &state)).await.0, 503);
        state.connected = true;
        assert_eq!(body(answer(&get, "/readyz", &m, &state)).await.0, 200);
        let (status, text) = body(answer(&get, "/metrics", &m, &state)).await;
        assert_eq!(status, 200);
        assert!(
            text.contains("spinlink_agent_relays_total{account=\"dev\""),
            "{text}"
        );
        state.accounts.insert("dev".into(), AccountState::Synced);
        state
            .accounts
            .insert("other".into(), AccountState::Refused("not yours".into()));
        let (status, text) = body(answer(&get, "/accounts", &m, &state)).await;
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["connected"], true);
        assert_eq!(v["accounts"]["dev"]["state"], "synced");
        assert_eq!(v["accounts"]["other"]["reason"], "not yours");
        assert_eq!(body(answer(&get, "/nope", &m, &state)).await.0, 404);
        // `/watches`: one row per running watch, gone with it.
        let (status, text) = body(answer(&get, "/watches", &m, &state)).await;
        assert_eq!((status, text.as_str()), (200, r#"{"watches":[]}"#));
        let row = m.active.register("dev", "pods");
        row.listing();
        row.watching("42");
        row.event("43", 1_700_000_000_000);
        let (_, text) = body(answer(&get, "/watches", &m, &state)).await;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let w = &v["watches"][0];
        assert_eq!(
            (
                &w["account"],
                &w["kind"],
                &w["phase"],
                &w["resourceVersion"]
            ),
            (
                &serde_json::json!("dev"),
                &serde_json::json!("pods"),
                &serde_json::json!("watching"),
                &serde_json::json!("43")
            )
        );
        assert_eq!(
            (&w["eventsSent"], &w["relists"], &w["gone"]),
            (&1.into(), &1.into(), &0.into())
        );
        assert_eq!(w["lastEventUnixMillis"], 1_700_000_000_000_i64);
        drop(row);
        let (_, text) = body(answer(&get, "/watches", &m, &state)).await;
        assert_eq!(text, r#"{"watches":[]}"#);
        assert_eq!(
            body(answer(&http::Method::POST, "/healthz", &m, &state))
                .await
                .0,
            405
        );
    }
}
