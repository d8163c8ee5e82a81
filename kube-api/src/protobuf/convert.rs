//! Between a decoded message and the JSON the API server's Go code would
//! write for it, and from JSON to the bytes its gogo-protobuf code would
//! write: fields in number order, map keys sorted, every non-pointer field
//! written even when zero, a pointer only when set. The few types with a
//! JSON form of their own (times, quantities, int-or-string, managed
//! fields, raw extensions, named string lists) are converted as their Go
//! `MarshalJSON`/`Marshal` methods do.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, SecondsFormat, Utc};
use prost::encoding::{WireType, encode_key, encode_varint};
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage,
    Value as PValue,
};
use serde_json::{Map, Value};

use super::schema::{GoField, Schema};
use super::{Error, Result};

const TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime";
const DURATION: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Duration";
const FIELDS_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1";
const INT_OR_STRING: &str = "k8s.io.apimachinery.pkg.util.intstr.IntOrString";
const QUANTITY: &str = "k8s.io.apimachinery.pkg.api.resource.Quantity";
const RAW_EXTENSION: &str = "k8s.io.apimachinery.pkg.runtime.RawExtension";

/// A Go named slice type (`metav1.Verbs`, `ExtraValue`): a message whose only
/// field is `repeated items`, written in JSON as the list itself.
fn is_named_list(desc: &MessageDescriptor) -> bool {
    let mut fields = desc.fields();
    matches!((fields.next(), fields.next()), (Some(f), None) if f.name() == "items" && f.is_list())
}

/// A type with a JSON form of its own (one value, not a struct of fields).
pub fn is_special(desc: &MessageDescriptor) -> bool {
    matches!(
        desc.full_name(),
        TIME | MICRO_TIME | DURATION | FIELDS_V1 | INT_OR_STRING | QUANTITY | RAW_EXTENSION
    ) || is_named_list(desc)
}

fn invalid(path: &str, reason: impl Into<String>) -> Error {
    Error::Invalid {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------- to JSON

/// The JSON object of `msg`, as Go's `encoding/json` writes the Go struct
/// protobuf decodes `msg` into.
pub fn to_json(msg: &DynamicMessage, path: &str) -> Result<Value> {
    let desc = msg.descriptor();
    if is_special(&desc) {
        return special_to_json(msg, path);
    }
    let mut out = Map::new();
    fields_to_json(msg, path, &mut out)?;
    Ok(Value::Object(out))
}

fn fields_to_json(msg: &DynamicMessage, path: &str, out: &mut Map<String, Value>) -> Result<()> {
    let schema = Schema::get();
    let desc = msg.descriptor();
    for field in desc.fields() {
        let go = schema.go_field(&desc, &field);
        if go.json == "-" {
            continue;
        }
        let here = format!("{path}.{}", field.name());
        let present = msg.has_field(&field);
        let value = msg.get_field(&field);
        if go.inline {
            if let Some(child) = value.as_message() {
                if is_special(&child.descriptor()) {
                    return Err(invalid(&here, "an inlined field of a special type"));
                }
                fields_to_json(child, &here, out)?;
            }
            continue;
        }
        let json = if field.is_map() {
            let map = value.as_map().map(|m| m.len()).unwrap_or(0);
            if map == 0 {
                // A Go map decoded from nothing is nil: `null`, or nothing.
                (!go.omitempty).then_some(Value::Null)
            } else {
                Some(map_to_json(&field, &value, &here)?)
            }
        } else if field.is_list() {
            let list = value.as_list().unwrap_or(&[]);
            if list.is_empty() {
                (!go.omitempty).then_some(Value::Null)
            } else {
                let kind = field.kind();
                let items = list
                    .iter()
                    .enumerate()
                    .map(|(i, v)| scalar_or_message_to_json(&kind, v, &format!("{here}[{i}]")))
                    .collect::<Result<Vec<_>>>()?;
                Some(Value::Array(items))
            }
        } else if go.pointer {
            if present {
                Some(scalar_or_message_to_json(&field.kind(), &value, &here)?)
            } else {
                None
            }
        } else {
            let json = scalar_or_message_to_json(&field.kind(), &value, &here)?;
            match (&field.kind(), go.omitempty) {
                // Go 1.24's omitzero does (a zero time is written `null`).
                (Kind::Message(_), _) if go.omitzero && json.is_null() => None,
                // Go's omitempty never leaves out a struct.
                (Kind::Message(_), _) | (_, false) => Some(json),
                (_, true) if is_zero_json(&json) => None,
                (_, true) => Some(json),
            }
        };
        if let Some(json) = json {
            out.insert(go_json_name(&go, &field), json);
        }
    }
    Ok(())
}

fn go_json_name(go: &GoField, field: &FieldDescriptor) -> String {
    if go.json.is_empty() {
        field.name().to_owned()
    } else {
        go.json.clone()
    }
}

/// Go's zero value (or JSON's `null`) for a scalar or list.
pub(crate) fn is_zero_json(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(_) => false,
    }
}

fn map_to_json(field: &FieldDescriptor, value: &PValue, path: &str) -> Result<Value> {
    let Some(map) = value.as_map() else {
        return Ok(Value::Null);
    };
    let Kind::Message(entry) = field.kind() else {
        return Err(invalid(path, "a map without an entry message"));
    };
    let value_kind = entry.map_entry_value_field().kind();
    let mut entries: Vec<(String, Value)> = Vec::with_capacity(map.len());
    for (k, v) in map {
        let key = map_key(k);
        let json = scalar_or_message_to_json(&value_kind, v, &format!("{path}[{key}]"))?;
        entries.push((key, json));
    }
    // Go writes map keys sorted.
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Value::Object(entries.into_iter().collect()))
}

fn map_key(k: &MapKey) -> String {
    match k {
        MapKey::String(s) => s.clone(),
        MapKey::I32(i) => i.to_string(),
        MapKey::I64(i) => i.to_string(),
        MapKey::U32(i) => i.to_string(),
        MapKey::U64(i) => i.to_string(),
        MapKey::Bool(b) => b.to_string(),
    }
}

fn scalar_or_message_to_json(kind: &Kind, value: &PValue, path: &str) -> Result<Value> {
    Ok(match value {
        PValue::Bool(b) => Value::Bool(*b),
        PValue::I32(i) => Value::from(*i),
        PValue::I64(i) => Value::from(*i),
        PValue::U32(i) => Value::from(*i),
        PValue::U64(i) => Value::from(*i),
        PValue::F32(f) => {
            serde_json::Number::from_f64(f64::from(*f)).map_or(Value::Null, Value::Number)
        }
        PValue::F64(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        PValue::String(s) => Value::String(s.clone()),
        PValue::Bytes(b) => Value::String(BASE64.encode(b)),
        PValue::EnumNumber(n) => Value::from(*n),
        PValue::Message(m) => to_json(m, path)?,
        PValue::List(_) | PValue::Map(_) => {
            return Err(invalid(
                path,
                format!("a nested collection where {kind:?} was expected"),
            ));
        }
    })
}

fn int_field(msg: &DynamicMessage, name: &str) -> i64 {
    match msg.get_field_by_name(name).as_deref() {
        Some(PValue::I64(i)) => *i,
        Some(PValue::I32(i)) => i64::from(*i),
        _ => 0,
    }
}

fn string_field(msg: &DynamicMessage, name: &str) -> String {
    msg.get_field_by_name(name)
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn bytes_field(msg: &DynamicMessage, name: &str) -> Option<bytes::Bytes> {
    msg.get_field_by_name(name)
        .and_then(|v| v.as_bytes().cloned())
}

fn special_to_json(msg: &DynamicMessage, path: &str) -> Result<Value> {
    let desc = msg.descriptor();
    match desc.full_name() {
        TIME | MICRO_TIME => {
            let (seconds, nanos) = (int_field(msg, "seconds"), int_field(msg, "nanos"));
            if !msg.has_field_by_name("seconds") && !msg.has_field_by_name("nanos") {
                // The zero time is an empty message (`metav1.Time` reads no
                // bytes as the zero time and writes it as `null`); the epoch,
                // written `seconds: 0, nanos: 0`, is a time like any other.
                return Ok(Value::Null);
            }
            let nanos = u32::try_from(nanos).map_err(|_| invalid(path, "negative nanos"))?;
            let t = DateTime::<Utc>::from_timestamp(seconds, nanos)
                .ok_or_else(|| invalid(path, "time out of range"))?;
            let format = if desc.full_name() == TIME {
                SecondsFormat::Secs
            } else {
                SecondsFormat::Micros
            };
            Ok(Value::String(t.to_rfc3339_opts(format, true)))
        }
        DURATION => Ok(Value::String(go_duration(int_field(msg, "duration")))),
        QUANTITY => Ok(Value::String(string_field(msg, "string"))),
        INT_OR_STRING => Ok(if int_field(msg, "type") == 1 {
            Value::String(string_field(msg, "strVal"))
        } else {
            Value::from(int_field(msg, "intVal"))
        }),
        FIELDS_V1 | RAW_EXTENSION => {
            let name = if desc.full_name() == FIELDS_V1 {
                "Raw"
            } else {
                "raw"
            };
            match bytes_field(msg, name) {
                Some(raw) if !raw.is_empty() => serde_json::from_slice(&raw)
                    .map_err(|e| invalid(path, format!("raw JSON: {e}"))),
                _ => Ok(Value::Null),
            }
        }
        _ => {
            let items = msg
                .get_field_by_name("items")
                .and_then(|v| v.as_list().map(<[PValue]>::to_vec))
                .unwrap_or_default();
            if items.is_empty() {
                return Ok(Value::Null);
            }
            Ok(Value::Array(
                items
                    .iter()
                    .map(|v| Value::String(v.as_str().unwrap_or_default().to_owned()))
                    .collect(),
            ))
        }
    }
}

/// A duration as Go's `time.Duration.String` writes it (`1h2m3.5s`, `0s`).
pub(crate) fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".to_owned();
    }
    let negative = nanos < 0;
    let n = nanos.unsigned_abs();
    let mut s = String::new();
    if negative {
        s.push('-');
    }
    if n < 1_000_000_000 {
        let (unit, div) = if n < 1_000 {
            ("ns", 1)
        } else if n < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        s.push_str(&fraction(n, div));
        s.push_str(unit);
        return s;
    }
    let (h, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (m, rest) = (rest / 60_000_000_000, rest % 60_000_000_000);
    if h > 0 {
        s.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        s.push_str(&format!("{m}m"));
    }
    s.push_str(&fraction(rest, 1_000_000_000));
    s.push('s');
    s
}

fn fraction(n: u64, div: u64) -> String {
    let whole = n / div;
    let frac = n % div;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = div.to_string().len() - 1;
    let f = format!("{frac:0digits$}");
    format!("{whole}.{}", f.trim_end_matches('0'))
}

pub(crate) fn parse_go_duration(s: &str, path: &str) -> Result<i64> {
    let bad = || invalid(path, format!("bad duration {s:?}"));
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Ok(0);
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    if !total.is_finite() || total > i64::MAX as f64 {
        return Err(bad());
    }
    let n = total as i64;
    Ok(if negative { -n } else { n })
}

// ---------------------------------------------------------------- from JSON

/// Appends the encoding of the JSON object `obj` as message `desc`.
pub fn encode_json(
    desc: &MessageDescriptor,
    obj: &Value,
    path: &str,
    out: &mut Vec<u8>,
) -> Result<()> {
    if is_special(desc) {
        return encode_special(desc, obj, path, out);
    }
    let empty = Map::new();
    let map = match obj {
        Value::Object(m) => m,
        Value::Null => &empty,
        _ => return Err(invalid(path, "expected an object")),
    };
    let schema = Schema::get();
    let mut fields: Vec<FieldDescriptor> = desc.fields().collect();
    fields.sort_by_key(FieldDescriptor::number);
    for field in fields {
        let go = schema.go_field(desc, &field);
        let here = format!("{path}.{}", field.name());
        let tag = field.number();
        if go.inline {
            let Kind::Message(child) = field.kind() else {
                return Err(invalid(&here, "an inlined scalar"));
            };
            let mut buf = Vec::new();
            encode_json(&child, obj, &here, &mut buf)?;
            write_len(tag, &buf, out);
            continue;
        }
        let value = map.get(&go_json_name(&go, &field)).unwrap_or(&Value::Null);
        if field.is_map() {
            let Value::Object(entries) = value else {
                if value.is_null() {
                    continue;
                }
                return Err(invalid(&here, "expected an object"));
            };
            let mut keys: Vec<&String> = entries.keys().collect();
            keys.sort();
            let Kind::Message(entry_desc) = field.kind() else {
                return Err(invalid(&here, "a map without an entry message"));
            };
            let key_field = entry_desc.map_entry_key_field();
            let value_field = entry_desc.map_entry_value_field();
            for k in keys {
                let mut entry = Vec::new();
                encode_single(&key_field, &Value::String(k.clone()), &here, &mut entry)?;
                encode_single(
                    &value_field,
                    &entries[k],
                    &format!("{here}[{k}]"),
                    &mut entry,
                )?;
                write_len(tag, &entry, out);
            }
        } else if field.is_list() {
            let Value::Array(items) = value else {
                if value.is_null() {
                    continue;
                }
                return Err(invalid(&here, "expected a list"));
            };
            for (i, item) in items.iter().enumerate() {
                encode_single(&field, item, &format!("{here}[{i}]"), out)?;
            }
        } else if value.is_null() {
            if go.pointer {
                continue;
            }
            // A non-pointer field is written even when it is zero.
            encode_single(&field, &Value::Null, &here, out)?;
        } else {
            encode_single(&field, value, &here, out)?;
        }
    }
    Ok(())
}

/// Appends a length-delimited field.
pub fn write_len(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn as_i64(v: &Value, path: &str) -> Result<i64> {
    match v {
        Value::Null => Ok(0),
        Value::Number(n) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e18)
                    .map(|f| f as i64)
            })
            .ok_or_else(|| invalid(path, format!("{n} is not an integer"))),
        _ => Err(invalid(path, "expected a number")),
    }
}

/// Encodes one value (a field that is not repeated, or one element of a
/// repeated field) with `field`'s tag.
fn encode_single(field: &FieldDescriptor, v: &Value, path: &str, out: &mut Vec<u8>) -> Result<()> {
    let tag = field.number();
    match field.kind() {
        Kind::Message(child) => {
            let mut buf = Vec::new();
            encode_json(&child, v, path, &mut buf)?;
            write_len(tag, &buf, out);
        }
        Kind::String => {
            let s = match v {
                Value::Null => "",
                Value::String(s) => s.as_str(),
                _ => return Err(invalid(path, "expected a string")),
            };
            write_len(tag, s.as_bytes(), out);
        }
        Kind::Bytes => {
            let b = match v {
                Value::Null => Vec::new(),
                Value::String(s) => BASE64
                    .decode(s)
                    .map_err(|e| invalid(path, format!("base64: {e}")))?,
                _ => return Err(invalid(path, "expected a base64 string")),
            };
            write_len(tag, &b, out);
        }
        Kind::Bool => {
            let b = match v {
                Value::Null => false,
                Value::Bool(b) => *b,
                _ => return Err(invalid(path, "expected a boolean")),
            };
            encode_key(tag, WireType::Varint, out);
            encode_varint(u64::from(b), out);
        }
        Kind::Int32 | Kind::Int64 | Kind::Uint32 | Kind::Uint64 | Kind::Enum(_) => {
            let n = as_i64(v, path)?;
            let n = if matches!(field.kind(), Kind::Int32 | Kind::Enum(_)) {
                i64::from(i32::try_from(n).map_err(|_| invalid(path, "out of range for int32"))?)
            } else {
                n
            };
            encode_key(tag, WireType::Varint, out);
            // Negative int32 and int64 are written as 64-bit two's complement.
            encode_varint(n as u64, out);
        }
        Kind::Double => {
            let f = match v {
                Value::Null => 0.0,
                Value::Number(n) => n.as_f64().unwrap_or(0.0),
                _ => return Err(invalid(path, "expected a number")),
            };
            encode_key(tag, WireType::SixtyFourBit, out);
            out.extend_from_slice(&f.to_le_bytes());
        }
        Kind::Float => {
            let f = match v {
                Value::Null => 0.0,
                Value::Number(n) => n.as_f64().unwrap_or(0.0) as f32,
                _ => return Err(invalid(path, "expected a number")),
            };
            encode_key(tag, WireType::ThirtyTwoBit, out);
            out.extend_from_slice(&f.to_le_bytes());
        }
        other => {
            return Err(invalid(
                path,
                format!("{other:?} is not used by Kubernetes"),
            ));
        }
    }
    Ok(())
}

fn encode_special(
    desc: &MessageDescriptor,
    v: &Value,
    path: &str,
    out: &mut Vec<u8>,
) -> Result<()> {
    let varint = |tag: u32, n: i64, out: &mut Vec<u8>| {
        encode_key(tag, WireType::Varint, out);
        encode_varint(n as u64, out);
    };
    match desc.full_name() {
        TIME | MICRO_TIME => {
            let Value::String(s) = v else {
                if v.is_null() {
                    // The zero time is an empty message.
                    return Ok(());
                }
                return Err(invalid(path, "expected an RFC 3339 time"));
            };
            let t = DateTime::parse_from_rfc3339(s)
                .map_err(|e| invalid(path, format!("time {s:?}: {e}")))?;
            varint(1, t.timestamp(), out);
            // `metav1.Time` keeps whole seconds; `MicroTime` microseconds.
            let nanos = if desc.full_name() == TIME {
                0
            } else {
                i64::from(t.timestamp_subsec_micros()) * 1000
            };
            varint(2, nanos, out);
        }
        DURATION => {
            let n = match v {
                Value::String(s) => parse_go_duration(s, path)?,
                Value::Null => 0,
                _ => return Err(invalid(path, "expected a duration string")),
            };
            varint(1, n, out);
        }
        QUANTITY => {
            let s = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Null => String::new(),
                _ => return Err(invalid(path, "expected a quantity")),
            };
            write_len(1, s.as_bytes(), out);
        }
        INT_OR_STRING => {
            let (kind, int, string) = match v {
                Value::String(s) => (1, 0, s.as_str()),
                Value::Null => (0, 0, ""),
                n => (0, as_i64(n, path)?, ""),
            };
            let int = i32::try_from(int).map_err(|_| invalid(path, "out of range for int32"))?;
            varint(1, kind, out);
            varint(2, i64::from(int), out);
            write_len(3, string.as_bytes(), out);
        }
        FIELDS_V1 | RAW_EXTENSION => {
            if !v.is_null() {
                let raw = serde_json::to_vec(v).map_err(|e| invalid(path, e.to_string()))?;
                write_len(1, &raw, out);
            }
        }
        _ => {
            let Value::Array(items) = v else {
                if v.is_null() {
                    return Ok(());
                }
                return Err(invalid(path, "expected a list"));
            };
            for item in items {
                let Value::String(s) = item else {
                    return Err(invalid(path, "expected a list of strings"));
                };
                write_len(1, s.as_bytes(), out);
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- wire view

/// The fields `msg` has on the wire, by proto name, zero values included,
/// special types as their messages: what a reader of the bytes sees, for
/// comparing two encodings field by field.
pub fn wire_view(msg: &DynamicMessage) -> Value {
    let mut out = Map::new();
    for (field, value) in msg.fields() {
        out.insert(field.name().to_owned(), wire_value(value));
    }
    Value::Object(out)
}

fn wire_value(v: &PValue) -> Value {
    match v {
        PValue::Message(m) => wire_view(m),
        PValue::List(items) => Value::Array(items.iter().map(wire_value).collect()),
        PValue::Map(map) => {
            let mut entries: Vec<(String, Value)> = map
                .iter()
                .map(|(k, v)| (map_key(k), wire_value(v)))
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().collect())
        }
        PValue::Bytes(b) => match std::str::from_utf8(b) {
            Ok(s) => Value::String(s.to_owned()),
            Err(_) => Value::String(BASE64.encode(b)),
        },
        other => scalar_or_message_to_json(&Kind::Bool, other, "").unwrap_or(Value::Null),
    }
}
