//! Which upstream carries an account's streams: rendezvous (highest random
//! weight) hashing on the account name. Every gateway replica with the same
//! upstream list picks the same sidecar, and adding or removing one moves only
//! the accounts that must move.
//!
//! With bounded load ([`choose_bounded`], "consistent hashing with bounded
//! loads", Mirrokni et al.) an account goes to the highest-scoring node that
//! is below its capacity, `ceil(c · mean)` accounts, so no node takes more
//! than `c` times its share however the names hash.
//!
//! The hash is a fixed function (FNV-1a then a SplitMix64 finaliser), not
//! `std`'s hasher, so the choice is stable across builds and Rust versions.

/// Score of `node` for `key`; the highest score wins.
pub fn score(node: &str, key: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    // A separator byte that cannot occur in UTF-8 keeps ("ab","c") and
    // ("a","bc") apart.
    for b in node.bytes().chain([0xff]).chain(key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    mix(h)
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Index of the node in `nodes` chosen for `key`; `None` when `nodes` is empty.
/// Ties (equal scores) go to the smaller node name, so order does not matter.
pub fn choose<'a>(nodes: impl IntoIterator<Item = &'a str>, key: &str) -> Option<usize> {
    nodes
        .into_iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| score(a, key).cmp(&score(b, key)).then_with(|| b.cmp(a)))
        .map(|(i, _)| i)
}

/// The most accounts one of `nodes` nodes may hold when `accounts` are
/// assigned (the new one included), with load factor `c` (at least 1):
/// `ceil(c · accounts / nodes)`, and at least 1.
pub fn capacity(accounts: usize, nodes: usize, c: f64) -> usize {
    if nodes == 0 {
        return 0;
    }
    let mean = accounts as f64 / nodes as f64;
    ((c.max(1.0) * mean).ceil() as usize).max(1)
}

/// Like [`choose`], but skipping nodes whose load (second element) is at
/// `capacity` or above: the highest-scoring node with room. `None` when
/// every node is full or there is none.
pub fn choose_bounded<'a>(
    nodes: impl IntoIterator<Item = (&'a str, usize)>,
    key: &str,
    capacity: usize,
) -> Option<usize> {
    nodes
        .into_iter()
        .enumerate()
        .filter(|(_, (_, load))| *load < capacity)
        .max_by(|(_, (a, _)), (_, (b, _))| score(a, key).cmp(&score(b, key)).then_with(|| b.cmp(a)))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("https://sidecar-{i}:7001"))
            .collect()
    }

    #[test]
    fn empty_has_no_choice() {
        assert_eq!(choose([], "dev"), None);
    }

    #[test]
    fn spreads_accounts_over_all_nodes() {
        let nodes = names(4);
        let mut counts = [0usize; 4];
        for a in 0..2000 {
            let i = choose(nodes.iter().map(String::as_str), &format!("account-{a}")).unwrap();
            counts[i] += 1;
        }
        // 500 expected each; a broken hash would starve or flood one.
        for c in counts {
            assert!((350..=650).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn choice_ignores_list_order() {
        let nodes = names(5);
        let mut reversed = nodes.clone();
        reversed.reverse();
        for a in 0..200 {
            let key = format!("acct{a}");
            let i = choose(nodes.iter().map(String::as_str), &key).unwrap();
            let j = choose(reversed.iter().map(String::as_str), &key).unwrap();
            assert_eq!(nodes[i], reversed[j]);
        }
    }

    #[test]
    fn capacity_is_ceil_of_c_times_mean() {
        assert_eq!(capacity(10, 4, 1.25), 4); // ceil(3.125)
        assert_eq!(capacity(1, 4, 1.25), 1);
        assert_eq!(capacity(8, 4, 1.0), 2);
        assert_eq!(capacity(5, 0, 1.25), 0);
    }

    #[test]
    fn bounded_skips_full_nodes_and_otherwise_agrees() {
        let nodes = names(3);
        let key = "acct";
        let best = choose(nodes.iter().map(String::as_str), key).unwrap();
        let loads = |full: Option<usize>| {
            nodes
                .iter()
                .enumerate()
                .map(move |(i, n)| (n.as_str(), if Some(i) == full { 5 } else { 0 }))
        };
        assert_eq!(choose_bounded(loads(None), key, 5), Some(best));
        let next = choose_bounded(loads(Some(best)), key, 5).unwrap();
        assert_ne!(next, best);
        assert_eq!(choose_bounded(loads(None), key, 0), None);
    }

    proptest! {
        #[test]
        fn bounded_load_never_exceeds_capacity(
            n in 1usize..8,
            c in 1.0f64..2.0,
            accounts in proptest::collection::hash_set("[a-z0-9-]{1,12}", 1..200),
        ) {
            let nodes = names(n);
            let mut loads = vec![0usize; n];
            for (assigned, account) in accounts.iter().enumerate() {
                let cap = capacity(assigned + 1, n, c);
                let i = choose_bounded(
                    nodes.iter().map(String::as_str).zip(loads.iter().copied()),
                    account,
                    cap,
                );
                // Total capacity always exceeds what is assigned, so there is room.
                let i = i.expect("a node with room");
                loads[i] += 1;
                let bound = capacity(assigned + 1, n, c);
                prop_assert!(loads.iter().all(|l| *l <= bound), "{loads:?} > {bound}");
            }
        }

        #[test]
        fn adding_a_node_moves_accounts_only_to_it(
            n in 1usize..8,
            accounts in proptest::collection::vec("[a-z0-9-]{1,20}", 1..100),
        ) {
            let before = names(n);
            let mut after = before.clone();
            after.push("https://new-sidecar:7001".to_owned());
            for account in &accounts {
                let old = &before[choose(before.iter().map(String::as_str), account).unwrap()];
                let new = &after[choose(after.iter().map(String::as_str), account).unwrap()];
                prop_assert!(new == old || new == "https://new-sidecar:7001");
            }
        }

        #[test]
        fn removing_a_node_moves_only_its_accounts(
            n in 2usize..8,
            gone in 0usize..8,
            accounts in proptest::collection::vec("[a-z0-9-]{1,20}", 1..100),
        ) {
            let before = names(n);
            let gone = gone % n;
            let mut after = before.clone();
            after.remove(gone);
            for account in &accounts {
                let old = &before[choose(before.iter().map(String::as_str), account).unwrap()];
                let new = &after[choose(after.iter().map(String::as_str), account).unwrap()];
                prop_assert!(new == old || *old == before[gone]);
            }
        }
    }
}
