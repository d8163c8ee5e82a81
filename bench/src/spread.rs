//! How the gateway spreads accounts over sidecars, and how many move when the
//! sidecars scale 3 → 4 → 3 (issue 6). A computation, not a measurement: it
//! runs the gateway's own assignment code ([`spinlink_gateway::route`]:
//! rendezvous hashing with bounded load, as `upstream::set` applies it) over
//! account names in this process; no gateway, sidecar or agent is started.
//!
//! Two ways accounts arrive: *fresh*, every agent connecting anew (after a
//! gateway restart), in a seeded random order; and *sticky*, the gateway's
//! steady state, where an account stays on its sidecar while its streams are
//! open, so scaling up moves nothing and scaling down moves only the accounts
//! of the removed sidecar.

use std::collections::HashMap;

use spinlink_gateway::route::{capacity, choose_bounded};

use crate::report::Report;

/// Parameters.
#[derive(Debug, Clone)]
pub struct Options {
    /// Accounts.
    pub accounts: usize,
    /// Load factor `c` (the gateway's `upstreamPool.loadFactor`).
    pub load_factor: f64,
    /// Seed of the arrival order.
    pub seed: u64,
}

fn nodes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("http://sidecar-{i}:7001")).collect()
}

/// Assigns `order` one by one as the gateway does, starting from `start`
/// (accounts already placed and kept: the sticky case).
fn assign(
    nodes: &[String],
    order: &[String],
    start: &HashMap<String, usize>,
    c: f64,
) -> HashMap<String, usize> {
    let total = order.len() + start.len();
    let cap = capacity(total, nodes.len(), c);
    let mut load = vec![0usize; nodes.len()];
    let mut out = start.clone();
    for i in start.values() {
        load[*i] += 1;
    }
    for account in order {
        let i = choose_bounded(
            nodes.iter().map(String::as_str).zip(load.iter().copied()),
            account,
            cap,
        )
        .expect("capacity leaves room for every account");
        load[i] += 1;
        out.insert(account.clone(), i);
    }
    out
}

/// max / mean accounts per node.
fn spread(assignment: &HashMap<String, usize>, nodes: usize) -> (usize, f64) {
    let mut load = vec![0usize; nodes];
    for i in assignment.values() {
        load[*i] += 1;
    }
    let max = load.iter().copied().max().unwrap_or(0);
    let mean = assignment.len() as f64 / nodes as f64;
    (max, max as f64 / mean)
}

/// Accounts whose node (by name) differs between two assignments.
fn moved(
    a: &HashMap<String, usize>,
    a_nodes: &[String],
    b: &HashMap<String, usize>,
    b_nodes: &[String],
) -> usize {
    a.iter()
        .filter(|(k, i)| b.get(*k).map(|j| &b_nodes[*j]) != Some(&a_nodes[**i]))
        .count()
}

/// A seeded shuffle (SplitMix64), so runs are reproducible.
fn shuffled(mut v: Vec<String>, seed: u64) -> Vec<String> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..v.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// Runs the computation and writes its lines into `r`.
pub fn run(o: &Options, r: &mut Report) {
    let accounts: Vec<String> = (0..o.accounts).map(|i| format!("account-{i:05}")).collect();
    let order = shuffled(accounts.clone(), o.seed);
    let (n3, n4) = (nodes(3), nodes(4));
    r.line(format!(
        "{} accounts, load factor {}, arrival order seed {}",
        o.accounts, o.load_factor, o.seed
    ));
    // Fresh: every account placed anew on each layout.
    let f3 = assign(&n3, &order, &HashMap::new(), o.load_factor);
    let f4 = assign(&n4, &order, &HashMap::new(), o.load_factor);
    let f3b = assign(&n3, &order, &HashMap::new(), o.load_factor);
    for (name, a, n) in [
        ("3 sidecars", &f3, 3),
        ("4 sidecars", &f4, 4),
        ("3 again", &f3b, 3),
    ] {
        let (max, ratio) = spread(a, n);
        r.line(format!(
            "fresh, {name}: max {max} accounts, max/mean {ratio:.3}"
        ));
    }
    r.line(format!(
        "fresh, moved 3→4: {} ({:.1}%, ideal 25%); 4→3: {} ({:.1}%)",
        moved(&f3, &n3, &f4, &n4),
        100.0 * moved(&f3, &n3, &f4, &n4) as f64 / o.accounts as f64,
        moved(&f4, &n4, &f3b, &n3),
        100.0 * moved(&f4, &n4, &f3b, &n3) as f64 / o.accounts as f64,
    ));
    // Sticky: accounts stay while their streams are open. Scaling up moves
    // nothing until connections reach their maximum age and reconnect (then
    // as fresh): the new sidecar stays empty and the others keep their
    // load (sidecar i of three is sidecar i of four). Scaling down moves
    // exactly the removed sidecar's accounts.
    let (max, ratio) = spread(&f3, 4);
    r.line(format!(
        "sticky, 3→4: 0 moved; until connections reconnect sidecar-3 holds none: max {max}, max/mean {ratio:.3}"
    ));
    let survivors: HashMap<String, usize> = f4
        .iter()
        .filter(|(_, i)| **i < 3)
        .map(|(k, i)| (k.clone(), *i))
        .collect();
    let orphans: Vec<String> = order
        .iter()
        .filter(|a| !survivors.contains_key(*a))
        .cloned()
        .collect();
    let s3 = assign(&n3, &orphans, &survivors, o.load_factor);
    let (max, ratio) = spread(&s3, 3);
    r.line(format!(
        "sticky, 4→3 (sidecar-3 removed): {} moved ({:.1}%), then max {max}, max/mean {ratio:.3}",
        orphans.len(),
        100.0 * orphans.len() as f64 / o.accounts as f64
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_load_holds_and_few_accounts_move() {
        let mut r = Report::new("spread", "test");
        run(
            &Options {
                accounts: 300,
                load_factor: 1.25,
                seed: 1,
            },
            &mut r,
        );
        let order = shuffled((0..300).map(|i| format!("a{i}")).collect(), 1);
        let a3 = assign(&nodes(3), &order, &HashMap::new(), 1.25);
        let a4 = assign(&nodes(4), &order, &HashMap::new(), 1.25);
        assert!(spread(&a3, 3).1 <= 1.25 + 1e-9);
        assert!(spread(&a4, 4).1 <= 1.25 + 1e-9);
        // Far fewer than all accounts move when a fourth sidecar comes.
        assert!(moved(&a3, &nodes(3), &a4, &nodes(4)) < 150);
        // Sticky, the fourth sidecar starts empty: the others keep their
        // load, so the spread over four is worse than over three.
        assert_eq!(moved(&a3, &nodes(3), &a3, &nodes(4)), 0);
        assert_eq!(spread(&a3, 4).0, spread(&a3, 3).0);
        assert!(spread(&a3, 4).1 > spread(&a3, 3).1);
    }
}
