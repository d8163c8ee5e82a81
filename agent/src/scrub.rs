//! Removing Secret values before anything leaves the agent.
//!
//! A Secret's `data` and `stringData` never cross the tunnel: not in cached
//! objects, not in relayed responses (get, list, table, watch). The
//! `kubectl.kubernetes.io/last-applied-configuration` annotation is removed
//! too, since `kubectl apply` copies the whole Secret, values included, into
//! it. Later work replaces the object path with a deserializer that skips the
//! values without allocating them; until then they are removed after parsing.

use serde_json::Value;

/// Keys of a Secret that hold values.
pub const SECRET_VALUE_KEYS: [&str; 2] = ["data", "stringData"];
/// The annotation in which `kubectl apply` keeps a copy of the object.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// Longest watch line buffered while looking for its end.
pub const MAX_WATCH_LINE: usize = 16 * 1024 * 1024;

/// Why a body could not be scrubbed (and so must not be forwarded).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A body (or watch line) from a secrets path was not JSON.
    #[error("secret response is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// A watch line grew past [`MAX_WATCH_LINE`] without ending.
    #[error("watch line longer than {MAX_WATCH_LINE} bytes")]
    LineTooLong,
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Removes the values of one Secret object (no-op for non-objects).
pub fn scrub_secret(obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    for key in SECRET_VALUE_KEYS {
        map.remove(key);
    }
    if let Some(annotations) = map
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// Scrubs a response value from a secrets path, whatever its shape: a Secret,
/// a SecretList (`items`), a Table (`rows[].object`) or a watch event
/// (`object`).
pub fn scrub_secret_response(value: &mut Value) {
    scrub_secret(value);
    let Some(map) = value.as_object_mut() else {
        return;
    };
    if let Some(items) = map.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(scrub_secret);
    }
    if let Some(rows) = map.get_mut("rows").and_then(Value::as_array_mut) {
        for row in rows {
            if let Some(object) = row.get_mut("object") {
                scrub_secret_response(object);
            }
        }
    }
    if let Some(object) = map.get_mut("object") {
        scrub_secret_response(object);
    }
}

/// Parses a whole (non-watch) response body from a secrets path, scrubs it
/// and serialises it again. An empty body stays empty.
pub fn scrub_secret_body(body: &[u8]) -> Result<Vec<u8>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(body.to_vec());
    }
    let mut value: Value = serde_json::from_slice(body).map_err(Error::NotJson)?;
    scrub_secret_response(&mut value);
    serde_json::to_vec(&value).map_err(Error::NotJson)
}

/// True when a request path addresses the `secrets` resource of the core
/// group (collection, object, legacy `/watch/` path or subresource).
pub fn path_targets_secrets(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/api/v1/") else {
        return false;
    };
    let mut segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    if segments.first() == Some(&"watch") {
        segments.remove(0);
    }
    let resource = match segments.as_slice() {
        ["namespaces", _ns, resource, ..] => *resource,
        [resource, ..] => *resource,
        [] => return false,
    };
    resource == "secrets"
}

/// Scrubs a streamed watch body line by line: each complete line is a watch
/// event, scrubbed and re-serialised; a partial line waits for its end.
#[derive(Debug, Default)]
pub struct WatchScrubber {
    pending: Vec<u8>,
}

impl WatchScrubber {
    /// A scrubber with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk; returns the scrubbed complete lines it finished (each
    /// ending in `\n`), possibly none.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>> {
        self.pending.extend_from_slice(chunk);
        let Some(last_newline) = self.pending.iter().rposition(|b| *b == b'\n') else {
            if self.pending.len() > MAX_WATCH_LINE {
                return Err(Error::LineTooLong);
            }
            return Ok(Vec::new());
        };
        let rest = self.pending.split_off(last_newline + 1);
        let complete = std::mem::replace(&mut self.pending, rest);
        let mut out = Vec::with_capacity(complete.len());
        for line in complete.split(|b| *b == b'\n') {
            scrub_line(line, &mut out)?;
        }
        if self.pending.len() > MAX_WATCH_LINE {
            return Err(Error::LineTooLong);
        }
        Ok(out)
    }

    /// Ends the body; returns the scrubbed last line if it had no `\n`.
    pub fn finish(&mut self) -> Result<Vec<u8>> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        scrub_line(&rest, &mut out)?;
        Ok(out)
    }
}

fn scrub_line(line: &[u8], out: &mut Vec<u8>) -> Result<()> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let mut value: Value = serde_json::from_slice(line).map_err(Error::NotJson)?;
    scrub_secret_response(&mut value);
    serde_json::to_writer(&mut *out, &value).map_err(Error::NotJson)?;
    out.push(b'\n');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SENTINEL: &str = "c2VudGluZWwtdmFsdWU=";

    fn secret(name: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": "demo",
                "annotations": {
                    LAST_APPLIED_ANNOTATION: format!("{{\"data\":{{\"k\":\"{SENTINEL}\"}}}}"),
                    "keep": "me"
                }
            },
            "type": "Opaque",
            "data": { "k": SENTINEL },
            "stringData": { "s": SENTINEL }
        })
    }

    fn contains_sentinel(bytes: &[u8]) -> bool {
        String::from_utf8_lossy(bytes).contains(SENTINEL)
    }

    #[test]
    fn secret_object_loses_values_keeps_the_rest() {
        let mut s = secret("a");
        scrub_secret(&mut s);
        assert!(s.get("data").is_none());
        assert!(s.get("stringData").is_none());
        assert_eq!(s["metadata"]["annotations"]["keep"], "me");
        assert_eq!(s["type"], "Opaque");
        assert!(!contains_sentinel(&serde_json::to_vec(&s).unwrap()));
    }

    #[test]
    fn list_table_and_single_bodies_are_scrubbed() {
        let list = json!({"kind": "SecretList", "apiVersion": "v1", "metadata": {},
            "items": [secret("a"), secret("b")]});
        let table = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "rows": [{"cells": ["a"], "object": secret("a")}]});
        for body in [list, table, secret("c")] {
            let raw = serde_json::to_vec(&body).unwrap();
            assert!(contains_sentinel(&raw));
            let out = scrub_secret_body(&raw).unwrap();
            assert!(
                !contains_sentinel(&out),
                "{}",
                String::from_utf8_lossy(&out)
            );
        }
        let list: Value = serde_json::from_slice(
            &scrub_secret_body(
                &serde_json::to_vec(&json!({"items": [secret("a"), secret("b")]})).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(list["items"][1]["metadata"]["name"], "b");
    }

    #[test]
    fn non_json_secret_body_is_refused() {
        assert!(scrub_secret_body(b"k8s\x00protobuf").is_err());
        assert_eq!(scrub_secret_body(b"").unwrap(), b"");
    }

    #[test]
    fn watch_lines_are_scrubbed_across_chunk_boundaries() {
        let mut body = Vec::new();
        for (t, name) in [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")] {
            serde_json::to_writer(&mut body, &json!({"type": t, "object": secret(name)})).unwrap();
            body.push(b'\n');
        }
        assert!(contains_sentinel(&body));
        // Feed in awkward pieces, splitting lines (and the sentinel) apart.
        let mut scrubber = WatchScrubber::new();
        let mut out = Vec::new();
        for piece in body.chunks(7) {
            out.extend(scrubber.push(piece).unwrap());
        }
        out.extend(scrubber.finish().unwrap());
        assert!(!contains_sentinel(&out));
        let events: Vec<Value> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[2]["type"], "DELETED");
        assert_eq!(events[0]["object"]["metadata"]["name"], "a");
    }

    #[test]
    fn watch_last_line_without_newline_is_flushed() {
        let mut scrubber = WatchScrubber::new();
        let line = serde_json::to_vec(&json!({"type": "ADDED", "object": secret("x")})).unwrap();
        assert!(scrubber.push(&line).unwrap().is_empty());
        let out = scrubber.finish().unwrap();
        assert!(!out.is_empty());
        assert!(!contains_sentinel(&out));
    }

    #[test]
    fn bad_watch_line_is_an_error() {
        let mut scrubber = WatchScrubber::new();
        assert!(scrubber.push(b"{not json\n").is_err());
    }

    #[test]
    fn secret_paths() {
        for p in [
            "/api/v1/secrets",
            "/api/v1/namespaces/demo/secrets",
            "/api/v1/namespaces/demo/secrets/s1",
            "/api/v1/watch/namespaces/demo/secrets",
            "/api/v1/watch/secrets",
        ] {
            assert!(path_targets_secrets(p), "{p}");
        }
        for p in [
            "/api/v1/namespaces/secrets",
            "/api/v1/namespaces/demo/configmaps",
            "/api/v1/namespaces/demo/pods/secrets",
            "/apis/apps/v1/namespaces/demo/deployments",
            "/api/v1",
            "/version",
        ] {
            assert!(!path_targets_secrets(p), "{p}");
        }
    }
}
