//! What Clouddriver's answers mean. Its errors are told apart by their
//! body, not only their status: most failures of the account API are 400s.
//!
//! Every error body comes from kork-web: `GenericExceptionHandlers` maps
//! `InvalidRequestException`, `UserException` (so `ConfigurationException`
//! and clouddriver-sql's `SqlAccountDefinitionException`) and
//! `IllegalArgumentException` to 400, `AccessDeniedException` to 403 with
//! the fixed message "Access is denied", `NotFoundException` to 404, and
//! `ErrorConfiguration`'s `ErrorAttributes` renders `{timestamp, status,
//! error, message}` (no `path`). A body Jackson cannot read (no `type`, an
//! unknown type, a wrong field type) is Spring's
//! `HttpMessageNotReadableException`, which kork's `BaseExceptionHandlers`
//! (a `ResponseEntityExceptionHandler`) answers 400 with no body at all.

use std::path::PathBuf;
use std::time::Duration;

use http::StatusCode;
use serde_json::Value;

/// Longest part of Clouddriver's message kept for the accounts API and logs.
const MESSAGE_LIMIT: usize = 300;

/// Why one call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Clouddriver answered with an error.
    #[error("Clouddriver answered {status}: {message}")]
    Refused {
        /// Its status.
        status: StatusCode,
        /// What it means ([`crate::accounts::Registration::reason`]).
        reason: &'static str,
        /// What it said, with what to do about it.
        message: String,
    },
    /// No connection.
    #[error("Clouddriver unreachable: {0}")]
    Transport(String),
    /// No answer in time.
    #[error("no answer from Clouddriver within {0:?}")]
    Timeout(Duration),
    /// The shared store, which says who owns the account, failed.
    #[error("the store: {0}")]
    Store(#[from] crate::store::Error),
    /// The kubeconfig directory could not be written.
    #[error("kubeconfig file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl CallError {
    /// The reason, as the accounts API and metrics name it.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Refused { reason, .. } => reason,
            Self::Transport(_) => "unreachable",
            Self::Timeout(_) => "timeout",
            Self::Store(_) => "store",
            Self::File { .. } => "file",
        }
    }
}

/// The error Clouddriver's answer `status` with `body` to a call about
/// account definitions means; `user` is the `X-SPINNAKER-USER` sent.
pub fn refused(status: StatusCode, body: &[u8], user: Option<&str>) -> CallError {
    let message = message(body);
    let said = message.as_deref().unwrap_or_default();
    let (reason, explained) = match status.as_u16() {
        400 if message.is_none() => (
            "unreadable",
            "Clouddriver could not read the account definition (a 400 with no body is its \
             JSON mapper refusing it)"
                .to_owned(),
        ),
        // CredentialsController.validateAccountStorageEnabled.
        400 if said.contains("without enabling AccountDefinitionService") => (
            "storage_disabled",
            format!(
                "{said} — Clouddriver's account storage is off: set account.storage.enabled \
                 and account.storage.kubernetes.enabled (with sql.enabled) in Clouddriver"
            ),
        ),
        // AccountDefinitionService.validateAccountAuthorization.
        400 if said.contains("without granting permissions for current user") => (
            "permissions",
            format!(
                "{said} — the user {} must hold one of the account's WRITE roles \
                 (clouddriver.account.permissions.WRITE)",
                user.unwrap_or("(none: set clouddriver.user)")
            ),
        ),
        // SqlAccountDefinitionRepository: its message echoes the whole
        // definition ("... with definition {body}"); only its start is kept.
        400 if said.starts_with("Cannot ") && said.contains(" with ") => (
            "store_error",
            format!(
                "{} (Clouddriver's SQL account store refused it; see Clouddriver's log)",
                said.split(" with ").next().unwrap_or(said)
            ),
        ),
        400 => ("rejected", said.to_owned()),
        403 => (
            "forbidden",
            format!(
                "{} — Fiat denied the user {}: it must be a Fiat admin, or hold a role in \
                 fiat.account.manager.roles and one of the account's WRITE roles; Fiat learns \
                 of a new account only at its next sync (fiat.write-mode.sync-delay-ms), so \
                 this is retried",
                if said.is_empty() {
                    "Access is denied"
                } else {
                    said
                },
                user.unwrap_or("anonymous (no clouddriver.user set)")
            ),
        ),
        404 | 405 => (
            "no_account_api",
            "Clouddriver has no account management API at this address (/credentials)".to_owned(),
        ),
        502..=504 => ("unavailable", "Clouddriver is not up".to_owned()),
        500..=599 => ("server_error", said.to_owned()),
        _ => ("rejected", said.to_owned()),
    };
    CallError::Refused {
        status,
        reason,
        message: explained,
    }
}

/// The `message` of a kork error body, bounded, on one line. Never the
/// body itself: it may echo the definition.
fn message(body: &[u8]) -> Option<String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let text = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => match o.get("message") {
            Some(Value::String(m)) => m.clone(),
            _ => return Some(String::new()),
        },
        _ => {
            return Some(format!(
                "(a body of {} bytes that is not kork's JSON)",
                body.len()
            ));
        }
    };
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MESSAGE_LIMIT)
        .collect();
    Some(one_line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kork-web error body (`ErrorConfiguration`: no `path`). The messages
    /// below are Clouddriver's own, from the files named at each arm of
    /// [`refused`] (`CredentialsController`, `AccountDefinitionService`,
    /// `SqlAccountDefinitionRepository`, kork's `GenericExceptionHandlers`).
    fn kork(status: u16, message: &str) -> Vec<u8> {
        serde_json::json!({"timestamp": "2026-01-01T00:00:00.000+00:00", "status": status,
            "error": "Bad Request", "message": message})
        .to_string()
        .into_bytes()
    }

    fn reason(status: u16, body: &[u8]) -> (&'static str, String) {
        match refused(StatusCode::from_u16(status).unwrap(), body, Some("u")) {
            e @ CallError::Refused { .. } => (e.reason(), e.to_string()),
            e => panic!("{e}"),
        }
    }

    #[test]
    fn four_hundreds_are_told_apart_by_their_body() {
        assert_eq!(reason(400, b"").0, "unreadable");
        let (r, m) = reason(
            400,
            &kork(
                400,
                "Cannot use AccountDefinitionService endpoints without enabling AccountDefinitionService bean",
            ),
        );
        assert_eq!(r, "storage_disabled");
        assert!(m.contains("account.storage.kubernetes.enabled"), "{m}");
        let (r, m) = reason(
            400,
            &kork(
                400,
                "Cannot save account without granting permissions for current user (name: p)",
            ),
        );
        assert_eq!(r, "permissions");
        assert!(m.contains("user u"), "{m}");
        assert_eq!(
            reason(
                400,
                &kork(
                    400,
                    "Cannot create an account which already exists (name: p)"
                )
            )
            .0,
            "rejected"
        );
        let secret = r#"Cannot save account with definition {"name":"p","kubeconfigContents":"token: s3cr3t"}"#;
        let (r, m) = reason(400, &kork(400, secret));
        assert_eq!(r, "store_error");
        assert!(!m.contains("s3cr3t") && !m.contains("kubeconfig"), "{m}");
        assert!(m.contains("Cannot save account"), "{m}");
    }

    #[test]
    fn other_statuses() {
        let (r, m) = reason(403, &kork(403, "Access is denied"));
        assert_eq!(r, "forbidden");
        assert!(m.contains("fiat.account.manager.roles"), "{m}");
        assert_eq!(reason(404, &kork(404, "")).0, "no_account_api");
        assert_eq!(reason(503, b"").0, "unavailable");
        assert_eq!(reason(500, &kork(500, "boom")).0, "server_error");
        // A body that is not kork's is never echoed.
        let (_, m) = reason(400, b"<html>token: s3cr3t</html>");
        assert!(!m.contains("s3cr3t"), "{m}");
    }
}
