//! Tables of custom resources, as the apiextensions-apiserver builds them: a
//! `Name` column, then the served version's `additionalPrinterColumns` (a CRD
//! without any gets `Age`), each cell the first value its JSONPath finds, typed
//! as the column says, `null` when nothing is found or the type does not fit.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::jsonpath::JsonPath;
use super::{AGE_DESC, IncludeObject, NAME_DESC, human_duration, row_object};
use crate::Resource;

/// One `additionalPrinterColumns` entry of a CRD version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterColumn {
    /// Column header.
    pub name: String,
    /// OpenAPI type: `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// OpenAPI format.
    pub format: String,
    /// Column description; empty means the server's default, which names the path.
    pub description: String,
    /// 0 is shown by default, higher only with `-o wide` (the server always sends it).
    pub priority: i64,
    /// JSONPath of the value, e.g. `.spec.cronSpec`.
    pub json_path: String,
}

impl PrinterColumn {
    /// The column a CRD version without `additionalPrinterColumns` is given.
    pub fn age() -> Self {
        PrinterColumn {
            name: "Age".into(),
            type_: "date".into(),
            format: String::new(),
            description: AGE_DESC.into(),
            priority: 0,
            json_path: ".metadata.creationTimestamp".into(),
        }
    }

    /// The columns of `version` in a CustomResourceDefinition (JSON), or
    /// `None` when the CRD does not serve that version.
    pub fn of_crd(crd: &Value, version: &str) -> Option<Vec<PrinterColumn>> {
        let v = crd["spec"]["versions"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == version)?;
        Some(Self::of_version(v))
    }

    /// The columns of one entry of a CRD's `spec.versions`.
    pub fn of_version(v: &Value) -> Vec<PrinterColumn> {
        let s = |c: &Value, k: &str| c[k].as_str().unwrap_or_default().to_owned();
        let cols: Vec<PrinterColumn> = v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| PrinterColumn {
                name: s(c, "name"),
                type_: s(c, "type"),
                format: s(c, "format"),
                description: s(c, "description"),
                priority: c["priority"].as_i64().unwrap_or(0),
                json_path: s(c, "jsonPath"),
            })
            .collect();
        if cols.is_empty() {
            vec![Self::age()]
        } else {
            cols
        }
    }

    fn definition(&self) -> Value {
        let description = if self.description.is_empty() {
            format!(
                "Custom resource definition column (in JSONPath format): {}",
                self.json_path
            )
        } else {
            self.description.clone()
        };
        json!({"name": self.name, "type": self.type_, "format": self.format,
            "description": description, "priority": self.priority})
    }
}

/// A whole number as Go's JSON encoder writes a float64 holding one (`3`,
/// not `3.0`); others as they are.
fn float(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        json!(f as i64)
    } else {
        json!(f)
    }
}

/// What Go's `fmt.Print` writes for a JSON value, as jsonpath prints a
/// non-string value into a `string` column.
fn go_print(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_print).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => {
            // Go prints map keys sorted; serde_json's map is sorted too.
            let parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{k}:{}", go_print(v)))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// `cellForJSONValue`, and jsonpath's printing for `string` columns.
fn cell(type_: &str, v: &Value, now: DateTime<Utc>) -> Value {
    match (type_, v) {
        (_, Value::Null) => Value::Null,
        ("string", v) => json!(go_print(v)),
        ("integer", Value::Number(n)) => match n.as_i64() {
            Some(i) => json!(i),
            None => json!(n.as_f64().unwrap_or(0.0) as i64),
        },
        ("number", Value::Number(n)) => float(n.as_f64().unwrap_or(0.0)),
        ("boolean", Value::Bool(b)) => json!(b),
        ("date", Value::String(s)) => match DateTime::parse_from_rfc3339(s) {
            Ok(t) => json!(human_duration(now - t.with_timezone(&Utc))),
            Err(_) => json!("<invalid>"),
        },
        _ => Value::Null,
    }
}

/// A Table of `objects` of the custom resource `res`, printed with `columns`
/// (from [`PrinterColumn::of_crd`]), as of `now`.
pub fn custom_table<'a>(
    res: Resource<'_>,
    columns: &[PrinterColumn],
    objects: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    include: IncludeObject,
    now: DateTime<Utc>,
) -> Value {
    // A path the server could not parse gives a convertor without columns
    // for it; here its cells are `null`.
    let paths: Vec<Option<JsonPath>> = columns
        .iter()
        .map(|c| JsonPath::parse(&c.json_path).ok())
        .collect();
    let mut defs = vec![json!({"name": "Name", "type": "string", "format": "name",
        "description": NAME_DESC, "priority": 0})];
    defs.extend(columns.iter().map(PrinterColumn::definition));
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|o| {
            let mut cells = vec![json!(o["metadata"]["name"].as_str().unwrap_or_default())];
            cells.extend(columns.iter().zip(&paths).map(|(c, p)| {
                match p.as_ref().and_then(|p| p.find(o).first().copied()) {
                    Some(v) => cell(&c.type_, v, now),
                    None => Value::Null,
                }
            }));
            json!({"cells": cells, "object": row_object(res, o, include)})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
        "columnDefinitions": defs, "rows": rows})
}
