//! gRPC error answers in trailers-only form (HTTP 200, `grpc-status` in the
//! headers, no body), the one place errors become what an agent sees.

use http::{HeaderMap, Response};
use tonic::Status;
use tonic::body::Body;

/// A trailers-only response carrying `status`.
pub fn response(status: Status) -> Response<Body> {
    status.into_http()
}

/// `Unauthenticated` (16): no identity, or a missing or invalid channel token.
pub fn unauthenticated(message: impl Into<String>) -> Response<Body> {
    response(Status::unauthenticated(message))
}

/// `Unimplemented` (12): a path this gateway does not serve.
pub fn unimplemented(message: impl Into<String>) -> Response<Body> {
    response(Status::unimplemented(message))
}

/// `Unavailable` (14): no upstream could take the stream.
pub fn unavailable(message: impl Into<String>) -> Response<Body> {
    response(Status::unavailable(message))
}

/// `Internal` (13): the gateway could not build the upstream request.
pub fn internal(message: impl Into<String>) -> Response<Body> {
    response(Status::internal(message))
}

/// Trailers carrying `status`, to end a stream whose upstream failed midway.
pub fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        // Only a message that cannot be a header value gets here; the code
        // alone still tells the agent what happened.
        map.insert(
            Status::GRPC_STATUS,
            http::HeaderValue::from(status.code() as i32),
        );
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    #[test]
    fn trailers_only_form() {
        let r = unauthenticated("channel token expired");
        assert_eq!(r.status(), http::StatusCode::OK);
        assert_eq!(r.headers()["grpc-status"], "16");
        assert_eq!(r.headers()["content-type"], "application/grpc");
        assert_eq!(r.headers()["grpc-message"], "channel%20token%20expired");
        assert!(r.body().is_end_stream());
        assert_eq!(unimplemented("x").headers()["grpc-status"], "12");
        assert_eq!(unavailable("x").headers()["grpc-status"], "14");
    }

    #[test]
    fn trailers_carry_code() {
        let t = trailers(&Status::unavailable("upstream went away"));
        assert_eq!(t["grpc-status"], "14");
    }
}
