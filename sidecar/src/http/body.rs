//! The response body type of every port: a boxed body of bytes, either a
//! whole document or chunks streamed from a relayed response; and the one
//! place a `metav1.Status` becomes a response ([`status`]).

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use spinlink_kube_api::Status;

/// The error a streamed body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response the sidecar serves has this body.
pub type Body = BoxBody<Bytes, BoxError>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A `200 OK` plain-text response (the Prometheus text format).
pub fn text(body: String) -> Response<Body> {
    let mut resp = Response::new(full(body));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

/// `value` as a JSON answer with `code` (the REST APIs' answers).
pub fn json(code: http::StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(full(body));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The response for a failure: its code and the `metav1.Status` as JSON.
pub fn status(status: &Status) -> Response<Body> {
    status.to_http().map(full)
}
