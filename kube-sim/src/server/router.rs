//! Routing one request: discovery, OpenAPI, and the resource verbs (list, watch, get,
//! create, update, patch, delete, status and scale subresources). Every failure leaves
//! here as a `metav1.Status` response.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde_json::{Value, json};
use spinlink_kube_api::media::accepts;
use tokio_util::sync::CancellationToken;

use super::authz;
use super::custom_table::any_table;
use super::discovery;
use super::logs::{self, LogOptions};
use super::watch::{self, WatchRequest};
use crate::error::Status;
use crate::fixtures;
use crate::patch::{self, PatchType};
use crate::protobuf;
use crate::resources::ResourceInfo;
use crate::selector::Selectors;
use crate::store::meta::{scale_of, set_scale_replicas};
use crate::store::{DeleteOptions, ListQuery, Sim, Subresource, WatchFilter, WriteOptions};
use crate::table::{self, IncludeObject};

/// An object as `res` presents it: custom resources are stored in whichever version
/// wrote them and served in the version asked for (conversion strategy `None`).
fn present(res: &ResourceInfo, mut obj: Value) -> Value {
    if res.custom.is_some() && obj["apiVersion"] != res.api_version && obj.get("kind").is_some() {
        obj["apiVersion"] = json!(res.api_version);
    }
    obj
}

fn object_response(
    code: StatusCode,
    res: &ResourceInfo,
    r: Result<Value, Status>,
) -> Response<Body> {
    result_response(code, r.map(|o| present(res, o)))
}

/// Largest request body accepted.
pub const MAX_BODY: usize = 8 * 1024 * 1024;

/// Content type of aggregated discovery v2 (what the real server answers with).
pub const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// Content type of the protobuf OpenAPI v2 document, as the API server
/// answers it (kube-openapi's dotted form: Go's `mime.ParseMediaType`, which
/// kubectl runs on responses, rejects the `@`).
pub const OPENAPI_V2_PB: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
/// The older form clients still ask for (kubectl up to 1.28).
pub const OPENAPI_V2_PB_DEPRECATED: &str =
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

/// Response body type: whole JSON documents or a watch stream.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// What every request handler shares.
pub(crate) struct Ctx {
    pub sim: Sim,
    /// Cancelled when the server shuts down; ends watches.
    pub shutdown: CancellationToken,
}

fn full(code: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed());
    *resp.status_mut() = code;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

/// `v` as the API server writes JSON ([`spinlink_kube_api::json`]).
fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    full(code, "application/json", spinlink_kube_api::json::encode(v))
}

/// A recorded JSON document (kept indented in `fixtures/`) as the server
/// sent it.
fn json_document(bytes: &[u8]) -> Response<Body> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(_) => status_response(&Status::no_route()),
    }
}

/// The recorded JSON document at `rel` ([`json_document`]).
fn json_fixture(rel: &str) -> Response<Body> {
    match fixtures::file(rel) {
        Some(b) => json_document(b),
        None => status_response(&Status::no_route()),
    }
}

fn status_response(s: &Status) -> Response<Body> {
    s.to_http().map(|b| Full::new(b).boxed())
}

fn result_response(code: StatusCode, r: Result<Value, Status>) -> Response<Body> {
    match r {
        Ok(v) => json_response(code, &v),
        Err(s) => status_response(&s),
    }
}

fn fixture(rel: &str, content_type: &str) -> Response<Body> {
    match fixtures::file(rel) {
        Some(b) => full(StatusCode::OK, content_type, Bytes::from_static(b)),
        None => status_response(&Status::no_route()),
    }
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> &str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Parsed query parameters (the last value of a repeated key wins; `dryRun` is any).
struct Query {
    params: HashMap<String, String>,
    dry_run: bool,
}

impl Query {
    fn parse(q: Option<&str>) -> Self {
        let mut params = HashMap::new();
        let mut dry_run = false;
        for (k, v) in url::form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
            if k == "dryRun" && v == "All" {
                dry_run = true;
            }
            params.insert(k.into_owned(), v.into_owned());
        }
        Query { params, dry_run }
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.params.get(k).map(String::as_str)
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }

    fn write_options(&self) -> WriteOptions {
        WriteOptions {
            dry_run: self.dry_run,
            field_manager: self.get("fieldManager").map(str::to_string),
            controllers: true,
            ..Default::default()
        }
    }
}

/// Handles one request. Its answer's `Cache-Control` is the API server's, as
/// recorded (`errors/requests.json`, `apply/*-get-openapi-v3-api-v1`):
/// `public, immutable` for an OpenAPI v3 document named by its `hash`, with
/// `Vary: Accept`; aggregated discovery sets its own
/// ([`aggregated_discovery`]); else, unless the answer set one,
/// [`spinlink_kube_api::NO_CACHE`]. (The server also sends an `Etag` with
/// hashed OpenAPI documents; kube-sim does not.)
pub(crate) async fn handle(ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Body> {
    let hashed_openapi = req.uri().path().starts_with("/openapi/v3/")
        && Query::parse(req.uri().query()).get("hash").is_some();
    let mut resp = answer(ctx, req).await;
    let public = hashed_openapi && resp.status() == StatusCode::OK;
    let headers = resp.headers_mut();
    if public {
        headers.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("public, immutable"),
        );
        headers.insert(header::VARY, header::HeaderValue::from_static("Accept"));
    } else {
        headers
            .entry(header::CACHE_CONTROL)
            .or_insert(header::HeaderValue::from_static(
                spinlink_kube_api::NO_CACHE,
            ));
    }
    resp
}

async fn answer(ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query = Query::parse(parts.uri.query());
    let accept = header_str(&parts.headers, header::ACCEPT).to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    tracing::trace!(method = %parts.method, %path, "request");
    let authorization = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if !ctx.sim.authenticates(authorization) {
        return status_response(&Status::new(401, "Unauthorized", "Unauthorized"));
    }
    let user = match authz::requester(&parts.headers) {
        Ok(user) => user,
        Err(s) => return status_response(&s),
    };
    if let Some(refusal) = spinlink_kube_api::media::refusal(&path, &accept) {
        return status_response(&refusal);
    }
    let is_get = parts.method == Method::GET;
    match segs.as_slice() {
        ["version"] if is_get => version(&ctx.sim),
        ["healthz" | "livez" | "readyz"] if is_get => {
            full(StatusCode::OK, "text/plain; charset=utf-8", "ok")
        }
        ["openapi", "v2"] if is_get => {
            if accepts(&accept, OPENAPI_V2_PB, &[])
                || accepts(&accept, OPENAPI_V2_PB_DEPRECATED, &[])
            {
                fixture("openapi/v2.pb", OPENAPI_V2_PB)
            } else {
                fixture("openapi/v2.json", "application/json")
            }
        }
        ["openapi", "v3", rest @ ..] if is_get => {
            // The index names documents with `?hash=`; any hash serves the document.
            match fixtures::openapi_v3(&rest.join("/")) {
                Some(b) => full(StatusCode::OK, "application/json", Bytes::from_static(b)),
                None => status_response(&Status::no_route()),
            }
        }
        ["api"] if is_get => discovery_root(&accept, "api", &parts.headers),
        ["apis"] if is_get => {
            let aggregated = wants_aggregated(&accept);
            match discovery::apis(&ctx.sim.custom_resources(), aggregated) {
                Some(doc) if aggregated => {
                    aggregated_discovery(spinlink_kube_api::json::encode(&doc), &parts.headers)
                }
                Some(doc) => json_response(StatusCode::OK, &doc),
                None => status_response(&Status::no_route()),
            }
        }
        ["apis", group] if is_get => match discovery::group(&ctx.sim.custom_resources(), group) {
            Some(doc) => json_response(StatusCode::OK, &doc),
            None => status_response(&Status::no_route()),
        },
        ["api", "v1", rest @ ..] => {
            resource(&ctx, &user, &parts, body, &query, &accept, "", "v1", rest).await
        }
        ["apis", group, version, rest @ ..] => {
            resource(
                &ctx, &user, &parts, body, &query, &accept, group, version, rest,
            )
            .await
        }
        [] if is_get => json_response(
            StatusCode::OK,
            &json!({"paths": ["/api", "/api/v1", "/apis", "/openapi/v2", "/openapi/v3", "/version"]}),
        ),
        _ => status_response(&Status::no_route()),
    }
}

/// `/version`, indented whoever asks (the recorded answer,
/// `errors/requests.json`; the server writes it with `json.MarshalIndent`,
/// as the fixture holds it).
fn version(sim: &Sim) -> Response<Body> {
    let Some(bytes) = fixtures::file("discovery/version.json") else {
        return status_response(&Status::no_route());
    };
    let Some(minor) = sim.config().reported_minor else {
        return full(
            StatusCode::OK,
            "application/json",
            Bytes::from_static(bytes),
        );
    };
    let mut v: Value = serde_json::from_slice(bytes).unwrap_or_default();
    v["minor"] = json!(minor.to_string());
    v["emulationMinor"] = json!(minor.to_string());
    v["minCompatibilityMinor"] = json!(minor.saturating_sub(1).to_string());
    v["gitVersion"] = json!(format!("v1.{minor}.0"));
    full(
        StatusCode::OK,
        "application/json",
        spinlink_kube_api::json::encode_indented(&v),
    )
}

fn wants_aggregated(accept: &str) -> bool {
    accepts(
        accept,
        "application/json",
        &["g=apidiscovery.k8s.io", "v=v2", "as=APIGroupDiscoveryList"],
    )
}

/// Aggregated discovery `document` with the API server's `ETag` and cache
/// headers ([`spinlink_kube_api::discovery`]); `304` with no body when the
/// request's `If-None-Match` names it.
fn aggregated_discovery(document: impl Into<Bytes>, headers: &HeaderMap) -> Response<Body> {
    use spinlink_kube_api::discovery;
    let document = document.into();
    let etag = discovery::etag(&document);
    let mut resp = match &etag {
        Some(tag) if discovery::not_modified(headers, tag) => {
            let mut resp = Response::new(Full::new(Bytes::new()).boxed());
            *resp.status_mut() = StatusCode::NOT_MODIFIED;
            resp
        }
        _ => full(StatusCode::OK, AGGREGATED_V2, document),
    };
    discovery::cache_headers(resp.headers_mut(), etag.as_ref());
    resp
}

fn discovery_root(accept: &str, root: &str, headers: &HeaderMap) -> Response<Body> {
    if wants_aggregated(accept) {
        let doc = fixtures::file(&format!("discovery/{root}.aggregated.json"))
            .and_then(|b| serde_json::from_slice::<Value>(b).ok());
        match doc {
            Some(doc) => aggregated_discovery(spinlink_kube_api::json::encode(&doc), headers),
            None => status_response(&Status::no_route()),
        }
    } else {
        json_fixture(&format!("discovery/{root}.json"))
    }
}

async fn read_body(body: Incoming) -> Result<Bytes, Status> {
    match Limited::new(body, MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Status::too_large()),
        Err(e) => Err(Status::bad_request(format!(
            "reading the request body failed: {e}"
        ))),
    }
}

/// Decodes an object body: JSON, YAML, or protobuf for built-in kinds.
fn decode_object(res: &ResourceInfo, content_type: &str, body: &[u8]) -> Result<Value, Status> {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if protobuf::is_media_type(essence) {
        return decode_protobuf(res, body);
    }
    let parsed: Result<Value, String> = match essence {
        "application/yaml" => serde_norway::from_slice(body).map_err(|e| e.to_string()),
        "" | "application/json" | "*/*" => serde_json::from_slice(body).map_err(|e| e.to_string()),
        other => return Err(Status::unsupported_media_type(other)),
    };
    match parsed {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(Status::bad_request(
            "the body of the request must be a JSON object",
        )),
        Err(e) => Err(Status::bad_request(format!(
            "couldn't get version/kind; json parse error: {e}"
        ))),
    }
}

/// A protobuf object body. Custom resources have no protobuf form: the API
/// server 1.36 drops the connection on one (a nil pointer in its decoder);
/// kube-sim answers the 415 it gives any other body it cannot read.
fn decode_protobuf(res: &ResourceInfo, body: &[u8]) -> Result<Value, Status> {
    if res.custom.is_some() {
        return Err(Status::unknown_body_format());
    }
    match protobuf::decode(body) {
        Ok(obj) => Ok(obj),
        Err(protobuf::Error::UnknownKind { .. }) => Err(Status::unknown_body_format()),
        Err(e) => Err(Status::bad_request(format!(
            "the body of the request could not be decoded as protobuf: {e}"
        ))),
    }
}

/// How an answer is written, from the request's Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Json,
    Protobuf,
    /// Nothing acceptable: 406.
    None,
}

/// The first media range of `accept` (in the client's order, highest `q`
/// first) that `res` can be written as. Protobuf is for built-in kinds only
/// and never for Tables (the API server answers those 406); a custom
/// resource asked for protobuf alone is refused as the API server does.
fn negotiate(accept: &str, res: &ResourceInfo) -> Encoding {
    if accept.trim().is_empty() || table::wants_table(accept) {
        return Encoding::Json;
    }
    let mut ranges: Vec<(f32, &str)> = accept
        .split(',')
        .map(|range| {
            let mut parts = range.split(';').map(str::trim);
            let essence = parts.next().unwrap_or("");
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            (q, essence)
        })
        .collect();
    // Stable: equal weights keep the client's order.
    ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut protobuf_refused = false;
    for (q, essence) in ranges {
        if q <= 0.0 {
            continue;
        }
        match essence.to_ascii_lowercase().as_str() {
            protobuf::MEDIA_TYPE if res.custom.is_none() => return Encoding::Protobuf,
            protobuf::MEDIA_TYPE => protobuf_refused = true,
            "application/json" | "application/*" | "*/*" | "application/yaml" => {
                return Encoding::Json;
            }
            _ => {}
        }
    }
    if protobuf_refused {
        Encoding::None
    } else {
        // kube-sim has always answered JSON to anything else.
        Encoding::Json
    }
}

/// Rewrites a JSON answer (object, list or Status) as protobuf. Answers
/// without a protobuf form (a kind whose schema is not vendored) stay JSON,
/// which every client that asks for protobuf also accepts.
async fn into_protobuf(resp: Response<Body>) -> Response<Body> {
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/json");
    if !json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let Ok(collected) = body.collect().await;
    let bytes = collected.to_bytes();
    let encoded = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| protobuf::encode(&v).ok());
    let mut resp = Response::from_parts(parts, Full::new(bytes).boxed());
    if let Some(encoded) = encoded {
        *resp.body_mut() = Full::new(Bytes::from(encoded)).boxed();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(protobuf::MEDIA_TYPE),
        );
    }
    resp
}

/// A Status in protobuf, as the API server writes a refusal of a protobuf
/// request.
fn protobuf_status(s: &Status) -> Response<Body> {
    let json = serde_json::to_value(s).unwrap_or_default();
    match protobuf::encode(&json) {
        Ok(bytes) => {
            let code = StatusCode::from_u16(s.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            full(code, protobuf::MEDIA_TYPE, bytes)
        }
        Err(_) => status_response(s),
    }
}

#[allow(clippy::too_many_arguments)]
async fn resource(
    ctx: &Ctx,
    user: &authz::User,
    parts: &http::request::Parts,
    body: Incoming,
    query: &Query,
    accept: &str,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Response<Body> {
    if rest.is_empty() {
        if parts.method != Method::GET {
            return status_response(&Status::method_not_allowed());
        }
        return if group.is_empty() {
            json_fixture("discovery/api_v1.json")
        } else {
            match fixtures::group_version(group, version) {
                Some(b) => json_document(b),
                None => match discovery::group_version(&ctx.sim.custom_resources(), group, version)
                {
                    Some(doc) => json_response(StatusCode::OK, &doc),
                    None => status_response(&Status::no_route()),
                },
            }
        };
    }
    let (namespace, plural, tail): (Option<&str>, &str, &[&str]) = match rest {
        ["namespaces", ns, plural, tail @ ..] if !matches!(*plural, "status" | "finalize") => {
            (Some(ns), plural, tail)
        }
        [plural, tail @ ..] => (None, plural, tail),
        [] => return status_response(&Status::no_route()),
    };
    // Create-only, so not among the stored resources.
    if (group, version, plural) == ("authorization.k8s.io", "v1", "selfsubjectaccessreviews")
        && namespace.is_none()
        && tail.is_empty()
        && parts.method == Method::POST
    {
        let review = match read_body(body).await {
            Ok(bytes) => serde_json::from_slice::<Value>(&bytes)
                .map_err(|e| Status::bad_request(format!("the review is not JSON: {e}"))),
            Err(s) => Err(s),
        };
        return match review {
            Ok(review) => json_response(
                StatusCode::CREATED,
                &authz::self_subject_access_review(&ctx.sim, user, &review),
            ),
            Err(s) => status_response(&s),
        };
    }
    let Some(res) = ctx.sim.find_resource(group, version, plural) else {
        return status_response(&Status::no_route());
    };
    let encoding = negotiate(accept, res);
    if encoding == Encoding::None {
        return protobuf_status(&Status::not_acceptable());
    }
    let attrs = authz::Attributes {
        verb: spinlink_kube_api::request_verb(&parts.method, !tail.is_empty(), query.flag("watch"))
            .unwrap_or("unknown"),
        group,
        resource: plural,
        subresource: tail.get(1).copied(),
        namespace,
        name: tail.first().copied(),
    };
    if authz::decide(&ctx.sim, user, &attrs).is_none() {
        let mut resp = status_response(&authz::forbidden(res, user, &attrs));
        resp.headers_mut().insert(
            "x-content-type-options",
            http::HeaderValue::from_static("nosniff"),
        );
        return if encoding == Encoding::Protobuf {
            into_protobuf(resp).await
        } else {
            resp
        };
    }
    // Watches and logs stream as they are (client-go watches in JSON).
    let streams = query.flag("watch") || tail.get(1) == Some(&"log");
    let resp = resource_verb(ctx, parts, body, query, accept, res, namespace, tail).await;
    if encoding == Encoding::Protobuf && !streams {
        into_protobuf(resp).await
    } else {
        resp
    }
}

#[allow(clippy::too_many_arguments)]
async fn resource_verb(
    ctx: &Ctx,
    parts: &http::request::Parts,
    body: Incoming,
    query: &Query,
    accept: &str,
    res: &'static ResourceInfo,
    namespace: Option<&str>,
    tail: &[&str],
) -> Response<Body> {
    if tail.len() > 2
        || (namespace.is_some() && !res.namespaced)
        || (namespace.is_none() && res.namespaced && !tail.is_empty())
    {
        return status_response(&Status::no_route());
    }
    let name = tail.first().copied();
    let sub = tail.get(1).copied();
    let table =
        table::wants_table(accept).then(|| IncludeObject::parse(query.get("includeObject")));
    let content_type = header_str(&parts.headers, header::CONTENT_TYPE).to_string();
    let method = parts.method.clone();

    let needs_body = matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let bytes = if needs_body {
        match read_body(body).await {
            Ok(b) => b,
            Err(s) => return status_response(&s),
        }
    } else {
        Bytes::new()
    };

    match (method, name, sub) {
        (Method::GET, None, None) => {
            if query.flag("watch") {
                watch_or_status(ctx, res, namespace, query, table)
            } else {
                list(ctx, res, namespace, query, table)
            }
        }
        (Method::POST, None, None) => {
            let obj = match decode_object(res, &content_type, &bytes) {
                Ok(o) => o,
                Err(s) => return status_response(&s),
            };
            object_response(
                StatusCode::CREATED,
                res,
                ctx.sim
                    .create_in(res, namespace, obj, &query.write_options()),
            )
        }
        (Method::GET, Some(name), None) => match ctx.sim.get_in(res, namespace, name) {
            Ok(obj) => match table {
                Some(include) => {
                    let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"]});
                    let t = any_table(res, [&present(res, obj)], meta, include);
                    json_response(StatusCode::OK, &t)
                }
                None => json_response(StatusCode::OK, &present(res, obj)),
            },
            Err(s) => status_response(&s),
        },
        (Method::PUT, Some(name), None | Some("status")) => {
            if sub == Some("status") && !res.status_subresource {
                return status_response(&Status::no_route());
            }
            let obj = match decode_object(res, &content_type, &bytes) {
                Ok(o) => o,
                Err(s) => return status_response(&s),
            };
            let mut opts = query.write_options();
            if sub == Some("status") {
                opts.subresource = Subresource::Status;
            }
            object_response(
                StatusCode::OK,
                res,
                ctx.sim.replace_in(res, namespace, name, obj, &opts),
            )
        }
        (Method::PATCH, Some(name), None | Some("status")) => {
            if sub == Some("status") && !res.status_subresource {
                return status_response(&Status::no_route());
            }
            let subresource = if sub == Some("status") {
                Subresource::Status
            } else {
                Subresource::Main
            };
            patch(
                ctx,
                res,
                namespace,
                name,
                &content_type,
                &bytes,
                query,
                subresource,
            )
        }
        (Method::GET, Some(name), Some("status")) if res.status_subresource => {
            object_response(StatusCode::OK, res, ctx.sim.get_in(res, namespace, name))
        }
        (Method::GET, Some(name), Some("log")) if res.custom.is_none() && res.plural == "pods" => {
            match ctx.sim.get_in(res, namespace, name) {
                Ok(pod) => logs::respond(
                    ctx.sim.clone(),
                    res,
                    pod,
                    log_options(query),
                    ctx.shutdown.clone(),
                ),
                Err(s) => status_response(&s),
            }
        }
        (Method::DELETE, Some(name), None) => {
            let opts = match delete_options(&content_type, &bytes, query) {
                Ok(o) => o,
                Err(s) => return status_response(&s),
            };
            result_response(
                StatusCode::OK,
                ctx.sim.delete_in(res, namespace, name, &opts),
            )
        }
        (m, Some(name), Some("scale")) if res.scale_subresource => {
            scale(ctx, res, namespace, name, m, &content_type, &bytes, query)
        }
        (_, _, None) => status_response(&Status::method_not_allowed()),
        _ => status_response(&Status::no_route()),
    }
}

fn selectors(res: &ResourceInfo, query: &Query) -> Result<Selectors, Status> {
    Selectors::parse(
        res.api(),
        query.get("labelSelector"),
        query.get("fieldSelector"),
    )
    .map_err(|e| Status::bad_request(e.to_string()))
}

fn parse_rv(s: Option<&str>) -> Result<Option<u64>, Status> {
    match s {
        None | Some("") | Some("0") => Ok(None),
        Some(s) => s
            .parse::<u64>()
            .map(Some)
            .map_err(|_| Status::bad_request(format!("invalid resource version: {s:?}"))),
    }
}

fn list(
    ctx: &Ctx,
    res: &'static ResourceInfo,
    namespace: Option<&str>,
    query: &Query,
    table: Option<IncludeObject>,
) -> Response<Body> {
    let sel = match selectors(res, query) {
        Ok(s) => s,
        Err(s) => return status_response(&s),
    };
    let exact_rv = if query.get("resourceVersionMatch") == Some("Exact") {
        match parse_rv(query.get("resourceVersion")) {
            Ok(rv) => rv,
            Err(s) => return status_response(&s),
        }
    } else {
        None
    };
    let limit = query.get("limit").and_then(|l| l.parse::<usize>().ok());
    let q = ListQuery {
        res,
        namespace,
        selectors: &sel,
        limit,
        continue_token: query.get("continue"),
        exact_rv,
    };
    let page = match ctx.sim.list_page(&q) {
        Ok(p) => p,
        Err(s) => return status_response(&s),
    };
    let mut meta = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(c) = &page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(n) = page.remaining {
        meta["remainingItemCount"] = json!(n);
    }
    if let Some(include) = table {
        return json_response(
            StatusCode::OK,
            &any_table(res, page.items.iter().map(|o| &**o), meta, include),
        );
    }
    // Items of a built-in kind's list carry no kind/apiVersion, as the real
    // server sends them (its typed lists: `authz/impersonate-list-allowed`);
    // a custom resource's list is unstructured and its items keep them
    // (apimachinery's `UnstructuredList.UnstructuredContent`).
    let items: Vec<Value> = page
        .items
        .iter()
        .map(|o| {
            let mut o = (**o).clone();
            if let (Some(m), None) = (o.as_object_mut(), res.custom) {
                m.shift_remove("kind");
                m.shift_remove("apiVersion");
            }
            o
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"kind": res.list_kind(), "apiVersion": res.api_version, "metadata": meta, "items": items}),
    )
}

fn watch_or_status(
    ctx: &Ctx,
    res: &'static ResourceInfo,
    namespace: Option<&str>,
    query: &Query,
    table: Option<IncludeObject>,
) -> Response<Body> {
    let selectors = match selectors(res, query) {
        Ok(s) => s,
        Err(s) => return status_response(&s),
    };
    let send_initial = query.flag("sendInitialEvents");
    let from = match parse_rv(query.get("resourceVersion")) {
        Ok(rv) => rv,
        Err(s) => return status_response(&s),
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let req = WatchRequest {
        filter: WatchFilter {
            res,
            namespace: namespace.map(str::to_string),
            selectors,
        },
        from: if send_initial { None } else { from },
        send_initial,
        bookmarks: query.flag("allowWatchBookmarks"),
        bookmark_interval: ctx.sim.config().bookmark_interval,
        timeout,
        table,
    };
    watch::respond(ctx.sim.clone(), req, ctx.shutdown.clone())
}

#[allow(clippy::too_many_arguments)]
fn patch(
    ctx: &Ctx,
    res: &'static ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    content_type: &str,
    bytes: &[u8],
    query: &Query,
    subresource: Subresource,
) -> Response<Body> {
    let Some(pt) = PatchType::from_content_type(content_type) else {
        return status_response(&Status::unsupported_media_type(content_type));
    };
    let body = match patch::parse_body(pt, bytes) {
        Ok(b) => b,
        Err(s) => return status_response(&s),
    };
    let existed = ctx.sim.get_in(res, namespace, name).is_ok();
    let r = ctx.sim.patch_in(
        res,
        namespace,
        name,
        pt,
        &body,
        subresource,
        &query.write_options(),
    );
    let code = if pt == PatchType::Apply && !existed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    object_response(code, res, r)
}

/// Turns the current `Scale` into the wanted one.
type ScaleChange = Box<dyn FnOnce(&Value) -> Result<Value, Status>>;

#[allow(clippy::too_many_arguments)]
fn scale(
    ctx: &Ctx,
    res: &'static ResourceInfo,
    namespace: Option<&str>,
    name: &str,
    method: Method,
    content_type: &str,
    bytes: &[u8],
    query: &Query,
) -> Response<Body> {
    let change: ScaleChange = match method {
        Method::GET => {
            return result_response(
                StatusCode::OK,
                ctx.sim
                    .get_in(res, namespace, name)
                    .map(|o| scale_of(res, &o)),
            );
        }
        Method::PUT => match decode_object(res, content_type, bytes) {
            Ok(new_scale) => Box::new(move |_: &Value| Ok(new_scale)),
            Err(s) => return status_response(&s),
        },
        Method::PATCH => {
            let Some(pt) = PatchType::from_content_type(content_type) else {
                return status_response(&Status::unsupported_media_type(content_type));
            };
            match patch::parse_body(pt, bytes) {
                Ok(p) => Box::new(move |current: &Value| patch::apply_patch(current, pt, &p)),
                Err(s) => return status_response(&s),
            }
        }
        _ => return status_response(&Status::method_not_allowed()),
    };
    let opts = query.write_options();
    let r = ctx.sim.modify_in(res, namespace, name, &opts, |obj| {
        let current = scale_of(res, obj);
        let wanted = change(&current)?;
        let rv = wanted["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default();
        if !rv.is_empty() && Some(rv) != current["metadata"]["resourceVersion"].as_str() {
            return Err(Status::conflict(res.api(), name));
        }
        let Some(replicas) = wanted["spec"]["replicas"].as_i64().filter(|r| *r >= 0) else {
            return Err(Status::invalid(
                "Scale",
                name,
                "spec.replicas",
                "FieldValueInvalid",
                "Invalid value: must be greater than or equal to 0",
            ));
        };
        let mut new = obj.clone();
        set_scale_replicas(res, &mut new, replicas);
        Ok(new)
    });
    result_response(StatusCode::OK, r.map(|o| scale_of(res, &o)))
}

fn delete_options(
    content_type: &str,
    bytes: &[u8],
    query: &Query,
) -> Result<DeleteOptions, Status> {
    let mut opts = DeleteOptions {
        dry_run: query.dry_run,
        orphan: query.get("propagationPolicy") == Some("Orphan")
            || query.get("orphanDependents") == Some("true"),
        foreground: query.get("propagationPolicy") == Some("Foreground"),
        grace_period: query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()),
        ..Default::default()
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(opts);
    }
    let body: Value = if protobuf::is_media_type(content_type) {
        protobuf::decode(bytes)
            .map_err(|e| Status::bad_request(format!("couldn't decode DeleteOptions: {e}")))?
    } else {
        serde_json::from_slice(bytes)
            .map_err(|e| Status::bad_request(format!("couldn't decode DeleteOptions: {e}")))?
    };
    if body["propagationPolicy"] == "Orphan" || body["orphanDependents"] == true {
        opts.orphan = true;
    }
    if body["propagationPolicy"] == "Foreground" {
        opts.foreground = true;
    }
    if let Some(g) = body["gracePeriodSeconds"].as_i64() {
        opts.grace_period = Some(g);
    }
    if body["dryRun"]
        .as_array()
        .is_some_and(|d| d.iter().any(|x| x == "All"))
    {
        opts.dry_run = true;
    }
    opts.uid = body["preconditions"]["uid"].as_str().map(str::to_string);
    opts.resource_version = body["preconditions"]["resourceVersion"]
        .as_str()
        .map(str::to_string);
    Ok(opts)
}

fn log_options(query: &Query) -> LogOptions {
    LogOptions {
        container: query.get("container").map(str::to_string),
        follow: query.flag("follow"),
        tail_lines: query.get("tailLines").and_then(|t| t.parse().ok()),
        timestamps: query.flag("timestamps"),
        limit_bytes: query.get("limitBytes").and_then(|t| t.parse().ok()),
        previous: query.flag("previous"),
    }
}
