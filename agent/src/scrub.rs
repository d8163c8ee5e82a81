//! Removing Secret values before anything leaves the agent.
//!
//! A Secret's values never cross the tunnel: not in cached objects, not in
//! relayed responses (get, list, table, watch). Values are never even
//! allocated: [`Scrubbed`] parses JSON with a visitor that skips them, for
//! watched Secrets and for relayed responses alike.
//!
//! Each key of `data` is kept, its value replaced by as many [`FILLER`] bytes
//! as the value decodes to (in base64, as `data` is written): `kubectl get
//! secret` counts the keys (its DATA column) and `kubectl describe secret`
//! prints `key: N bytes` from the decoded length of each value it GETs, so the
//! facade can answer both exactly while no byte of a value leaves the
//! cluster, only its length, which `describe` shows anyway. The filler costs
//! as many bytes as the values did; `stringData`, which the API server never
//! returns, is dropped.
//!
//! The `kubectl.kubernetes.io/last-applied-configuration` annotation holds a
//! copy of the whole applied Secret, values included. It is kept, with every
//! value replaced by [`WITHHELD`]: client-side `kubectl apply` (which
//! Clouddriver uses) computes which keys to delete from it, so without it a
//! re-apply could never remove a key, and kubectl warns on every apply. The
//! keys, which kubectl needs, are no secret; the values never leave. That
//! one annotation is read whole into memory, and wiped once read.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Keys of a Secret that hold values.
pub const SECRET_VALUE_KEYS: [&str; 2] = ["data", "stringData"];
/// The byte each value of a Secret's `data` is made of once scrubbed,
/// repeated to the value's decoded length.
pub const FILLER: u8 = b'*';
/// The annotation in which `kubectl apply` keeps a copy of the object.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// What each value of a Secret's last-applied configuration becomes: the
/// base64 of `(withheld by spinlink)` in `data`, the words themselves in
/// `stringData`. kubectl only compares them with the manifest being applied
/// (they never match, so every key applied is sent again, as it must be).
pub const WITHHELD: &str = "KHdpdGhoZWxkIGJ5IHNwaW5saW5rKQ==";
/// [`WITHHELD`] as plain text, for `stringData`.
pub const WITHHELD_TEXT: &str = "(withheld by spinlink)";
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

/// A JSON value parsed with every Secret value left out: each value of
/// `data` is measured and replaced by [`FILLER`] bytes of its decoded length,
/// `stringData` is skipped ([`IgnoredAny`]), neither is allocated, and the
/// last-applied annotation in `metadata` keeps only placeholders.
///
/// The same rules hold at every level where a Secret can sit in a response:
/// the value itself (a Secret), `items[]` (a SecretList), `rows[]` and
/// `rows[].object` (a Table), and `object` (a watch event). Only use it for
/// values known to hold Secrets: other kinds keep meaningful `data`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scrubbed(pub Value);

impl<'de> Deserialize<'de> for Scrubbed {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ScrubVisitor).map(Scrubbed)
    }
}

/// Builds a [`Value`] like `Value::deserialize`, applying the Secret rules to
/// every map key.
struct ScrubVisitor;

impl<'de> Visitor<'de> for ScrubVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Scrubbed(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "data" => {
                    let Filled(v) = map.next_value()?;
                    out.insert(key, v);
                }
                k if SECRET_VALUE_KEYS.contains(&k) => {
                    map.next_value::<IgnoredAny>()?;
                }
                "metadata" => {
                    let Metadata(v) = map.next_value()?;
                    out.insert(key, v);
                }
                "items" | "rows" | "object" => {
                    let Scrubbed(v) = map.next_value()?;
                    out.insert(key, v);
                }
                _ => {
                    out.insert(key, map.next_value::<Value>()?);
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// A Secret's `data` with each value replaced by [`filler`] of its decoded
/// length (`null` stays `null`).
struct Filled(Value);

impl<'de> Deserialize<'de> for Filled {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of Secret values")
            }
            fn visit_unit<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                let mut out = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    let DecodedLen(n) = map.next_value()?;
                    out.insert(key, Value::String(filler(n)));
                }
                Ok(Value::Object(out))
            }
        }
        deserializer.deserialize_any(V).map(Filled)
    }
}

/// How many bytes a base64 value decodes to, read without keeping it.
struct DecodedLen(usize);

impl<'de> Deserialize<'de> for DecodedLen {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = usize;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a base64 Secret value")
            }
            fn visit_unit<E>(self) -> Result<usize, E> {
                Ok(0)
            }
            fn visit_str<E>(self, v: &str) -> Result<usize, E> {
                Ok(decoded_len(v))
            }
            fn visit_string<E>(self, mut v: String) -> Result<usize, E> {
                let n = decoded_len(&v);
                zeroize::Zeroize::zeroize(&mut v);
                Ok(n)
            }
        }
        deserializer.deserialize_str(V).map(DecodedLen)
    }
}

/// The decoded length of standard base64 `v` (padded, as the API server
/// writes it; unpadded text counts its whole groups of 6 bits).
pub fn decoded_len(v: &str) -> usize {
    let len = v.len();
    if len.is_multiple_of(4) {
        let pad = v.bytes().rev().take_while(|b| *b == b'=').count().min(2);
        (len / 4 * 3).saturating_sub(pad)
    } else {
        len * 3 / 4
    }
}

/// The base64 of `n` [`FILLER`] bytes, written without allocating them.
pub fn filler(n: usize) -> String {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let group = engine.encode([FILLER; 3]);
    let mut out = group.repeat(n / 3);
    if !n.is_multiple_of(3) {
        out.push_str(&engine.encode(&[FILLER; 2][..n % 3]));
    }
    out
}

/// `metadata` with the last-applied annotation skipped.
struct Metadata(Value);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("object metadata")
            }
            fn visit_unit<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                let mut out = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "annotations" {
                        let Annotations(v) = map.next_value()?;
                        out.insert(key, v);
                    } else {
                        out.insert(key, map.next_value::<Value>()?);
                    }
                }
                Ok(Value::Object(out))
            }
        }
        deserializer.deserialize_any(V).map(Metadata)
    }
}

/// Annotations without [`LAST_APPLIED_ANNOTATION`], whose value is skipped.
struct Annotations(Value);

impl<'de> Deserialize<'de> for Annotations {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("annotations")
            }
            fn visit_unit<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                let mut out = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == LAST_APPLIED_ANNOTATION {
                        let mut applied: String = map.next_value()?;
                        let withheld = withhold_values(&applied);
                        zeroize::Zeroize::zeroize(&mut applied);
                        // Not JSON kubectl could read: dropped, as kubectl
                        // would ignore it.
                        if let Some(withheld) = withheld {
                            out.insert(key, Value::String(withheld));
                        }
                    } else {
                        out.insert(key, map.next_value::<Value>()?);
                    }
                }
                Ok(Value::Object(out))
            }
        }
        deserializer.deserialize_any(V).map(Annotations)
    }
}

/// A Secret's last-applied configuration (`applied`, JSON as kubectl
/// writes it) with the values of `data` and `stringData` replaced by
/// [`WITHHELD`] / [`WITHHELD_TEXT`]; `None` when it is not a JSON object.
/// Written as kubectl writes it: compact, with a final newline.
pub fn withhold_values(applied: &str) -> Option<String> {
    let Withheld(value) = serde_json::from_str(applied).ok()?;
    if !value.is_object() {
        return None;
    }
    let mut text = serde_json::to_string(&value).ok()?;
    text.push('\n');
    Some(text)
}

/// A top-level object whose `data` and `stringData` keep their keys, each
/// value skipped unread and replaced.
struct Withheld(Value);

impl<'de> Deserialize<'de> for Withheld {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an applied configuration")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                let mut out = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    let placeholder = match key.as_str() {
                        "data" => WITHHELD,
                        "stringData" => WITHHELD_TEXT,
                        _ => {
                            out.insert(key, map.next_value::<Value>()?);
                            continue;
                        }
                    };
                    let Keys(keys) = map.next_value()?;
                    let values = keys
                        .into_iter()
                        .map(|k| (k, Value::from(placeholder)))
                        .collect();
                    out.insert(key, Value::Object(values));
                }
                Ok(Value::Object(out))
            }
        }
        deserializer.deserialize_map(V).map(Withheld)
    }
}

/// The keys of a map (or none, for `null`), its values skipped unread.
struct Keys(Vec<String>);

impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<String>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of Secret values")
            }
            fn visit_unit<E>(self) -> Result<Vec<String>, E> {
                Ok(Vec::new())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
                let mut keys = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    keys.push(key);
                }
                Ok(keys)
            }
        }
        deserializer.deserialize_any(V).map(Keys)
    }
}

/// Parses a whole (non-watch) response body from a secrets path without its
/// Secret values and serialises it again. An empty body stays empty.
pub fn scrub_secret_body(body: &[u8]) -> Result<Vec<u8>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(body.to_vec());
    }
    let Scrubbed(value) = serde_json::from_slice(body).map_err(Error::NotJson)?;
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
    let Scrubbed(value) = serde_json::from_slice(line).map_err(Error::NotJson)?;
    serde_json::to_writer(&mut *out, &value).map_err(Error::NotJson)?;
    out.push(b'\n');
    Ok(())
}

/// Fuzz target body: any bytes from a secrets path, whole or as a watch
/// stream in two chunks, are scrubbed or refused without a panic; what is
/// scrubbed holds no value in `data` (only [`FILLER`]) and no `stringData`
/// at any level a Secret can sit (the value, `items[]`, `rows[]`, `object`),
/// and its last-applied copy holds only placeholders.
pub fn fuzz_scrub(data: &[u8]) {
    if let Ok(out) = scrub_secret_body(data)
        && let Ok(v) = serde_json::from_slice::<Value>(&out)
    {
        assert_scrubbed(&v);
    }
    let split = data.len() / 2;
    let mut watch = WatchScrubber::new();
    let mut out = watch.push(&data[..split]).unwrap_or_default();
    out.extend(watch.push(&data[split..]).unwrap_or_default());
    out.extend(watch.finish().unwrap_or_default());
    for line in out.split(|b| *b == b'\n') {
        if let Ok(v) = serde_json::from_slice::<Value>(line) {
            assert_scrubbed(&v);
        }
    }
}

/// The invariant [`fuzz_scrub`] checks, following [`Scrubbed`]'s rules.
fn assert_scrubbed(v: &Value) {
    match v {
        Value::Array(items) => items.iter().for_each(assert_scrubbed),
        Value::Object(o) => {
            assert!(!o.contains_key("stringData"), "stringData survived: {v}");
            if let Some(data) = o.get("data").filter(|d| !d.is_null()) {
                let data = data.as_object().expect("data is a map");
                for value in data.values() {
                    let text = value.as_str().expect("a filler string");
                    assert_eq!(text, filler(decoded_len(text)), "a value survived: {v}");
                }
            }
            if let Some(Value::String(applied)) = o
                .get("metadata")
                .and_then(|m| m.get("annotations"))
                .and_then(|a| a.get(LAST_APPLIED_ANNOTATION))
            {
                let applied: Value = serde_json::from_str(applied).expect("rewritten as JSON");
                for (key, placeholder) in [("data", WITHHELD), ("stringData", WITHHELD_TEXT)] {
                    if let Some(values) = applied.get(key).and_then(Value::as_object) {
                        assert!(values.values().all(|x| x == placeholder), "{applied}");
                    }
                }
            }
            for key in ["items", "rows", "object"] {
                if let Some(inner) = o.get(key) {
                    assert_scrubbed(inner);
                }
            }
        }
        _ => {}
    }
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
        let raw = serde_json::to_vec(&secret("a")).unwrap();
        let Scrubbed(s) = serde_json::from_slice(&raw).unwrap();
        // "sentinel-value": 14 bytes, each now a filler byte.
        assert_eq!(s["data"], json!({"k": "KioqKioqKioqKioqKio="}));
        assert!(s.get("stringData").is_none());
        assert_eq!(s["metadata"]["annotations"]["keep"], "me");
        // The last-applied copy keeps its keys, for kubectl apply.
        let applied: Value = serde_json::from_str(
            s["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(applied, json!({"data": {"k": WITHHELD}}));
        assert_eq!(s["type"], "Opaque");
        assert!(!contains_sentinel(&serde_json::to_vec(&s).unwrap()));
    }

    /// What `kubectl describe secret` prints for each key: the length of the
    /// base64-decoded value.
    fn sizes(secret: &Value) -> Vec<(String, usize)> {
        use base64::Engine as _;
        secret["data"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap())
                    .unwrap();
                (k.clone(), bytes.len())
            })
            .collect()
    }

    #[test]
    fn recorded_secrets_keep_their_keys_and_sizes_not_their_values() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../kube-sim/fixtures/objects/secrets.list.json"
        );
        let raw = std::fs::read(path).unwrap();
        let recorded: Value = serde_json::from_slice(&raw).unwrap();
        let scrubbed: Value = serde_json::from_slice(&scrub_secret_body(&raw).unwrap()).unwrap();
        let items = recorded["items"].as_array().unwrap();
        assert!(!items.is_empty());
        for (want, got) in items.iter().zip(scrubbed["items"].as_array().unwrap()) {
            // Keys and decoded sizes as the real server answered them (the
            // DATA column and `describe`'s `key: N bytes`)...
            assert_eq!(sizes(got), sizes(want), "{}", want["metadata"]["name"]);
            // ...with no byte of any value.
            let out = serde_json::to_string(got).unwrap();
            for v in want["data"].as_object().unwrap().values() {
                assert!(!out.contains(v.as_str().unwrap()), "{out}");
            }
            for v in got["data"].as_object().unwrap().values() {
                assert_eq!(
                    v.as_str().unwrap(),
                    filler(decoded_len(v.as_str().unwrap()))
                );
            }
        }
    }

    #[test]
    fn fillers_have_the_decoded_length() {
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::STANDARD;
        for n in 0..10 {
            let value = engine.encode(vec![7u8; n]);
            assert_eq!(decoded_len(&value), n, "{value}");
            let f = filler(n);
            assert_eq!(engine.decode(&f).unwrap(), vec![FILLER; n]);
        }
    }

    #[test]
    fn fuzz_scrub_bodies() {
        let secret = format!(
            "{{\"kind\":\"Secret\",\"apiVersion\":\"v1\",\"metadata\":{{\"name\":\"s\",\
             \"annotations\":{{\"{LAST_APPLIED_ANNOTATION}\":\"{{\\\"data\\\":{{\\\"k\\\":\\\"SENTINEL-VALUE\\\"}}}}\"}}}},\
             \"data\":{{\"k\":\"SENTINEL-VALUE\"}},\"stringData\":{{\"s\":\"SENTINEL-VALUE\"}}}}"
        );
        let applied = r#"{"apiVersion":"v1","data":{"a":"SENTINEL-VALUE"},"kind":"Secret"}"#;
        let event = format!("{{\"type\":\"ADDED\",\"object\":{secret}}}\n");
        spinlink_fuzzing::Fuzz::new("agent-scrub")
            .seeds([
                secret.into_bytes(),
                applied.as_bytes().to_vec(),
                event.into_bytes(),
            ])
            .run(fuzz_scrub);
    }

    #[test]
    fn last_applied_values_are_withheld_keys_kept() {
        let applied = format!(
            "{{\"apiVersion\":\"v1\",\"data\":{{\"a\":\"{SENTINEL}\",\"b\":\"{SENTINEL}\"}},\
             \"kind\":\"Secret\",\"metadata\":{{\"annotations\":{{}},\"name\":\"x\"}},\
             \"stringData\":{{\"s\":\"{SENTINEL}\"}},\"type\":\"Opaque\"}}\n"
        );
        let out = withhold_values(&applied).unwrap();
        assert!(!out.contains(SENTINEL), "{out}");
        assert!(out.ends_with("}\n"), "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["data"], json!({"a": WITHHELD, "b": WITHHELD}));
        assert_eq!(v["stringData"], json!({"s": WITHHELD_TEXT}));
        assert_eq!(v["metadata"]["name"], "x");
        assert_eq!(v["type"], "Opaque");
        // null maps stay empty; what is not an object kubectl could read
        // is dropped.
        assert_eq!(
            withhold_values(r#"{"data":null}"#).as_deref(),
            Some("{\"data\":{}}\n")
        );
        for bad in ["[1]", "\"s\"", "{", "{\"data\":\"x\"}"] {
            assert_eq!(withhold_values(bad), None, "{bad}");
        }
        // Decodes to the words that say what happened.
        use base64::Engine as _;
        let words = base64::engine::general_purpose::STANDARD
            .decode(WITHHELD)
            .unwrap();
        assert_eq!(words, WITHHELD_TEXT.as_bytes());
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
