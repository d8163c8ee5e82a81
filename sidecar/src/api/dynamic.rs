//! The dynamic accounts part of the accounts API (documented with it in
//! `docs/api/sidecar.openapi.yaml`): `POST /v1/accounts`,
//! `DELETE /v1/accounts/{name}`, `POST /v1/accounts/{name}/migrate` and
//! `GET /v1/dynamic-accounts`. Errors become `metav1.Status` answers here
//! and nowhere else.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use spinlink_kube_api::Status;

use super::accounts::PREFIX;
use crate::dynamic::{CreateRequest, Dynamic, Error, MigrateRequest};
use crate::http::body::{Body, json, status as status_response};

/// The path of the dynamic accounts list.
pub const LIST: &str = "/v1/dynamic-accounts";
/// Largest request body: a kubeconfig with a few certificates.
pub const MAX_BODY: usize = 1 << 20;

/// What a request asks for.
enum Route {
    Create,
    Delete(String),
    Migrate(String),
    List,
}

/// A path segment, percent-decoded.
pub(crate) fn decode(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned()
}

fn route(method: &Method, path: &str) -> Option<Route> {
    if path == LIST || path == format!("{LIST}/") {
        return (method == Method::GET).then_some(Route::List);
    }
    let rest = path.strip_prefix(PREFIX)?;
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    match (method, segs.as_slice()) {
        (&Method::POST, []) => Some(Route::Create),
        (&Method::DELETE, [name]) => Some(Route::Delete(decode(name))),
        (&Method::POST, [name, "migrate"]) => Some(Route::Migrate(decode(name))),
        _ => None,
    }
}

/// Whether this API answers `method` on `path`.
pub fn serves(method: &Method, path: &str) -> bool {
    route(method, path).is_some()
}

/// The one place a dynamic account error becomes an answer.
fn error(e: &Error) -> Response<Body> {
    let message = e.to_string();
    let status = match e {
        Error::NoKey => Status::new(503, "ServiceUnavailable", message),
        Error::Invalid(_) => Status::bad_request(message),
        Error::Conflict { .. } => Status::new(409, "Conflict", message),
        Error::NotFound(_) | Error::NotInClouddriver(_) => Status::not_found_message(message),
        Error::NotMigratable(_) => Status::new(422, "Invalid", message),
        Error::Clouddriver(_) => Status::new(502, "BadGateway", message),
        Error::Crypto(_) => Status::new(500, "InternalError", message),
        Error::Store(_) => Status::new(503, "ServiceUnavailable", message),
    };
    status_response(&status)
}

/// Why a request body was not read.
pub(crate) enum BodyError {
    /// The body stream failed (400).
    Cut,
    /// Larger than [`MAX_BODY`] (413).
    TooLarge,
    /// Not the expected JSON (400): a message that never quotes a value.
    Json(String),
}

impl BodyError {
    /// The message for the answer.
    pub(crate) fn message(&self) -> String {
        match self {
            Self::Cut => "the request body was cut".into(),
            Self::TooLarge => format!("the body must be JSON of at most {MAX_BODY} bytes"),
            Self::Json(what) => format!("request body: {what}"),
        }
    }
}

/// Reads a JSON body of at most [`MAX_BODY`] bytes; an empty body is
/// `default` when one is given.
pub(crate) async fn read_body<B, T>(body: B, default: Option<T>) -> Result<T, BodyError>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display + Send,
    T: serde::de::DeserializeOwned,
{
    let mut body = body;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err(BodyError::Cut);
        };
        if let Some(data) = frame.data_ref() {
            if bytes.len() + data.len() > MAX_BODY {
                return Err(BodyError::TooLarge);
            }
            bytes.extend_from_slice(data);
        }
    }
    if bytes.is_empty()
        && let Some(default) = default
    {
        return Ok(default);
    }
    // serde's messages for wrong types quote the value, which may be a
    // credential: only unknown and missing fields are named.
    serde_json::from_slice(&bytes).map_err(|e| {
        let message = e.to_string();
        let named = ["unknown field", "missing field"];
        BodyError::Json(if named.iter().any(|n| message.starts_with(n)) {
            message
        } else {
            format!(
                "not the expected JSON object (line {}, column {})",
                e.line(),
                e.column()
            )
        })
    })
}

/// [`read_body`], its errors as `metav1.Status` answers.
async fn body<B, T>(body: B, default: Option<T>) -> Result<T, Response<Body>>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display + Send,
    T: serde::de::DeserializeOwned,
{
    read_body(body, default).await.map_err(|e| {
        let message = e.message();
        status_response(&match e {
            BodyError::TooLarge => Status::new(413, "RequestEntityTooLarge", message),
            BodyError::Cut | BodyError::Json(_) => Status::bad_request(message),
        })
    })
}

/// Answers a request [`serves`] accepts.
pub async fn handle<B>(dynamic: &Dynamic, req: Request<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display + Send,
{
    let Some(route) = route(req.method(), req.uri().path()) else {
        return status_response(&Status::not_found_message("no such dynamic accounts route"));
    };
    let result = match route {
        Route::List => dynamic.list().await.map(|all| json(StatusCode::OK, &all)),
        Route::Delete(name) => dynamic
            .delete(&name)
            .await
            .map(|v| json(StatusCode::OK, &v)),
        Route::Create => {
            let request: CreateRequest = match body(req.into_body(), None).await {
                Ok(r) => r,
                Err(resp) => return resp,
            };
            dynamic
                .create(request)
                .await
                .map(|v| json(StatusCode::CREATED, &v))
        }
        Route::Migrate(name) => {
            let request: MigrateRequest =
                match body(req.into_body(), Some(MigrateRequest::default())).await {
                    Ok(r) => r,
                    Err(resp) => return resp,
                };
            dynamic
                .migrate(&name, request)
                .await
                .map(|v| json(StatusCode::CREATED, &v))
        }
    };
    result.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "dynamic accounts request refused");
        error(&e)
    })
}
