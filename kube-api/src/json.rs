//! JSON bytes as the API server writes them. Its JSON serializer
//! (`k8s.io/apimachinery/pkg/runtime/serializer/json`) writes with Go's
//! `json.Encoder`: compact, `<`, `>`, `&`, U+2028 and U+2029 escaped inside
//! strings, and one newline after the document. Every JSON answer recorded
//! from kube-apiserver 1.36 has exactly that many bytes (`authz/` and
//! `protobuf/` `*.response.json`: "JSON, compact (no indentation), followed
//! by one newline"; `errors/requests.json` for `metav1.Status` bodies), one
//! of them with an escaped `&`. The exceptions write indented JSON without
//! the newline (Go's `json.MarshalIndent`): `406` Status bodies and
//! `/version`.

use std::borrow::Cow;

use serde::Serialize;

/// `value` as the API server sends it: [`compact`] and a newline.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = compact(value);
    out.push(b'\n');
    out
}

/// `value` as compact, [`escaped`] JSON: an answer without its newline, or
/// the object of a watch event.
pub fn compact<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    // Serialising into memory fails only for maps with non-string keys,
    // which no API document has.
    escape_text(serde_json::to_vec(value).unwrap_or_default())
}

/// `value` indented as Go's `json.MarshalIndent(v, "", "  ")` writes it
/// (escaped alike, no newline after).
pub fn encode_indented<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    escape_text(serde_json::to_vec_pretty(value).unwrap_or_default())
}

/// [`escaped`] for text the caller owns: the same text back, not copied,
/// when there is nothing to escape.
pub fn escape_text(json: Vec<u8>) -> Vec<u8> {
    match escaped(&json) {
        Cow::Borrowed(_) => json,
        Cow::Owned(out) => out,
    }
}

/// JSON text (as serde_json writes it) with what Go's `encoding/json`
/// escapes escaped: `<`, `>`, `&`, U+2028 and U+2029. In JSON these occur
/// only inside strings, where serde_json leaves them as they are. Borrowed
/// when there is nothing to escape, as in most documents.
pub fn escaped(json: &[u8]) -> Cow<'_, [u8]> {
    let needs = |b: &u8| matches!(b, b'<' | b'>' | b'&' | 0xE2);
    let Some(first) = json.iter().position(needs) else {
        return Cow::Borrowed(json);
    };
    let mut out = Vec::with_capacity(json.len() + 16);
    out.extend_from_slice(&json[..first]);
    let mut i = first;
    while i < json.len() {
        match json[i] {
            b'<' => out.extend_from_slice(b"\\u003c"),
            b'>' => out.extend_from_slice(b"\\u003e"),
            b'&' => out.extend_from_slice(b"\\u0026"),
            0xE2 if json.get(i + 1) == Some(&0x80)
                && matches!(json.get(i + 2), Some(0xA8 | 0xA9)) =>
            {
                out.extend_from_slice(if json[i + 2] == 0xA8 {
                    b"\\u2028"
                } else {
                    b"\\u2029"
                });
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(out)
}

/// Fuzz body: escaping any text keeps its JSON meaning and leaves nothing
/// Go would escape.
pub fn fuzz_escaped(data: &[u8]) {
    let out = escaped(data);
    assert!(!out.iter().any(|b| matches!(b, b'<' | b'>' | b'&')));
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let back: serde_json::Value =
            serde_json::from_slice(&out).expect("escaped JSON is still JSON");
        assert_eq!(back, value, "escaping changed the document");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn go_escapes_what_json_marshal_escapes_and_nothing_else() {
        assert_eq!(
            &escaped("{\"a\":\"<b> & \u{2028}\u{2029}é\"}".as_bytes())[..],
            br#"{"a":"\u003cb\u003e \u0026 \u2028\u2029"#
                .iter()
                .chain("é\"}".as_bytes())
                .copied()
                .collect::<Vec<u8>>()
        );
        assert_eq!(
            &escaped("{\"a\":\"€\"}".as_bytes())[..],
            "{\"a\":\"€\"}".as_bytes()
        );
        assert!(matches!(escaped(b"{\"a\":1}"), Cow::Borrowed(_)));
    }

    #[test]
    fn fuzz_json_escaped() {
        spinlink_fuzzing::Fuzz::new("kube-api JSON escapes")
            .seeds([
                br#"{"a":"<b> & </b>","b":["\u2028"]}"#.to_vec(),
                "{\"a\":\"\u{2028}\u{2029}é€\"}".as_bytes().to_vec(),
                b"\xe2\x80".to_vec(),
            ])
            .run(fuzz_escaped);
    }

    fn fixture(rel: &str) -> Value {
        let path = format!("{}/../kube-sim/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    }

    /// Every JSON answer recorded with its size (`authz/`, `protobuf/`):
    /// the document as [`encode`] writes it has exactly the bytes the
    /// server sent — one with an `&` it escaped among them.
    #[test]
    fn encoded_documents_have_the_recorded_sizes() {
        let mut checked = 0;
        let mut escapes = 0;
        for dir in ["authz", "protobuf"] {
            let path = format!("{}/../kube-sim/fixtures/{dir}", env!("CARGO_MANIFEST_DIR"));
            for entry in std::fs::read_dir(path).unwrap() {
                let name = entry.unwrap().file_name().into_string().unwrap();
                if !name.ends_with(".response.json") {
                    continue;
                }
                let recorded = fixture(&format!("{dir}/{name}"));
                let body = &recorded["body"];
                if body["content_type"] != "application/json" || body.get("decoded").is_none() {
                    continue;
                }
                assert!(
                    body["format"]
                        .as_str()
                        .unwrap()
                        .starts_with("JSON, compact (no indentation), followed by one newline"),
                    "{name}"
                );
                let encoded = encode(&body["decoded"]);
                assert_eq!(
                    encoded.len() as u64,
                    body["bytes"].as_u64().unwrap(),
                    "{dir}/{name}"
                );
                escapes += usize::from(encoded.windows(6).any(|w| w == b"\\u0026"));
                checked += 1;
            }
        }
        assert!(checked >= 20, "only {checked} recorded answers");
        assert!(escapes >= 1, "no recorded answer with an escape");
    }
}
