//! The admin port (`admin.listen`): `/healthz` (the process serves),
//! `/readyz` (connected to a gateway), `/metrics` (Prometheus text format,
//! [`crate::metrics`]), `/accounts` (each account's state, JSON), `/watches`
//! (each running watch per account and kind, JSON:
//! [`crate::activity::watches`]), `/operations` (the relayed requests executing
//! now: [`crate::activity::operations`]), `/version`; and the Armory Scale
//! Agent's names for these ([`armory`]): `/health`, `/accounts` with
//! Armory's filters and paging, `/accounts/{name}/version`. Plain HTTP/1.1,
//! meant for the kubelet and a scraper inside the cluster; it never carries
//! cluster data.

pub mod armory;

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
                    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
                    let response = answer(req.method(), target, &metrics, &state.borrow());
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

fn reply(
    status: http::StatusCode,
    content_type: &str,
    body: String,
) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

fn json(status: http::StatusCode, body: &serde_json::Value) -> http::Response<Full<Bytes>> {
    reply(status, "application/json", body.to_string())
}

/// An error in the shape the sidecar's Armory paths answer with.
fn json_error(status: http::StatusCode, message: String) -> http::Response<Full<Bytes>> {
    json(
        status,
        &serde_json::json!({"error": status.canonical_reason(), "message": message}),
    )
}

/// The response to one admin request; `target` is the request's path and
/// query.
pub fn answer(
    method: &http::Method,
    target: &str,
    metrics: &Metrics,
    state: &AgentState,
) -> http::Response<Full<Bytes>> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
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
        // `/health` is the Armory agent's readiness probe.
        "/readyz" | "/health" if state.connected => {
            reply(http::StatusCode::OK, text, "ready\n".into())
        }
        "/readyz" | "/health" => reply(
            http::StatusCode::SERVICE_UNAVAILABLE,
            text,
            "not connected to a gateway\n".into(),
        ),
        "/metrics" => reply(
            http::StatusCode::OK,
            METRICS_CONTENT_TYPE,
            metrics.encode_with_state(state),
        ),
        "/accounts" if armory::asks_armory(query) => match armory::AccountQuery::parse(query) {
            Ok(q) => {
                let (page, total) = armory::accounts(state, &metrics.active.snapshot(), &q);
                let mut response = json(
                    http::StatusCode::OK,
                    &serde_json::to_value(page).unwrap_or_default(),
                );
                response
                    .headers_mut()
                    .insert("x-total-count", http::HeaderValue::from(total));
                response
            }
            Err(message) => json_error(http::StatusCode::BAD_REQUEST, message),
        },
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
        "/operations" => json(
            http::StatusCode::OK,
            &serde_json::json!({"operations": metrics.operations.snapshot()}),
        ),
        "/version" => json(
            http::StatusCode::OK,
            &serde_json::json!({"name": "spinlink-agent", "version": env!("CARGO_PKG_VERSION")}),
        ),
        _ => match account_version(path) {
            Some(name) => match state.configured.get(&name) {
                Some(c) if !c.kubernetes_version.is_empty() => json(
                    http::StatusCode::OK,
                    &serde_json::json!({"account": name, "kubernetesVersion": c.kubernetes_version}),
                ),
                Some(_) => json_error(
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    format!("the version of account {name:?}'s cluster has not been read yet"),
                ),
                None => json_error(
                    http::StatusCode::NOT_FOUND,
                    format!("no account {name:?} on this agent"),
                ),
            },
            None => reply(http::StatusCode::NOT_FOUND, text, "not found\n".into()),
        },
    }
}

/// The account of `/accounts/{name}/version`, percent-decoded.
fn account_version(path: &str) -> Option<String> {
    let name = path.strip_prefix("/accounts/")?.strip_suffix("/version")?;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    percent_encoding::percent_decode_str(name)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
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

    fn parsed(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap()
    }

    #[tokio::test]
    async fn armory_agent_endpoints() {
        use crate::state::Configured;
        let m = Metrics::new();
        let get = http::Method::GET;
        let mut state = AgentState::default();
        // `/health` is readiness, as Armory's manifests probe it.
        assert_eq!(body(answer(&get, "/health", &m, &state)).await.0, 503);
        state.connected = true;
        assert_eq!(body(answer(&get, "/health", &m, &state)).await.0, 200);

        for (name, dynamic) in [("dev", false), ("dyn-1", true), ("prod", false)] {
            let configured = Configured {
                dynamic,
                kubernetes_version: if name == "prod" { "" } else { "v1.36.0" }.into(),
                ..Configured::default()
            };
            state.configured.insert(name.into(), configured);
        }
        state.accounts.insert("dev".into(), AccountState::Synced);
        state
            .accounts
            .insert("prod".into(), AccountState::Refused("not yours".into()));
        let _watch = m.active.register("dev", "pods");

        // Without Armory's parameters, spinlink's shape stays.
        let (_, text) = body(answer(&get, "/accounts?pretty=1", &m, &state)).await;
        assert_eq!(parsed(&text)["accounts"]["dev"]["state"], "synced");

        let response = answer(&get, "/accounts?Config.Dynamic=false&limit=1", &m, &state);
        assert_eq!(response.headers()["x-total-count"], "2");
        let (status, text) = body(response).await;
        assert_eq!(status, 200, "{text}");
        let v = parsed(&text);
        assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
        assert_eq!(v[0]["Config"]["Name"], "dev");
        assert_eq!(v[0]["Config"]["Dynamic"], false);
        assert_eq!(v[0]["State"]["Name"], "Healthy");
        assert_eq!(v[0]["State"]["SpinlinkState"], "synced");
        assert_eq!(v[0]["Kinds"], serde_json::json!(["pods"]));
        assert_eq!(v[0]["KubernetesVersion"], "v1.36.0");
        let (_, text) = body(answer(
            &get,
            "/accounts?State.Name=DiscoveryError",
            &m,
            &state,
        ))
        .await;
        let v = parsed(&text);
        assert_eq!(v[0]["Config"]["Name"], "prod", "{v}");
        assert!(
            v[0]["State"]["Message"]
                .as_str()
                .unwrap()
                .contains("not yours")
        );
        let (_, text) = body(answer(&get, "/accounts?Config.Name=dyn-1", &m, &state)).await;
        let v = parsed(&text);
        assert_eq!(
            (&v[0]["Config"]["Dynamic"], &v[0]["State"]["Name"]),
            (&true.into(), &"ConfigLoaded".into())
        );

        // Bad input is a 400 naming the parameter; the port keeps serving.
        for query in ["limit=abc", "offset=-1", "State.Name=Up"] {
            let (status, text) =
                body(answer(&get, &format!("/accounts?{query}"), &m, &state)).await;
            assert_eq!(status, 400, "{query}: {text}");
            let v = parsed(&text);
            let param = query.split('=').next().unwrap();
            assert!(v["message"].as_str().unwrap().starts_with(param), "{v}");
            assert_eq!(v["error"], "Bad Request");
        }

        let (status, text) = body(answer(&get, "/version", &m, &state)).await;
        assert_eq!(status, 200);
        assert_eq!(parsed(&text)["version"], env!("CARGO_PKG_VERSION"));
        let (status, text) = body(answer(&get, "/accounts/dev/version", &m, &state)).await;
        assert_eq!(
            (status, parsed(&text)["kubernetesVersion"].clone()),
            (200, "v1.36.0".into())
        );
        assert_eq!(
            body(answer(&get, "/accounts/prod/version", &m, &state))
                .await
                .0,
            503
        );
        assert_eq!(
            body(answer(&get, "/accounts/nope/version", &m, &state))
                .await
                .0,
            404
        );
        assert_eq!(
            body(answer(&get, "/accounts/a/b/version", &m, &state))
                .await
                .0,
            404
        );

        // `/operations`: the relayed requests executing now.
        let (status, text) = body(answer(&get, "/operations", &m, &state)).await;
        assert_eq!((status, text.as_str()), (200, r#"{"operations":[]}"#));
        let row = m
            .operations
            .register(crate::activity::operations::Operation {
                id: "dev:3".into(),
                account: "dev".into(),
                verb: "watch".into(),
                method: "GET".into(),
                path: "/api/v1/pods".into(),
                started_unix_millis: 5,
            });
        let (_, text) = body(answer(&get, "/operations", &m, &state)).await;
        let v = parsed(&text);
        assert_eq!(v["operations"][0]["id"], "dev:3");
        assert_eq!(v["operations"][0]["verb"], "watch");
        assert_eq!(v["operations"][0]["startedUnixMillis"], 5);
        drop(row);
        let (_, text) = body(answer(&get, "/operations", &m, &state)).await;
        assert_eq!(text, r#"{"operations":[]}"#);
    }
}
