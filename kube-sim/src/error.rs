//! Errors: the `metav1.Status` every API failure becomes, and the crate's own [`Error`].
//!
//! API operations fail with a [`Status`] whose `reason`, `code`, `details` and
//! `message` wording match what a real kube-apiserver answers (see
//! `fixtures/errors/`). Everything that is not an API answer (binding, I/O) is an
//! [`Error`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::resources::ResourceInfo;

/// Errors of the simulator itself (not API answers).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Accepting or serving a connection failed.
    #[error("serving a connection failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The TLS handshake with a client failed.
    #[error("TLS handshake failed: {0}")]
    Handshake(#[source] std::io::Error),
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

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

    fn resource_details(res: &ResourceInfo, name: &str) -> StatusDetails {
        StatusDetails {
            name: Some(name.to_string()),
            group: (!res.group.is_empty()).then(|| res.group.to_string()),
            kind: Some(res.plural.to_string()),
            ..Default::default()
        }
    }

    /// A `Success` status about a deleted object, as DELETE returns it.
    pub fn success_deleted(res: &ResourceInfo, name: &str, uid: &str) -> Self {
        let mut details = Self::resource_details(res, name);
        details.uid = Some(uid.to_string());
        Status {
            status: "Success".into(),
            ..Self::failure(200, "", String::new(), Some(details))
        }
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(res: &ResourceInfo, name: &str) -> Self {
        Self::failure(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified()),
            Some(Self::resource_details(res, name)),
        )
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

    /// 409 `configmaps "x" already exists`.
    pub fn already_exists(res: &ResourceInfo, name: &str) -> Self {
        Self::failure(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified()),
            Some(Self::resource_details(res, name)),
        )
    }

    /// 409 Conflict on a stale resourceVersion.
    pub fn conflict(res: &ResourceInfo, name: &str) -> Self {
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

    /// The status as a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}
