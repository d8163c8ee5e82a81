//! Assignment, bounded load, retirement and rotation of an [`UpstreamSet`].

use super::*;
use crate::config::upstreams::DEFAULT_LOAD_FACTOR;

fn targets(n: usize) -> Vec<Target> {
    (0..n)
        .map(|i| Target::parse(&format!("http://127.0.0.1:{}", 17000 + i)).unwrap())
        .collect()
}

fn set_of(n: usize) -> (Arc<UpstreamSet>, usize) {
    let set = Arc::new(UpstreamSet::default());
    let source = set.add_source();
    set.update(source, targets(n));
    (set, source)
}

#[tokio::test]
async fn accounts_stay_put_while_their_streams_are_open() {
    let (set, _) = set_of(3);
    let a = set.pick("dev-1").unwrap();
    let b = set.pick("dev-1").unwrap();
    assert!(Arc::ptr_eq(a.instance(), b.instance()));
    assert_eq!(set.assigned("dev-1").as_deref(), Some(a.instance().url()));
    drop(a);
    assert!(set.assigned("dev-1").is_some());
    drop(b);
    assert_eq!(set.assigned("dev-1"), None);
    assert!(set.instances().iter().all(|i| i.account_count() == 0));
}

#[tokio::test]
async fn no_instance_holds_more_than_c_times_the_mean() {
    let (set, _) = set_of(4);
    // Account names that all hash to one instance would pile up without
    // the bound; find 40 that prefer the same one.
    let first = set.instances()[0].url().to_owned();
    let urls: Vec<String> = set.instances().iter().map(|i| i.url().to_owned()).collect();
    let skewed: Vec<String> = (0..100_000)
        .map(|i| format!("acct-{i}"))
        .filter(|a| urls[route::choose(urls.iter().map(String::as_str), a).unwrap()] == first)
        .take(40)
        .collect();
    assert_eq!(skewed.len(), 40);
    let leases: Vec<Lease> = skewed.iter().map(|a| set.pick(a).unwrap()).collect();
    let bound = route::capacity(40, 4, DEFAULT_LOAD_FACTOR);
    for i in set.instances().iter() {
        assert!(
            i.account_count() <= bound,
            "{} > {bound}",
            i.account_count()
        );
    }
    assert_eq!(set.instances()[0].account_count(), bound);
    let metrics = set.stats.metrics().encode();
    assert!(
        metrics.contains(&format!(
            "spinlink_gateway_upstream_accounts{{upstream=\"{first}\"}} {bound}"
        )),
        "{metrics}"
    );
    drop(leases);
}

#[tokio::test]
async fn a_removed_instance_ends_its_streams_and_loses_its_accounts() {
    let (set, source) = set_of(3);
    let lease = set.pick("dev-1").unwrap();
    let url = lease.instance().url().to_owned();
    assert!(!lease.gone().is_cancelled());
    let remaining: Vec<Target> = targets(3).into_iter().filter(|t| t.url() != url).collect();
    set.update(source, remaining);
    assert!(
        lease.gone().is_cancelled(),
        "streams of the removed instance go on"
    );
    assert_eq!(set.instances().len(), 2);
    let again = set.pick("dev-1").unwrap();
    assert_ne!(again.instance().url(), url);
    // The old lease ending does not disturb the new assignment.
    drop(lease);
    assert_eq!(
        set.assigned("dev-1").as_deref(),
        Some(again.instance().url())
    );
}

#[tokio::test]
async fn outliers_are_ejected_and_their_streams_end() {
    let (set, _) = set_of(2);
    let lease = set.pick("dev-1").unwrap();
    let bad = lease.instance().clone();
    for _ in 0..DEFAULT_CONSECUTIVE_ERRORS_FOR_TEST - 1 {
        set.stream_failed(&bad);
    }
    assert!(bad.available(Instant::now()));
    set.stream_failed(&bad);
    assert!(!bad.available(Instant::now()));
    assert!(lease.gone().is_cancelled());
    assert!(bad.available(Instant::now() + std::time::Duration::from_secs(31)));
    let other = set.pick("dev-1").unwrap();
    assert!(!Arc::ptr_eq(other.instance(), &bad));
    assert_eq!(
        set.stats
            .metrics()
            .upstream_ejections
            .get_or_create(&UpstreamSet::label(bad.url()))
            .get(),
        1
    );
}

const DEFAULT_CONSECUTIVE_ERRORS_FOR_TEST: u32 =
    crate::config::upstreams::DEFAULT_CONSECUTIVE_ERRORS;

#[tokio::test]
async fn failed_health_checks_take_an_instance_out_until_it_passes() {
    let (set, _) = set_of(2);
    let config = HealthCheckConfig::default();
    let lease = set.pick("dev-1").unwrap();
    let sick = lease.instance().clone();
    set.record_check(&sick, false, &config);
    assert!(sick.available(Instant::now()), "one failure is not enough");
    set.record_check(&sick, false, &config);
    assert!(!sick.available(Instant::now()));
    assert!(lease.gone().is_cancelled());
    set.record_check(&sick, true, &config);
    assert!(sick.available(Instant::now()));
}

#[tokio::test]
async fn with_nothing_in_rotation_every_instance_is_used() {
    let (set, _) = set_of(1);
    let only = set.instances()[0].clone();
    let config = HealthCheckConfig::default();
    set.record_check(&only, false, &config);
    set.record_check(&only, false, &config);
    assert!(set.pick("dev-1").is_some());
    let empty = Arc::new(UpstreamSet::default());
    assert!(empty.pick("dev-1").is_none());
}
