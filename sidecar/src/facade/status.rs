//! `metav1.Status` failure bodies, shaped as the Kubernetes API server writes
//! them (see `kube-sim/fixtures/errors/`). Every error the facade answers is
//! built here.

use bytes::Bytes;
use http::{Response, StatusCode, header};
use serde_json::{Map, Value, json};

use super::body::{Body, full};

/// A failure the facade answers with a `metav1.Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// HTTP status code.
    pub code: u16,
    /// Kubernetes reason (`NotFound`, `BadRequest`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details`, when there are any.
    pub details: Option<Value>,
}

impl Failure {
    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 404 NotFound of an object: `pods "x" not found`.
    pub fn object_not_found(group: &str, resource: &str, name: &str) -> Self {
        let mut details = Map::new();
        details.insert("name".into(), name.into());
        if !group.is_empty() {
            details.insert("group".into(), group.into());
        }
        details.insert("kind".into(), resource.into());
        let qualified = if group.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}.{group}")
        };
        Self {
            details: Some(Value::Object(details)),
            ..Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
        }
    }

    /// 404 NotFound without details (unknown account, unknown path).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "NotFound", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource: {method}"),
        )
    }

    /// 503 ServiceUnavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// 504 Timeout.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// A failure reported by the agent: its status (502 when it gave none)
    /// with the reason Kubernetes uses for that code.
    pub fn from_agent(status: u32, message: impl Into<String>) -> Self {
        let code = u16::try_from(status)
            .ok()
            .filter(|c| (400..600).contains(c))
            .unwrap_or(502);
        Self::new(code, reason_for(code), message)
    }

    /// Any code, reason and message.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// The `metav1.Status` body.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        });
        if let (Some(map), Some(details)) = (v.as_object_mut(), &self.details) {
            map.insert("details".into(), details.clone());
        }
        if let Some(map) = v.as_object_mut() {
            map.insert("code".into(), self.code.into());
        }
        v
    }

    /// The HTTP response.
    pub fn into_response(self) -> Response<Body> {
        let body = serde_json::to_vec(&self.to_json()).unwrap_or_default();
        let mut resp = Response::new(full(Bytes::from(body)));
        *resp.status_mut() =
            StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// The Kubernetes reason for an HTTP status code.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Value {
        let path = format!(
            "{}/../kube-sim/fixtures/errors/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn not_found_matches_the_real_server() {
        let got = Failure::object_not_found("", "pods", "nope").to_json();
        assert_eq!(got, fixture("404-notfound.json"));
        // Key order matters to nobody but humans; keep it like the server's.
        let keys: Vec<_> = got.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            keys,
            [
                "kind",
                "apiVersion",
                "metadata",
                "status",
                "message",
                "reason",
                "details",
                "code"
            ]
        );
    }

    #[test]
    fn bad_request_matches_the_real_server() {
        let got = Failure::bad_request("field label not supported: spec.foo").to_json();
        assert_eq!(got, fixture("400-badfieldselector.json"));
    }

    #[test]
    fn grouped_not_found_names_group() {
        let got = Failure::object_not_found("apps", "deployments", "web").to_json();
        assert_eq!(got["message"], "deployments.apps \"web\" not found");
        assert_eq!(got["details"]["group"], "apps");
        assert_eq!(got["code"], 404);
    }

    #[test]
    fn agent_failures_default_to_502() {
        let f = Failure::from_agent(0, "boom");
        assert_eq!((f.code, f.reason), (502, "InternalError"));
        let f = Failure::from_agent(403, "no");
        assert_eq!((f.code, f.reason), (403, "Forbidden"));
        let resp = Failure::unavailable("x").into_response();
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
    }
}
