//! The accounts REST API on the facade's port: `GET /v1/accounts` lists every
//! account's [`AccountStatus`](super::AccountStatus), `GET /v1/accounts/<name>`
//! shows one. Tests and `spinlink dev` poll it to know when an account is ready.

use bytes::Bytes;
use http::{Method, Response, StatusCode, header};

use super::Accounts;
use crate::facade::body::{Body, full};
use spinlink_kube_api::Status;

use crate::facade::body::status as status_response;

/// The path prefix this API answers.
pub const PREFIX: &str = "/v1/accounts";

fn json(value: &impl serde::Serialize) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(full(Bytes::from(body)));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Answers a request whose path starts with [`PREFIX`].
pub fn handle(accounts: &Accounts, method: &Method, path: &str) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        // The accounts API is ours, so the message may name the method.
        return status_response(&Status::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource: {method}"),
        ));
    }
    let rest = path.strip_prefix(PREFIX).unwrap_or_default();
    match rest.trim_start_matches('/') {
        "" => json(&accounts.list()),
        name if !name.contains('/') => match accounts.status(name) {
            Some(status) => json(&status),
            None => status_response(&Status::not_found_message(format!(
                "account \"{name}\" not found"
            ))),
        },
        _ => status_response(&Status::not_found_message(format!(
            "the server could not find the requested resource ({path})"
        ))),
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
        let list = body(handle(&accounts, &Method::GET, "/v1/accounts")).await;
        assert_eq!(list[0]["name"], "a");
        assert_eq!(list[0]["online"], true);
        assert_eq!(list[1]["name"], "b");
        let one = handle(&accounts, &Method::GET, "/v1/accounts/a");
        assert_eq!(one.status(), 200);
        assert_eq!(body(one).await["agentIdentity"], "spiffe://x/agent/a");
        let missing = handle(&accounts, &Method::GET, "/v1/accounts/zzz");
        assert_eq!(missing.status(), 404);
        assert_eq!(body(missing).await["reason"], "NotFound");
        assert_eq!(
            handle(&accounts, &Method::POST, "/v1/accounts").status(),
            405
        );
    }
}
