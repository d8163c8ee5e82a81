//! Whether the cache may answer a read: it must hold what the read asks for
//! ([`covers`]: the kind is synced and the agent watches the namespace), and
//! the account's identity must be allowed to make it ([`allowed`], for
//! accounts whose agent impersonates; see [`crate::accounts::authz`]). A
//! read the cache may not answer is relayed live, so the client gets what
//! the API server answers: the objects, or its own 403.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};

use super::route::ResourcePath;
use crate::accounts::Account;
use crate::accounts::authz::ReadAttributes;

/// Where the review is posted (through the agent, as the account's identity).
const REVIEW_PATH: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

/// Largest review answer read.
const REVIEW_LIMIT: usize = 64 * 1024;

/// Whether the cache holds everything a read of `path` would return: the
/// kind is cached and synced, and the agent watches the namespace read.
/// Outside its namespaces — another namespace, every namespace at once, or
/// the list of namespaces itself — the cache holds only part of the
/// answer, so the read goes to the API server.
pub fn covers(account: &Account, path: &ResourcePath) -> bool {
    let namespaced = {
        let cache = account.read_cache();
        match cache
            .kind(&path.group, &path.version, &path.resource)
            .filter(|k| k.synced)
        {
            Some(kind) => kind.info.namespaced,
            None => return false,
        }
    };
    let scope = account.scope();
    if scope.is_all() {
        return true;
    }
    if namespaced {
        return path.namespace.as_deref().is_some_and(|ns| scope.covers(ns));
    }
    if path.group.is_empty() && path.resource == "namespaces" {
        return path.name.as_deref().is_some_and(|ns| scope.covers(ns));
    }
    true
}

/// The read a GET of `path` makes, as RBAC names it.
pub fn attributes(path: &ResourcePath, watch: bool) -> ReadAttributes {
    ReadAttributes {
        verb: spinlink_kube_api::request_verb(&http::Method::GET, path.name.is_some(), watch)
            .unwrap_or("get"),
        group: path.group.clone(),
        resource: path.resource.clone(),
        namespace: path.namespace.clone().unwrap_or_default(),
        name: path.name.clone().unwrap_or_default(),
    }
}

/// Whether the account's identity may make `read`, as the API server says
/// (kept for a while). An account whose reads need no review is always
/// allowed; a review that fails (the agent or the API server cannot be
/// asked) is a no, not kept, and the read goes live to fail as it would.
pub async fn allowed(account: &Arc<Account>, read: ReadAttributes, timeout: Duration) -> bool {
    if account.reads_as().is_none() {
        return true;
    }
    if let Some(allowed) = account.read_decision(&read) {
        return allowed;
    }
    match review(account, &read, timeout).await {
        Ok(allowed) => {
            account.keep_read_decision(read, allowed);
            allowed
        }
        Err(error) => {
            tracing::debug!(account = account.name(), %error, "a read's review failed; relaying the read");
            false
        }
    }
}

/// Asks the API server, through the agent, whether the account's identity
/// may make `read`.
async fn review(
    account: &Arc<Account>,
    read: &ReadAttributes,
    timeout: Duration,
) -> Result<bool, String> {
    let body = serde_json::to_vec(&read.review()).map_err(|e| e.to_string())?;
    let req = Request::post(REVIEW_PATH)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = super::relay::relay(account.clone(), req, REVIEW_PATH.to_owned(), timeout).await;
    let status = resp.status();
    let mut body = bytes::BytesMut::new();
    let mut stream = resp.into_body();
    while let Some(frame) = stream.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            body.extend_from_slice(&data);
        }
        if body.len() > REVIEW_LIMIT {
            return Err("the review's answer is too large".to_owned());
        }
    }
    if !status.is_success() {
        return Err(format!(
            "the review was answered {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    let answer: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    answer["status"]["allowed"]
        .as_bool()
        .ok_or_else(|| "the review's answer has no status.allowed".to_owned())
}
