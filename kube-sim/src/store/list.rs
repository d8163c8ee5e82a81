//! Reads: paginated, consistent lists and the event feed watches consume.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Value, json};

use super::{EventType, Key, Sim, State};
use crate::error::Status;
use crate::resources::ResourceInfo;
use crate::selector::Selectors;

/// The message the real server gives for an expired continue token.
pub(crate) const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// Watch events as one watcher sees them.
pub(crate) type Events = Vec<(EventType, Arc<Value>)>;

/// One LIST request.
#[derive(Debug, Clone)]
pub(crate) struct ListQuery<'a> {
    pub res: &'static ResourceInfo,
    pub namespace: Option<&'a str>,
    pub selectors: &'a Selectors,
    pub limit: Option<usize>,
    pub continue_token: Option<&'a str>,
    /// `resourceVersion` with `resourceVersionMatch=Exact`: list as of that version.
    pub exact_rv: Option<u64>,
}

/// One page of a LIST answer.
#[derive(Debug, Clone)]
pub(crate) struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// What one watch selects.
#[derive(Debug, Clone)]
pub(crate) struct WatchFilter {
    pub res: &'static ResourceInfo,
    pub namespace: Option<String>,
    pub selectors: Selectors,
}

impl WatchFilter {
    fn selects_key(&self, key: &Key) -> bool {
        key.resource == self.res.storage_key()
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| key.namespace == ns)
    }
}

fn encode_continue(rv: u64, key: &Key) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}\u{0}", key.namespace, key.name)});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    let rv = v["rv"].as_u64()?;
    let start = v["start"].as_str()?.strip_suffix('\u{0}')?;
    let (ns, name) = start.split_once('/')?;
    Some((rv, ns.to_string(), name.to_string()))
}

impl Sim {
    /// The objects of `res` (in `namespace`) as they were at `rv`, keyed by (namespace, name).
    fn snapshot(
        st: &State,
        res: &'static ResourceInfo,
        namespace: Option<&str>,
        rv: u64,
    ) -> BTreeMap<(String, String), Arc<Value>> {
        let mut snap: BTreeMap<(String, String), Arc<Value>> = Self::range(st, res)
            .filter(|(k, _)| namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(k, v)| ((k.namespace.clone(), k.name.clone()), v.clone()))
            .collect();
        let start = st.history.partition_point(|e| e.rv <= rv);
        for e in st.history.range(start..).rev() {
            if e.key.resource != res.storage_key()
                || namespace.is_some_and(|ns| e.key.namespace != ns)
            {
                continue;
            }
            let k = (e.key.namespace.clone(), e.key.name.clone());
            match (e.ty, &e.old) {
                (EventType::Added, _) => {
                    snap.remove(&k);
                }
                (_, Some(old)) => {
                    snap.insert(k, old.clone());
                }
                (_, None) => {}
            }
        }
        snap
    }

    /// Answers one LIST request: a page, consistent with its first page at one resourceVersion.
    pub(crate) fn list_page(&self, q: &ListQuery<'_>) -> Result<ListPage, Status> {
        let st = self.lock();
        let (rv, after) = match q.continue_token {
            Some(token) if !token.is_empty() => {
                let (rv, ns, name) = decode_continue(token).ok_or_else(|| {
                    Status::bad_request(
                        "continue key is not valid: the continue token could not be decoded",
                    )
                })?;
                if rv < st.compacted || rv > st.rv {
                    let mut status = Status::expired(CONTINUE_EXPIRED);
                    status.metadata = json!({"continue": encode_continue(st.rv, &Key { resource: q.res.storage_key(), namespace: ns, name })});
                    return Err(status);
                }
                (rv, Some((ns, name)))
            }
            _ => match q.exact_rv {
                Some(rv) if rv < st.compacted => {
                    return Err(Status::expired(format!(
                        "too old resource version: {rv} ({})",
                        st.compacted
                    )));
                }
                Some(rv) if rv <= st.rv => (rv, None),
                _ => (st.rv, None),
            },
        };
        let snap = Self::snapshot(&st, q.res, q.namespace, rv);
        drop(st);
        let mut matching = snap
            .into_iter()
            .filter(|(k, _)| after.as_ref().is_none_or(|a| k > a))
            .filter(|(_, o)| q.selectors.matches(o));
        let limit = q
            .limit
            .filter(|l| *l > 0)
            .unwrap_or(usize::MAX)
            .min(self.config().max_page);
        let mut items = Vec::new();
        let mut last = None;
        for (k, o) in matching.by_ref() {
            items.push(o);
            last = Some(k);
            if items.len() == limit {
                break;
            }
        }
        let rest = matching.count() as u64;
        let (continue_token, remaining) = match (rest, last) {
            (0, _) | (_, None) => (None, None),
            (n, Some((ns, name))) => (
                Some(encode_continue(
                    rv,
                    &Key {
                        resource: q.res.storage_key(),
                        namespace: ns,
                        name,
                    },
                )),
                // The real server counts the rest only when no selector filters it.
                q.selectors.is_empty().then_some(n),
            ),
        };
        Ok(ListPage {
            items,
            resource_version: rv,
            continue_token,
            remaining,
        })
    }

    /// Starts a watch: the synthetic ADDED events for the current objects (when
    /// `from` is `None`) and the resourceVersion the watch continues after.
    pub(crate) fn watch_start(
        &self,
        filter: &WatchFilter,
        from: Option<u64>,
    ) -> Result<(Events, u64), Status> {
        let st = self.lock();
        match from {
            Some(rv) if rv < st.compacted => Err(Status::expired(format!(
                "too old resource version: {rv} ({})",
                st.compacted
            ))),
            Some(rv) => Ok((Vec::new(), rv)),
            None => {
                let initial = Self::range(&st, filter.res)
                    .filter(|(k, o)| filter.selects_key(k) && filter.selectors.matches(o))
                    .map(|(_, o)| (EventType::Added, o.clone()))
                    .collect();
                Ok((initial, st.rv))
            }
        }
    }

    /// The events a watch has not seen yet after `cursor`, as this watcher sees them
    /// (an object that stops matching its selectors is DELETED for it), and the new cursor.
    pub(crate) fn events_since(
        &self,
        filter: &WatchFilter,
        cursor: u64,
    ) -> Result<(Events, u64), Status> {
        let st = self.lock();
        if cursor < st.compacted {
            return Err(Status::expired(format!(
                "too old resource version: {cursor} ({})",
                st.compacted
            )));
        }
        let start = st.history.partition_point(|e| e.rv <= cursor);
        let mut out = Vec::new();
        for e in st.history.range(start..) {
            if !filter.selects_key(&e.key) {
                continue;
            }
            let now = filter.selectors.matches(&e.object);
            let before = e.old.as_ref().is_some_and(|o| filter.selectors.matches(o));
            let ty = match e.ty {
                EventType::Added if now => EventType::Added,
                EventType::Modified if now && before => EventType::Modified,
                EventType::Modified if now => EventType::Added,
                EventType::Modified if before => EventType::Deleted,
                EventType::Deleted if now || before => EventType::Deleted,
                _ => continue,
            };
            out.push((ty, e.object.clone()));
        }
        Ok((out, st.rv.max(cursor)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let key = Key {
            resource: "configmaps",
            namespace: "demo".into(),
            name: "churn16".into(),
        };
        let t = encode_continue(1489, &key);
        assert_eq!(
            decode_continue(&t),
            Some((1489, "demo".into(), "churn16".into()))
        );
        assert_eq!(decode_continue("not-a-token"), None);
        assert_eq!(decode_continue(""), None);
    }
}
