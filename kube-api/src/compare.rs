//! Comparing an answer with a recorded real-server answer, for the tests
//! of kube-sim, the facade and this crate: where two JSON values differ,
//! one readable line per place.

use serde_json::Value;

/// What a second create of the same object legitimately changes: the uid,
/// resourceVersion and times the server assigns, a Service's cluster
/// address, and a Job's uid in its labels and selector.
pub const VARIES: &[&str] = &[
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "time",
    "clusterIP",
    "clusterIPs",
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
];

/// Replaces the value of every member named in `keys`, at any depth, with
/// `"<varies>"`.
pub fn mask(v: &mut Value, keys: &[&str]) {
    match v {
        Value::Object(map) => {
            for (key, x) in map.iter_mut() {
                if keys.contains(&key.as_str()) {
                    *x = Value::String("<varies>".into());
                } else {
                    mask(x, keys);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|x| mask(x, keys)),
        _ => {}
    }
}

/// The places where `got` differs from `want` (the recorded answer), each
/// named by its path under `path`; empty when they are equal.
pub fn differences(got: &Value, want: &Value, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    differ(got, want, path, &mut out);
    out
}

fn differ(got: &Value, want: &Value, path: &str, out: &mut Vec<String>) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, gv) in g {
                match w.get(k) {
                    Some(wv) => differ(gv, wv, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}: {gv}, where the recording has nothing")),
                }
            }
            for (k, wv) in w {
                if !g.contains_key(k) {
                    out.push(format!("{path}.{k}: missing (the recording has {wv})"));
                }
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                differ(gv, wv, &format!("{path}[{i}]"), out);
            }
        }
        _ if got != want => out.push(format!("{path}: {got}, where the recording has {want}")),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_each_place() {
        let got = json!({"a": 1, "b": [1, 2], "c": {"d": "x"}});
        let want = json!({"a": 1, "b": [1, 3], "c": {}, "e": true});
        assert_eq!(
            differences(&got, &want, ""),
            [
                ".b[1]: 2, where the recording has 3",
                ".c.d: \"x\", where the recording has nothing",
                ".e: missing (the recording has true)",
            ]
        );
        assert!(differences(&got, &got, "").is_empty());
    }
}
