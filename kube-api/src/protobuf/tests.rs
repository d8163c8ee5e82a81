//! Checked against what a real kube-apiserver 1.36.2 and kubectl 1.33.1
//! exchanged (`kube-sim/fixtures/protobuf/`): the decoder must read their
//! bytes into the JSON the same server wrote for the same object, and the
//! encoder must write their bytes back exactly.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::*;
use crate::compare::{VARIES, mask};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kube-sim/fixtures/protobuf")
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every recorded body that is protobuf: (file, bytes).
fn protobuf_bodies() -> Vec<(String, Vec<u8>)> {
    let index: Value = serde_json::from_slice(&read("index.json")).unwrap();
    let mut out = Vec::new();
    for entry in index.as_array().unwrap() {
        let base = entry["file_base"].as_str().unwrap();
        for (side, key) in [
            ("request", "request_content_type"),
            ("response", "response_content_type"),
        ] {
            if entry[key].as_str().is_some_and(is_media_type) {
                let name = format!("{base}.{side}.bin");
                out.push((name.clone(), read(&name)));
            }
        }
    }
    let status = "../errors/406-accept-protobuf-customresource.bin".to_owned();
    out.push((status.clone(), read(&status)));
    assert!(out.len() >= 15, "{} protobuf bodies", out.len());
    out
}

fn normalize(v: &mut Value) {
    mask(v, VARIES);
}

fn drop_null_creation_timestamps(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.get("creationTimestamp").is_some_and(Value::is_null) {
                map.remove("creationTimestamp");
            }
            map.values_mut().for_each(drop_null_creation_timestamps);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_null_creation_timestamps),
        _ => {}
    }
}

#[test]
fn recorded_bodies_encode_back_byte_for_byte() {
    for (name, bytes) in protobuf_bodies() {
        let json = decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let again = encode(&json).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            again == bytes,
            "{name}: re-encoded differs\n{}\nvs recorded\n{}",
            serde_json::to_string_pretty(&wire_view(&again).unwrap()).unwrap(),
            serde_json::to_string_pretty(&wire_view(&bytes).unwrap()).unwrap()
        );
    }
}

/// The recorded exchanges whose `side` (`request`, `response`) is protobuf
/// and that have a JSON twin.
fn with_json_twins(side: &str) -> Vec<String> {
    let index: Value = serde_json::from_slice(&read("index.json")).unwrap();
    let bases: Vec<String> = index
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e[format!("{side}_content_type")]
                .as_str()
                .is_some_and(is_media_type)
        })
        .map(|e| e["file_base"].as_str().unwrap().to_owned())
        .filter(|b| dir().join(format!("{b}.as-json.{side}.bin")).exists())
        .collect();
    assert_eq!(bases.len(), 7, "{bases:?}");
    bases
}

#[test]
fn decoded_requests_are_the_json_kubectl_sends() {
    for base in with_json_twins("request") {
        let mut got = decode(&read(&format!("{base}.request.bin"))).unwrap();
        // The JSON twin was created in a namespace of its own.
        let twin = String::from_utf8(read(&format!("{base}.as-json.request.bin"))).unwrap();
        let mut want: Value =
            serde_json::from_str(&twin.replace("fx-proto-json", "fx-proto")).unwrap();
        // kubectl 1.33's Go types write a zero creationTimestamp as `null`;
        // 1.36's, which the decoder follows, leave it out (`omitzero`).
        for v in [&mut got, &mut want] {
            drop_null_creation_timestamps(v);
        }
        assert_eq!(got, want, "{base}");
    }
}

#[test]
fn decoded_answers_are_the_json_the_server_writes() {
    for base in with_json_twins("response") {
        let mut got = decode(&read(&format!("{base}.response.bin"))).unwrap();
        let twin = String::from_utf8(read(&format!("{base}.as-json.response.bin"))).unwrap();
        let mut want: Value =
            serde_json::from_str(&twin.replace("fx-proto-json", "fx-proto")).unwrap();
        normalize(&mut got);
        normalize(&mut want);
        let differences = crate::compare::differences(&got, &want, "");
        assert!(
            differences.is_empty(),
            "{base}:\n{}",
            differences.join("\n")
        );
    }
}

#[test]
fn the_custom_resource_status_decodes() {
    let status = decode(&read("../errors/406-accept-protobuf-customresource.bin")).unwrap();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 406);
    assert_eq!(status["reason"], "NotAcceptable");
}

#[test]
fn custom_resources_have_no_protobuf_form() {
    let gadget = serde_json::json!({"apiVersion": "fx.example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}});
    assert!(matches!(encode(&gadget), Err(Error::UnknownKind { .. })));
    assert!(!supports("fx.example.com/v1", "Gadget"));
    assert!(supports("apps/v1", "Deployment"));
    assert!(supports("v1", "Status"));
    // The envelope of a custom-resource create, as the recording sent it.
    assert_eq!(
        decode(b"k8s\0\x0a\x00"),
        Err(Error::UnknownKind {
            api_version: String::new(),
            kind: String::new()
        })
    );
    assert_eq!(decode(b"{}"), Err(Error::NoMagic));
}

#[test]
fn go_durations() {
    for (n, s) in [
        (0, "0s"),
        (1_500_000_000, "1.5s"),
        (3_723_000_000_000, "1h2m3s"),
        (2_000_000, "2ms"),
        (-60_000_000_000, "-1m0s"),
    ] {
        assert_eq!(convert::go_duration(n), s);
        assert_eq!(convert::parse_go_duration(s, "").unwrap(), n);
    }
}

#[test]
fn fuzz_decode_bodies() {
    let seeds: Vec<Vec<u8>> = protobuf_bodies().into_iter().map(|(_, b)| b).collect();
    spinlink_fuzzing::Fuzz::new("kube-api protobuf decode")
        .seeds(seeds)
        .run(super::fuzz_decode);
}
