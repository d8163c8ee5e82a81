//! `metav1.Status`, the body of every failed API request, built with the `reason`,
//! `code`, `details` and `message` wording a real kube-apiserver answers with (see
//! `kube-sim/fixtures/errors/`). Start at [`Status`]; its constructors are named after
//! the failure (`not_found`, `conflict`, `bad_request`, ...).

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Resource;

/// A Kubernetes `metav1.Status`, as returned for every failed API request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error("{code} {reason}: {message}")]
pub struct Status {
    /// Always `Status`.
    pub kind: String,
    /// Always `v1`.
    pub api_version: String,
    /// Always empty.
    #[serde(default)]
    pub metadata: Value,
    /// `Success` or `Failure`.
    pub status: String,
    /// Human-readable description, worded as the real server words it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Machine-readable reason (`NotFound`, `AlreadyExists`, `Conflict`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The object the status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
    /// HTTP status code.
    #[serde(default)]
    pub code: u16,
}

/// `metav1.StatusDetails`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    /// Name of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// API group of the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Resource (plural) or kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// UID of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Individual field errors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    /// Seconds the client should wait before trying again, as the answer's
    /// `Retry-After` says too (the recorded 429
    /// `errors/429-storage-reinitializing.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
}

/// `metav1.StatusCause`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusCause {
    /// Machine-readable cause, e.g. `FieldValueInvalid`.
    pub reason: String,
    /// Description of the cause.
    pub message: String,
    /// The field at fault, e.g. `metadata.name`.
    pub field: String,
}

impl Status {
    /// A failure with any code, reason and message, without `details`.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self::failure(code, reason, message.into(), None)
    }

    fn failure(code: u16, reason: &str, message: String, details: Option<StatusDetails>) -> Self {
        Status {
            kind: "Status".into(),
            api_version: "v1".into(),
            metadata: Value::Object(Default::default()),
            status: "Failure".into(),
            message,
            reason: reason.into(),
            details,
            code,
        }
    }

    fn resource_details(res: Resource<'_>, name: &str) -> StatusDetails {
        StatusDetails {
            name: Some(name.to_string()),
            group: (!res.group.is_empty()).then(|| res.group.to_string()),
            kind: Some(res.plural.to_string()),
            ..Default::default()
        }
    }

    /// A `Success` status about a deleted object, as DELETE returns it.
    pub fn success_deleted(res: Resource<'_>, name: &str, uid: &str) -> Self {
        let mut details = Self::resource_details(res, name);
        details.uid = Some(uid.to_string());
        Status {
            status: "Success".into(),
            ..Self::failure(200, "", String::new(), Some(details))
        }
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(res: Resource<'_>, name: &str) -> Self {
        Self::failure(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified()),
            Some(Self::resource_details(res, name)),
        )
    }

    /// 404 NotFound with a message of our own and no `details` (an unknown account).
    pub fn not_found_message(message: impl Into<String>) -> Self {
        Self::new(404, "NotFound", message)
    }

    /// 404 for a path the server does not serve.
    pub fn no_route() -> Self {
        Self::failure(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
            Some(StatusDetails::default()),
        )
    }

    /// 403 as RBAC refuses a request: `configmaps "x" is forbidden: User "u"
    /// cannot get resource "configmaps" in API group "" in the namespace "n"`
    /// (`at the cluster scope` without a namespace; the subresource joins the
    /// resource as `deployments/scale`).
    pub fn forbidden(
        res: Resource<'_>,
        name: Option<&str>,
        subresource: Option<&str>,
        user: &str,
        verb: &str,
        namespace: Option<&str>,
    ) -> Self {
        let object = match name {
            Some(name) => format!("{} \"{name}\"", res.qualified()),
            None => res.qualified(),
        };
        let resource = match subresource {
            Some(sub) => format!("{}/{sub}", res.plural),
            None => res.plural.to_string(),
        };
        let scope = match namespace {
            Some(ns) if !ns.is_empty() => format!("in the namespace \"{ns}\""),
            _ => "at the cluster scope".to_string(),
        };
        let details = StatusDetails {
            name: name.map(str::to_string),
            group: (!res.group.is_empty()).then(|| res.group.to_string()),
            kind: Some(res.plural.to_string()),
            ..Default::default()
        };
        Self::failure(
            403,
            "Forbidden",
            format!(
                "{object} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" \
                 in API group \"{}\" {scope}",
                res.group
            ),
            Some(details),
        )
    }

    /// 409 `configmaps "x" already exists`.
    pub fn already_exists(res: Resource<'_>, name: &str) -> Self {
        Self::failure(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified()),
            Some(Self::resource_details(res, name)),
        )
    }

    /// 409 Conflict on a stale resourceVersion.
    pub fn conflict(res: Resource<'_>, name: &str) -> Self {
        Self::failure(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                res.qualified()
            ),
            Some(Self::resource_details(res, name)),
        )
    }

    /// 422 Invalid with one cause.
    pub fn invalid(kind: &str, name: &str, field: &str, cause_reason: &str, detail: &str) -> Self {
        let cause = StatusCause {
            reason: cause_reason.into(),
            message: detail.into(),
            field: field.into(),
        };
        Self::failure(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {field}: {detail}"),
            Some(StatusDetails {
                name: (!name.is_empty()).then(|| name.to_string()),
                kind: Some(kind.to_string()),
                causes: vec![cause],
                ..Default::default()
            }),
        )
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::failure(400, "BadRequest", message.into(), None)
    }

    /// 410 Expired (too old resourceVersion or continue token).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::failure(410, "Expired", message.into(), None)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> Self {
        Self::failure(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
            Some(StatusDetails::default()),
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::failure(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/apply-patch+yaml, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json; got {content_type:?}"
            ),
            None,
        )
    }

    /// 415 for an object body in a media type the resource does not
    /// decode, worded as the API server words it for a create.
    pub fn unknown_body_format() -> Self {
        Self::failure(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf".into(),
            None,
        )
    }

    /// 406 for an Accept header naming nothing the resource can be written
    /// as (protobuf alone, for a custom resource).
    pub fn not_acceptable() -> Self {
        Self::failure(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf".into(),
            None,
        )
    }

    /// 406 for an Accept header naming only media types the server has no
    /// writer for (`text/html`).
    pub fn no_representation() -> Self {
        Self::failure(
            406,
            "NotAcceptable",
            "406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch".into(),
            Some(StatusDetails::default()),
        )
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large() -> Self {
        Self::failure(
            413,
            "RequestEntityTooLarge",
            "the request body is too large".into(),
            None,
        )
    }

    /// 422 Invalid without field causes (a JSON patch that cannot be applied).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::failure(422, "Invalid", message.into(), None)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::failure(500, "InternalError", message.into(), None)
    }

    /// 503 ServiceUnavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The same status telling the client to try again after `seconds`
    /// (`details.retryAfterSeconds`, which the server pairs with a
    /// `Retry-After` header).
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.details
            .get_or_insert_with(StatusDetails::default)
            .retry_after_seconds = Some(seconds);
        self
    }

    /// 504 Timeout.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// A failure reported by whoever answered in our place (the sidecar's agent): its
    /// code (502 when it gave none usable) with the reason Kubernetes uses for that code.
    pub fn from_code(code: u32, message: impl Into<String>) -> Self {
        let code = u16::try_from(code)
            .ok()
            .filter(|c| (400..600).contains(c))
            .unwrap_or(502);
        Self::new(code, reason_for(code), message)
    }

    /// The status as a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The HTTP response carrying this status as `application/json`; callers wrap the
    /// bytes in their body type (`.map(...)`).
    pub fn to_http(&self) -> http::Response<Bytes> {
        // The API server writes its 406 bodies indented, whoever asks;
        // the others as every JSON answer ([`crate::json`]).
        let body = if self.code == 406 {
            crate::json::encode_indented(self)
        } else {
            crate::json::encode(self)
        };
        let mut resp = http::Response::new(Bytes::from(body));
        *resp.status_mut() = http::StatusCode::from_u16(self.code)
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
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
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
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

    fn res(group: &'static str, plural: &'static str) -> Resource<'static> {
        Resource {
            group,
            version: "v1",
            plural,
            kind: "",
        }
    }

    /// Every `metav1.Status` recorded with its size (`errors/requests.json`):
    /// read back into a [`Status`] and written by [`Status::to_http`], it
    /// has the bytes the server sent — compact with a newline, or a 406
    /// indented without one.
    #[test]
    fn status_bodies_have_the_recorded_sizes() {
        let requests = fixture("requests.json");
        let mut checked = 0;
        for r in requests.as_array().unwrap() {
            let Some(file) = r["file"].as_str().filter(|f| f.ends_with(".json")) else {
                continue;
            };
            let recorded = fixture(file);
            if recorded["kind"] != "Status" {
                continue;
            }
            let status: Status = serde_json::from_value(recorded.clone()).unwrap();
            let body = status.to_http().into_body();
            assert_eq!(
                body.len() as u64,
                r["response_body_bytes"].as_u64().unwrap(),
                "{file}: {}",
                String::from_utf8_lossy(&body)
            );
            let indented = r["response_body_indented_by_server"] == true;
            assert_eq!(body.ends_with(b"\n"), !indented, "{file}");
            assert_eq!(
                serde_json::from_slice::<Value>(&body).unwrap(),
                recorded,
                "{file}"
            );
            checked += 1;
        }
        assert!(checked >= 20, "only {checked} recorded Status bodies");
    }

    // From the sidecar's facade.

    #[test]
    fn not_found_matches_the_real_server() {
        let got = Status::not_found(res("", "pods"), "nope").to_value();
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
    fn forbidden_matches_the_real_server() {
        let user = "system:serviceaccount:fx-a:narrow";
        let cm = res("", "configmaps");
        let cases = [
            (
                "403-get.json",
                cm,
                Some("settings"),
                None,
                "get",
                Some("fx-b"),
            ),
            (
                "403-list-namespaced.json",
                cm,
                None,
                None,
                "list",
                Some("fx-b"),
            ),
            ("403-list-all-namespaces.json", cm, None, None, "list", None),
            ("403-watch.json", cm, None, None, "watch", Some("fx-b")),
            ("403-create.json", cm, None, None, "create", Some("fx-a")),
            (
                "403-patch.json",
                cm,
                Some("settings"),
                None,
                "patch",
                Some("fx-a"),
            ),
            (
                "403-delete.json",
                cm,
                Some("settings"),
                None,
                "delete",
                Some("fx-a"),
            ),
            (
                "403-delete-collection.json",
                cm,
                None,
                None,
                "deletecollection",
                Some("fx-a"),
            ),
            (
                "403-list-cluster-scoped.json",
                res("", "namespaces"),
                None,
                None,
                "list",
                None,
            ),
            (
                "403-get-cluster-scoped.json",
                res("", "nodes"),
                Some("fx-node-1"),
                None,
                "get",
                None,
            ),
            (
                "403-get-subresource.json",
                res("apps", "deployments"),
                Some("web"),
                Some("scale"),
                "get",
                Some("fx-a"),
            ),
            (
                "403-list-customresource.json",
                res("fx.example.com", "gadgets"),
                None,
                None,
                "list",
                Some("fx-a"),
            ),
        ];
        for (file, r, name, sub, verb, ns) in cases {
            let got = Status::forbidden(r, name, sub, user, verb, ns).to_value();
            assert_eq!(got, fixture(file), "{file}");
        }
    }

    #[test]
    fn bad_request_matches_the_real_server() {
        let got = Status::bad_request("field label not supported: spec.foo").to_value();
        assert_eq!(got, fixture("400-badfieldselector.json"));
    }

    #[test]
    fn grouped_not_found_names_group() {
        let got = Status::not_found(res("apps", "deployments"), "web").to_value();
        assert_eq!(got["message"], "deployments.apps \"web\" not found");
        assert_eq!(got["details"]["group"], "apps");
        assert_eq!(got["code"], 404);
    }

    #[test]
    fn agent_failures_default_to_502() {
        let f = Status::from_code(0, "boom");
        assert_eq!((f.code, f.reason.as_str()), (502, "InternalError"));
        let f = Status::from_code(403, "no");
        assert_eq!((f.code, f.reason.as_str()), (403, "Forbidden"));
        let resp = Status::unavailable("x").to_http();
        assert_eq!(resp.status(), 503);
        assert_eq!(
            resp.headers()[http::header::CONTENT_TYPE],
            "application/json"
        );
    }

    // The other recorded errors, which kube-sim's API tests check end to end.

    #[test]
    fn recorded_errors_match() {
        let cm = res("", "configmaps");
        assert_eq!(
            Status::not_found(cm, "nope").to_value(),
            fixture("404-delete.json")
        );
        assert_eq!(
            Status::already_exists(cm, "app-config").to_value(),
            fixture("409-alreadyexists.json")
        );
        assert_eq!(
            Status::conflict(cm, "app-config").to_value(),
            fixture("409-conflict.json")
        );
        assert_eq!(
            Status::bad_request(
                "unable to parse requirement: found '', expected: ',', ')' or identifier"
            )
            .to_value(),
            fixture("400-badselector.json")
        );
        let invalid = fixture("422-invalid.json");
        let cause = &invalid["details"]["causes"][0];
        let got = Status::invalid(
            "ConfigMap",
            "Bad_Name",
            "metadata.name",
            "FieldValueInvalid",
            cause["message"].as_str().unwrap(),
        );
        assert_eq!(got.to_value(), invalid);
        // A status reads back as itself.
        let back: Status = serde_json::from_value(invalid).unwrap();
        assert_eq!(back, got);
    }

    #[test]
    fn method_not_allowed_has_empty_details_like_the_server() {
        let got = Status::method_not_allowed().to_value();
        assert_eq!(got["code"], 405);
        assert_eq!(got["reason"], "MethodNotAllowed");
        assert_eq!(got["details"], serde_json::json!({}));
        let no_details = Status::not_found_message("account \"x\" not found").to_value();
        assert!(no_details.get("details").is_none());
    }
}
