//! The field set (`FieldsV1`) of a `managedFields` entry a create records
//! for its field manager, computed from the kind's schema as the API
//! server's structured-merge-diff computes it for an `Update` from nothing:
//! every field the object sets that an empty object of its kind would not
//! have. A map, a pointer or `omitempty` field is absent from an empty
//! object, so it is new and listed itself (`"."`) besides its children; a
//! struct that is not a pointer is there (empty) already, so only its
//! children are; list items are `k:{keys}` (`+listType=map`) or `v:value`
//! (`+listType=set`); atomic lists, maps and structs are one leaf.

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value};

use super::convert::{is_special, is_zero_json};
use super::schema::{ListType, Schema};

/// Metadata the server sets or that names the object, never managed.
const UNMANAGED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// The field set a create of `object` (with `apiVersion` and `kind`)
/// records, `status` left out; `None` for a kind with no schema here. An
/// object that sets nothing gives an empty set (and the API server records
/// no entry).
pub fn create_fields_v1(object: &Value) -> Option<Value> {
    let text = |k: &str| object.get(k).and_then(Value::as_str).unwrap_or_default();
    let schema = Schema::get();
    let message = schema.kind(text("apiVersion"), text("kind"))?;
    let mut trimmed = object.as_object()?.clone();
    trimmed.remove("status");
    if let Some(Value::Object(meta)) = trimmed.get_mut("metadata") {
        for k in UNMANAGED_METADATA {
            meta.remove(*k);
        }
    }
    Some(Value::Object(sorted(set_of(
        &message,
        &Value::Object(trimmed),
        false,
    ))))
}

/// structured-merge-diff writes a set's members sorted.
fn sorted(map: Map<String, Value>) -> Map<String, Value> {
    let mut entries: Vec<(String, Value)> = map.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
        .into_iter()
        .map(|(k, v)| match v {
            Value::Object(m) => (k, Value::Object(sorted(m))),
            other => (k, other),
        })
        .collect()
}

fn leaf() -> Value {
    Value::Object(Map::new())
}

/// The members under a struct; `added`: the struct itself is new, so
/// everything in it is.
fn set_of(desc: &MessageDescriptor, obj: &Value, added: bool) -> Map<String, Value> {
    let schema = Schema::get();
    let mut out = Map::new();
    for field in desc.fields() {
        let go = schema.go_field(desc, &field);
        if go.json == "-" {
            continue;
        }
        if go.inline {
            if let Kind::Message(child) = field.kind() {
                out.extend(set_of(&child, obj, added));
            }
            continue;
        }
        let name = if go.json.is_empty() {
            field.name()
        } else {
            go.json.as_str()
        };
        let Some(value) = obj.get(name).filter(|v| !v.is_null()) else {
            continue;
        };
        let is_struct =
            matches!(field.kind(), Kind::Message(_)) && !field.is_list() && !field.is_map();
        let field_added = added || go.pointer || (go.omitempty && !is_struct);
        if let Some(member) = value_set(&field, &go, value, field_added) {
            out.insert(format!("f:{name}"), member);
        }
    }
    out
}

fn value_set(
    field: &FieldDescriptor,
    go: &super::schema::GoField,
    value: &Value,
    added: bool,
) -> Option<Value> {
    let schema = Schema::get();
    if field.is_map() {
        if go.map_atomic {
            return Some(leaf());
        }
        let mut m = Map::new();
        if added {
            m.insert(".".into(), leaf());
        }
        let value_kind = match field.kind() {
            Kind::Message(entry) => entry.map_entry_value_field().kind(),
            other => other,
        };
        for (k, v) in value.as_object()? {
            let member = match &value_kind {
                Kind::Message(d) if !is_special(d) && !schema.is_atomic(d) => {
                    let mut child = set_of(d, v, true);
                    child.insert(".".into(), leaf());
                    Value::Object(child)
                }
                _ => leaf(),
            };
            m.insert(format!("f:{k}"), member);
        }
        return (added || m.len() > usize::from(added)).then_some(Value::Object(m));
    }
    if field.is_list() {
        let items = value.as_array()?;
        let item_desc = match field.kind() {
            Kind::Message(d) if !is_special(&d) => Some(d),
            _ => None,
        };
        let mut m = Map::new();
        match (go.list, &item_desc) {
            (ListType::Map, Some(d)) if !go.keys.is_empty() => {
                if added {
                    m.insert(".".into(), leaf());
                }
                for item in items {
                    let mut key = Map::new();
                    for k in &go.keys {
                        if let Some(v) = item.get(k) {
                            key.insert(k.clone(), v.clone());
                        }
                    }
                    let mut child = set_of(d, item, true);
                    child.insert(".".into(), leaf());
                    m.insert(format!("k:{}", Value::Object(key)), Value::Object(child));
                }
            }
            (ListType::Set, None) => {
                if added {
                    m.insert(".".into(), leaf());
                }
                for item in items {
                    m.insert(format!("v:{item}"), leaf());
                }
            }
            _ => return Some(leaf()),
        }
        return (added || !items.is_empty()).then_some(Value::Object(m));
    }
    match field.kind() {
        Kind::Message(d) if !is_special(&d) && !schema.is_atomic(&d) => {
            let mut child = set_of(&d, value, added);
            if child.is_empty() {
                return added.then(leaf);
            }
            if added {
                child.insert(".".into(), leaf());
            }
            Some(Value::Object(child))
        }
        Kind::Message(_) => Some(leaf()),
        // A scalar an empty object has too counts only when it is set.
        _ => (added || !is_zero_json(value)).then(leaf),
    }
}
