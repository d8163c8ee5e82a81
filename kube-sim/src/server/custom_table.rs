//! `Table` output for custom resources, as the apiextensions-apiserver renders it: a
//! `Name` column, then the version's `additionalPrinterColumns` (or `Age` when it has
//! none); `date` cells as ages, values found by simple JSON paths.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::resources::{PrinterColumn, ResourceInfo};
use crate::store::crd::json_path;
use crate::table::{self, IncludeObject};

const NAME_DESC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn columns(res: &ResourceInfo) -> Vec<PrinterColumn> {
    let cols = res
        .custom
        .map(|c| c.printer_columns.clone())
        .unwrap_or_default();
    if !cols.is_empty() {
        return cols;
    }
    vec![PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: AGE_DESC.into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    }]
}

fn cell(col: &PrinterColumn, obj: &Value, now: DateTime<Utc>) -> Value {
    let Some(v) = json_path(obj, &col.json_path) else {
        return Value::Null;
    };
    match (col.type_.as_str(), v) {
        ("date", Value::String(s)) => match DateTime::parse_from_rfc3339(s) {
            Ok(t) => json!(table::human_duration(now - t.with_timezone(&Utc))),
            Err(_) => Value::Null,
        },
        ("integer", Value::Number(n)) => json!(n.as_f64().unwrap_or(0.0) as i64),
        ("string", Value::String(_)) => v.clone(),
        ("string", other) if !other.is_object() && !other.is_array() => json!(other.to_string()),
        (_, other) => other.clone(),
    }
}

/// A Table of `objects` of the custom resource `res`.
pub(crate) fn table<'a>(
    res: &ResourceInfo,
    objects: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    include: IncludeObject,
    now: DateTime<Utc>,
) -> Value {
    let cols = columns(res);
    let mut defs = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": NAME_DESC, "priority": 0}),
    ];
    defs.extend(cols.iter().map(|c| {
        json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority})
    }));
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|o| {
            let mut cells = vec![o["metadata"]["name"].clone()];
            cells.extend(cols.iter().map(|c| cell(c, o, now)));
            let object = match include {
                IncludeObject::Metadata => json!({"kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}),
                IncludeObject::Object => {
                    let mut full = o.clone();
                    full["kind"] = json!(res.kind);
                    full["apiVersion"] = json!(res.api_version);
                    full
                }
                IncludeObject::None => Value::Null,
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
        "columnDefinitions": defs, "rows": rows})
}

/// A Table of `objects` of any resource: custom ones here, built-in ones by `kube-api`.
pub(crate) fn any_table<'a>(
    res: &ResourceInfo,
    objects: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    include: IncludeObject,
) -> Value {
    let now = Utc::now();
    if res.custom.is_some() {
        table(res, objects, list_meta, include, now)
    } else {
        table::table(res.api(), objects, list_meta, include, now)
    }
}
