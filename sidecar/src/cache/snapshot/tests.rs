use serde_json::json;
use spinlink_proto::v1::watch_event::Type as EventType;

use super::*;
use crate::cache::Applied;

fn pods() -> v1::Kind {
    v1::Kind {
        group: String::new(),
        version: "v1".into(),
        resource: "pods".into(),
        kind: "Pod".into(),
        namespaced: true,
    }
}

fn deployments() -> v1::Kind {
    v1::Kind {
        group: "apps".into(),
        version: "v1".into(),
        resource: "deployments".into(),
        kind: "Deployment".into(),
        namespaced: true,
    }
}

fn event(kind: v1::Kind, ty: EventType, name: &str, rv: &str, spec: i64) -> v1::WatchEvent {
    let object = json!({"metadata": {"name": name, "namespace": "a", "resourceVersion": rv,
        "labels": {"app": name}}, "spec": spec});
    v1::WatchEvent {
        r#type: ty as i32,
        kind: Some(kind),
        resource_version: rv.into(),
        object: serde_json::to_vec(&object).unwrap(),
    }
}

fn listed(c: &mut Cache, kind: v1::Kind, objects: &[(&str, &str)], rv: &str) {
    c.sync_start(&kind);
    for (name, orv) in objects {
        c.apply(&event(kind.clone(), EventType::Added, name, orv, 0))
            .unwrap();
    }
    c.sync_end(&kind, rv);
}

/// Writes `view` in chunks of `chunk` bytes and reads it back fed in
/// slices of `slice` bytes.
fn round_trip(view: View, chunk: usize, slice: usize) -> Result<Loaded> {
    let bytes: Vec<u8> = view.chunks(chunk).flat_map(|c| c.to_vec()).collect();
    let mut reader = Reader::new(u64::MAX);
    for part in bytes.chunks(slice) {
        reader.push(part)?;
    }
    reader.finish()
}

fn objects_of(c: &Cache, kind: &v1::Kind) -> Vec<(String, String, Value)> {
    c.kind(&kind.group, &kind.version, &kind.resource)
        .unwrap()
        .objects
        .iter()
        .map(|((_, n), e)| (n.clone(), e.resource_version.clone(), e.object()))
        .collect()
}

fn source() -> Cache {
    let mut c = Cache::default();
    listed(&mut c, pods(), &[("p1", "5"), ("p2", "7")], "9");
    c.apply(&event(pods(), EventType::Modified, "p1", "11", 3))
        .unwrap();
    listed(&mut c, deployments(), &[("d1", "4")], "9");
    // A kind whose first listing has not ended, and one listed again: not
    // complete, so not handed over.
    let services = v1::Kind {
        resource: "services".into(),
        kind: "Service".into(),
        ..pods()
    };
    c.sync_start(&services);
    let configmaps = v1::Kind {
        resource: "configmaps".into(),
        kind: "ConfigMap".into(),
        ..pods()
    };
    listed(&mut c, configmaps.clone(), &[("c1", "2")], "3");
    c.sync_start(&configmaps);
    c
}

#[test]
fn a_snapshot_round_trips_every_completed_kind() {
    let from = source();
    let view = from.snapshot(4711);
    assert_eq!((view.kinds(), view.objects()), (2, 3));
    // Tiny chunks and odd slices: lines are split everywhere.
    let loaded = round_trip(view, 7, 3).unwrap();
    assert_eq!(loaded.seq, 4711);
    assert_eq!((loaded.kinds(), loaded.objects()), (2, 3));
    let mut to = Cache::default();
    assert_eq!(to.load(loaded), 2);
    for kind in [pods(), deployments()] {
        assert_eq!(objects_of(&to, &kind), objects_of(&from, &kind));
        let (a, b) = (
            to.kind(&kind.group, &kind.version, &kind.resource).unwrap(),
            from.kind(&kind.group, &kind.version, &kind.resource)
                .unwrap(),
        );
        assert!(a.synced);
        assert_eq!(a.resource_version, b.resource_version);
        assert_eq!(a.info, b.info);
    }
    assert_eq!(to.kind("", "v1", "pods").unwrap().resource_version, "11");
    assert!(to.kind("", "v1", "services").is_none());
    assert!(to.kind("", "v1", "configmaps").is_none());
    // Labels come back for selectors.
    let p1 = &to.kind("", "v1", "pods").unwrap().objects[&("a".to_owned(), "p1".to_owned())];
    assert_eq!(p1.label("app"), Some("p1"));
    // Watches of a loaded kind start at its resourceVersion.
    let key = KindKey::of(&pods());
    assert!(to.watch(&key, Some(11), |_, _| true).unwrap().is_ok());
    assert!(to.watch(&key, Some(10), |_, _| true).unwrap().is_err());
    // Same bytes whole.
    let whole = round_trip(from.snapshot(1), DEFAULT_CHUNK_BYTES, usize::MAX).unwrap();
    assert_eq!(whole.objects(), 3);
}

#[test]
fn a_loaded_snapshot_takes_the_agents_replay_idempotently() {
    let mut to = Cache::default();
    to.load(round_trip(source().snapshot(0), 64, 64).unwrap());
    // The agent's unacked window replays events the snapshot already holds:
    // older or equal versions change nothing.
    for (ty, name, rv, spec) in [
        (EventType::Added, "p1", "5", 0),
        (EventType::Modified, "p1", "11", 99),
        (EventType::Deleted, "p2", "6", 0),
    ] {
        assert_eq!(
            to.apply(&event(pods(), ty, name, rv, spec)).unwrap(),
            Applied::Unchanged,
            "{name}@{rv}"
        );
    }
    let spec = |c: &Cache, n: &str| {
        c.kind("", "v1", "pods")
            .unwrap()
            .objects
            .get(&("a".to_owned(), n.to_owned()))
            .map(|e| e.object()["spec"].clone())
    };
    assert_eq!(spec(&to, "p1"), Some(json!(3)));
    assert_eq!(spec(&to, "p2"), Some(json!(0)));
    // What the old owner never got is applied, and reaches watchers.
    assert_eq!(
        to.apply(&event(pods(), EventType::Modified, "p1", "12", 4))
            .unwrap(),
        Applied::Upserted
    );
    assert_eq!(
        to.apply(&event(pods(), EventType::Deleted, "p2", "13", 0))
            .unwrap(),
        Applied::Deleted
    );
    assert_eq!(spec(&to, "p1"), Some(json!(4)));
    assert_eq!(spec(&to, "p2"), None);
    let key = KindKey::of(&pods());
    let start = to.watch(&key, Some(11), |_, _| true).unwrap().unwrap();
    let batch = to.changes(&key, start.cursor, 10, 11).unwrap();
    assert_eq!(batch.changes.len(), 2);
}

#[test]
fn a_kind_synced_here_is_not_replaced() {
    let mut to = Cache::default();
    listed(&mut to, pods(), &[("mine", "20")], "20");
    assert_eq!(
        to.load(round_trip(source().snapshot(0), 64, 64).unwrap()),
        1
    );
    let names: Vec<String> = objects_of(&to, &pods()).into_iter().map(|o| o.0).collect();
    assert_eq!(names, ["mine"]);
    assert!(to.kind("apps", "v1", "deployments").unwrap().synced);
}

#[test]
fn cut_oversized_or_malformed_snapshots_are_refused() {
    let bytes: Vec<u8> = source()
        .snapshot(0)
        .chunks(DEFAULT_CHUNK_BYTES)
        .flat_map(|c| c.to_vec())
        .collect();
    let read = |b: &[u8], max: u64| {
        let mut r = Reader::new(max);
        r.push(b)?;
        r.finish()
    };
    assert!(read(&bytes, u64::MAX).is_ok());
    // Cut anywhere before the end line: an error, never a smaller cache.
    let end = bytes.len() - b"{\"end\":true}\n".len();
    for cut in [0, 10, bytes.len() / 2, end, end + 3] {
        assert!(read(&bytes[..cut], u64::MAX).is_err(), "cut at {cut}");
    }
    assert!(matches!(
        read(&bytes, bytes.len() as u64 - 1),
        Err(Error::TooLarge(_))
    ));
    let mut extra = bytes.clone();
    extra.extend_from_slice(b"{\"end\":true}\n");
    assert!(read(&extra, u64::MAX).is_err());
    let text = String::from_utf8(bytes).unwrap();
    for bad in [
        text.replacen("\"version\":1", "\"version\":2", 1),
        text.replacen("\"objects\":2", "\"objects\":3", 1),
        text.replacen("\"objects\":2", "\"objects\":1", 1),
        text.replacen("\"name\":\"p1\"", "\"name\":\"\"", 1),
        text.replacen("\"name\":\"p1\"", "\"name\":\"p2\"", 1),
        text.replacen("\"resourceVersion\":\"9\"", "\"resourceVersion\":\"x\"", 1),
        text.replacen("{\"rv\"", "{\"rv\":1,\"x\"", 1),
        "not json\n".to_owned(),
    ] {
        assert!(read(bad.as_bytes(), u64::MAX).is_err(), "{bad}");
    }
    let mut r = Reader::new(u64::MAX);
    let long = vec![b' '; MAX_LINE_BYTES + 1];
    assert!(matches!(r.push(&long), Err(Error::LineTooLong(1))));
}
