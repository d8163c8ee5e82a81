//! Answers from the cache: discovery documents, GET of one object and LIST
//! with label and field selectors, as JSON or as a Table. Returns `None` when
//! the cache cannot answer (kind not cached or not synced yet) so the request
//! is relayed instead.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use serde::Serialize;
use serde_json::Value;

use super::printer;
use super::route::{Query, ResourcePath};
use crate::accounts::Account;
use crate::http::body::{self, Body, full};
use spinlink_kube_api::table::{self, IncludeObject};
use spinlink_kube_api::{Resource, Selectors, Status};

fn json_response(body: Vec<u8>, content_type: &str) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from(body)));
    *resp.status_mut() = StatusCode::OK;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

/// The discovery document at `path`, if the snapshot has it. A request
/// that accepts aggregated discovery gets the cluster's own aggregated
/// document with its media type when the agent sent one (`/api`, `/apis`);
/// otherwise the plain document as `application/json`, which kubectl
/// accepts by falling back to one request per group version. An
/// aggregated document carries the API server's `ETag`, and a request that
/// names it in `If-None-Match` gets `304` with no body
/// ([`spinlink_kube_api::discovery`]).
pub fn discovery(
    account: &Account,
    path: &str,
    accept: &str,
    headers: &http::HeaderMap,
) -> Option<Response<Body>> {
    use spinlink_proto::aggregated;
    let cache = account.read_cache();
    let wants_aggregated = accept.contains(aggregated::MARK);
    // Only in the version asked for, as the API server negotiates: kubectl
    // 1.27–1.29 ask for `v2beta1` alone and must get the plain document.
    let aggregated_doc = wants_aggregated
        .then(|| cache.discovery(&format!("{path}{}", aggregated::PATH_SUFFIX)))
        .flatten()
        .filter(|doc| spinlink_kube_api::media::accepts_content_type(accept, &doc.content_type));
    let doc = match aggregated_doc {
        Some(doc) => doc,
        None => cache.discovery(path)?,
    };
    let content_type = if aggregated_doc.is_some() {
        doc.content_type.as_str()
    } else if wants_aggregated || doc.content_type.is_empty() {
        "application/json"
    } else {
        doc.content_type.as_str()
    };
    let etag = aggregated_doc.and_then(|d| d.etag.as_ref());
    let mut resp = match etag {
        Some(tag) if spinlink_kube_api::discovery::not_modified(headers, tag) => {
            let mut resp = Response::new(full(Bytes::new()));
            *resp.status_mut() = StatusCode::NOT_MODIFIED;
            resp
        }
        _ => {
            let mut resp = Response::new(full(doc.body.clone()));
            if let Ok(v) = header::HeaderValue::from_str(content_type) {
                resp.headers_mut().insert(header::CONTENT_TYPE, v);
            }
            resp
        }
    };
    if aggregated_doc.is_some() {
        spinlink_kube_api::discovery::cache_headers(resp.headers_mut(), etag);
    }
    Some(resp)
}

#[derive(Serialize)]
struct ListMeta<'a> {
    #[serde(rename = "resourceVersion")]
    resource_version: &'a str,
}

/// Everything of a List but its items.
#[derive(Serialize)]
struct ListHead<'a> {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
    metadata: ListMeta<'a>,
}

/// A List whose items are the cache's JSON texts, written as they are: no
/// object is parsed or serialised again. Items of a `typed` list (a
/// built-in kind's) leave out `kind` and `apiVersion`, as the server's do;
/// a custom resource's keep them.
fn list_json(head: &ListHead<'_>, items: &[Arc<str>], typed: bool) -> serde_json::Result<Vec<u8>> {
    let head = serde_json::to_vec(head)?;
    let size = head.len() + 13 + items.iter().map(|i| i.len() + 1).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    // `{"kind":…,"metadata":{…}` then `,"items":[…]}`.
    out.extend_from_slice(&head[..head.len() - 1]);
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match typed
            .then(|| crate::cache::type_members_len(item))
            .flatten()
        {
            Some(skip) => {
                out.push(b'{');
                out.extend_from_slice(&item.as_bytes()[1 + skip..]);
            }
            None => out.extend_from_slice(item.as_bytes()),
        }
    }
    // The items are the cache's texts, escaped as the server escapes
    // (`Entry`); the head has nothing to escape.
    out.extend_from_slice(b"]}\n");
    Ok(out)
}

/// The resource `path` names, as the shared API semantics take it.
fn resource_of<'a>(path: &'a ResourcePath, kind: &'a str) -> Resource<'a> {
    Resource {
        group: &path.group,
        version: &path.version,
        plural: &path.resource,
        kind,
    }
}

/// Answers a GET or LIST of `path` from the cache, or `None` to relay.
pub fn resource(
    account: &Account,
    path: &ResourcePath,
    query: &Query,
    accept: &str,
) -> Option<Response<Body>> {
    let (objects, info, rv, printer, typed) = {
        let cache = account.read_cache();
        let kind = cache
            .kind(&path.group, &path.version, &path.resource)
            .filter(|k| k.synced)?;
        if path.namespace.is_some() && !kind.info.namespaced {
            return None;
        }
        // A Table the facade cannot print as the server would is relayed.
        let printer = if table::wants_table(accept) {
            Some(printer::printer(
                &cache,
                resource_of(path, &kind.info.kind),
            )?)
        } else {
            None
        };
        if let Some(name) = &path.name {
            if path.namespace.is_none() && kind.info.namespaced {
                // `/api/v1/pods/x` is no object path; let the server say so.
                return None;
            }
            let key = (path.namespace.clone().unwrap_or_default(), name.clone());
            let Some(entry) = kind.objects.get(&key) else {
                return Some(body::status(&Status::not_found(
                    resource_of(path, &kind.info.kind),
                    name,
                )));
            };
            (
                vec![entry.json().clone()],
                kind.info.clone(),
                kind.resource_version.clone(),
                printer,
                false,
            )
        } else {
            let selectors = match Selectors::parse(
                resource_of(path, &kind.info.kind),
                query.get("labelSelector"),
                query.get("fieldSelector"),
            ) {
                Ok(s) => s,
                Err(e) => return Some(body::status(&Status::bad_request(e.to_string()))),
            };
            // Labels are kept beside each object; only a field selector
            // needs the object parsed.
            let objects: Vec<Arc<str>> = kind
                .objects
                .iter()
                .filter(|((ns, _), _)| path.namespace.as_ref().is_none_or(|want| want == ns))
                .filter(|(_, e)| selectors.labels.matches_with(|k| e.label(k)))
                .filter(|(_, e)| {
                    selectors.fields.is_empty() || selectors.fields.matches(&e.object())
                })
                .map(|(_, e)| e.json().clone())
                .collect();
            let typed = !printer::is_custom(&cache, resource_of(path, &kind.info.kind));
            (
                objects,
                kind.info.clone(),
                kind.resource_version.clone(),
                printer,
                typed,
            )
        }
    };
    let api_version = if info.group.is_empty() {
        info.version.clone()
    } else {
        format!("{}/{}", info.group, info.version)
    };
    let body = if let Some(printer) = printer {
        let parsed: Vec<Value> = objects
            .iter()
            .map(|o| serde_json::from_str(o).unwrap_or(Value::Null))
            .collect();
        let refs: Vec<&Value> = parsed.iter().collect();
        let include = IncludeObject::parse(query.get("includeObject"));
        let meta = if rv.is_empty() {
            serde_json::json!({})
        } else {
            serde_json::json!({"resourceVersion": rv})
        };
        let t = printer::render(
            &printer,
            resource_of(path, &info.kind),
            refs,
            meta,
            include,
            chrono::Utc::now(),
        );
        Ok(spinlink_kube_api::json::encode(&t))
    } else if path.name.is_some() {
        let mut body = Vec::with_capacity(objects[0].len() + 1);
        body.extend_from_slice(objects[0].as_bytes());
        body.push(b'\n');
        Ok(body)
    } else {
        list_json(
            &ListHead {
                kind: format!("{}List", info.kind),
                api_version,
                metadata: ListMeta {
                    resource_version: &rv,
                },
            },
            &objects,
            typed,
        )
    };
    Some(json_response(body.unwrap_or_default(), "application/json"))
}
