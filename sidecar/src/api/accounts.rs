//! The accounts and agents REST API on the facade's port, documented in
//! `docs/api/sidecar.openapi.yaml`:
//!
//! - `GET /v1/accounts`: every account's [`AccountStatus`](crate::accounts::AccountStatus);
//!   `GET /v1/accounts/<name>` one of them; tests and `spinlink dev` poll it to
//!   know when an account is ready;
//! - `GET /v1/accounts/<name>/operations`: its recent relayed operations with
//!   the time of each hop and the outcome, from the store's journal (so any
//!   sidecar sharing the store answers, whichever relayed them);
//! - `GET /v1/agents`: every agent identity with its accounts and streams;
//! - `POST /v1/agents/<identity>/disconnect` (identity percent-encoded): ends
//!   every stream of that agent here; it reconnects.

use http::{Method, Response, StatusCode};

use crate::accounts::Accounts;
use crate::http::body::Body;
use spinlink_kube_api::Status;

use crate::http::body::status as status_response;

/// The path prefix of the accounts API.
pub const PREFIX: &str = "/v1/accounts";
/// The path prefix of the agents API.
pub const AGENTS: &str = "/v1/agents";

/// Whether `path` belongs to this API.
pub fn owns(path: &str) -> bool {
    [PREFIX, AGENTS]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
}

fn not_found(what: String) -> Response<Body> {
    status_response(&Status::not_found_message(what))
}

fn method_not_allowed(method: &Method) -> Response<Body> {
    // The API is ours, so the message may name the method.
    status_response(&Status::new(
        405,
        "MethodNotAllowed",
        format!("the server does not allow this method on the requested resource: {method}"),
    ))
}

fn json(value: &impl serde::Serialize) -> Response<Body> {
    crate::http::body::json(StatusCode::OK, value)
}

/// Answers a request whose path [`owns`] says is this API's.
pub async fn handle(accounts: &Accounts, method: &Method, path: &str) -> Response<Body> {
    let read = method == Method::GET || method == Method::HEAD;
    if let Some(rest) = path.strip_prefix(AGENTS) {
        let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
        return match segs.as_slice() {
            [] if read => json(&accounts.agents()),
            [identity, "disconnect"] if method == Method::POST => {
                let identity = percent_encoding::percent_decode_str(identity).decode_utf8_lossy();
                match accounts.disconnect_agent(&identity) {
                    Some(names) => {
                        tracing::info!(%identity, accounts = ?names, "agent disconnected by the API");
                        json(&serde_json::json!({ "identity": identity, "accounts": names }))
                    }
                    None => not_found(format!("agent \"{identity}\" not found")),
                }
            }
            [] | [_, "disconnect"] => method_not_allowed(method),
            _ => not_found(format!(
                "the server could not find the requested resource ({path})"
            )),
        };
    }
    if !read {
        return method_not_allowed(method);
    }
    let rest = path.strip_prefix(PREFIX).unwrap_or_default();
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        [] => json(&accounts.list()),
        [name] => match accounts.status(name) {
            Some(status) => json(&status),
            None => not_found(format!("account \"{name}\" not found")),
        },
        [name, "operations"] => match accounts.operations(name).await {
            Ok(Some(ops)) => json(&ops),
            Ok(None) => not_found(format!("account \"{name}\" not found")),
            Err(e) => status_response(&Status::unavailable(format!(
                "the journal of relayed operations could not be read: {e}"
            ))),
        },
        _ => not_found(format!(
            "the server could not find the requested resource ({path})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(resp: Response<Body>) -> serde_json::Value {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn list_get_and_unknown() {
        let accounts = Accounts::new();
        accounts.get_or_create("b");
        accounts
            .get_or_create("a")
            .cache_opened("spiffe://x/agent/a");
        let list = body(handle(&accounts, &Method::GET, "/v1/accounts").await).await;
        assert_eq!(list[0]["name"], "a");
        assert_eq!(list[0]["online"], true);
        assert_eq!(list[1]["name"], "b");
        let one = handle(&accounts, &Method::GET, "/v1/accounts/a").await;
        assert_eq!(one.status(), 200);
        assert_eq!(body(one).await["agentIdentity"], "spiffe://x/agent/a");
        let missing = handle(&accounts, &Method::GET, "/v1/accounts/zzz").await;
        assert_eq!(missing.status(), 404);
        assert_eq!(body(missing).await["reason"], "NotFound");
        assert_eq!(
            handle(&accounts, &Method::POST, "/v1/accounts")
                .await
                .status(),
            405
        );
    }
}

#[cfg(test)]
mod openapi_doc {
    //! The documented API and the served one cannot drift apart.
    use super::*;

    fn doc() -> serde_json::Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/api/sidecar.openapi.yaml"
        );
        serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn every_documented_path_is_served_and_every_status_field_documented() {
        let doc = doc();
        let accounts = Accounts::new();
        accounts.get_or_create("a").cache_opened("id");
        for (path, item) in doc["paths"].as_object().unwrap() {
            if path == "/metrics" {
                continue;
            }
            let concrete = path.replace("{name}", "a").replace("{identity}", "id");
            for method in item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| *k != "parameters")
            {
                let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
                // Dynamic accounts are answered by their own API, tested
                // in `crate::dynamic::tests`.
                if crate::api::dynamic::serves(&m, &concrete) {
                    continue;
                }
                assert!(owns(&concrete), "{path} is documented but not routed here");
                let status = handle(&accounts, &m, &concrete).await.status();
                assert_eq!(status, StatusCode::OK, "{method} {path}");
            }
        }
        // Every field of a dynamic account is documented.
        let view = crate::dynamic::View::from(&crate::store::DynamicRow::default());
        let documented = &doc["components"]["schemas"]["DynamicAccount"]["properties"];
        for key in serde_json::to_value(view)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
        {
            assert!(
                documented.get(key).is_some(),
                "DynamicAccount.{key} is not documented"
            );
        }
        // Every field the API serves for an account is documented
        // (`lastEvent` only once an event was applied).
        accounts.get("a").unwrap().event_applied();
        let served = serde_json::to_value(accounts.status("a").unwrap()).unwrap();
        let documented = &doc["components"]["schemas"]["AccountStatus"]["properties"];
        for key in served.as_object().unwrap().keys() {
            assert!(
                documented.get(key).is_some(),
                "AccountStatus.{key} is not documented"
            );
        }
    }
}
