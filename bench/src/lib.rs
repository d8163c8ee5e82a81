//! spinlink's benchmarks (issue 5, "Performance"). Each benchmark is one
//! module with a `run(opts)` that starts what it measures, measures it together
//! with its peer in the same run, and returns a [`report::Report`] that
//! `main` prints as the Markdown block `bench/RESULTS.md` is made of.
//!
//! Start at `main.rs` for the subcommands, then [`chain`] (kube-sim and
//! `spinlink dev` as separate processes on loopback), [`load`] (the bounded
//! HTTP load loop) and the benchmarks: [`facade_list`], [`selector_latency`],
//! [`cache_memory`], and [`spread`] (the gateway's account spread over sidecars).

pub mod alloc;
pub mod cache_memory;
pub mod chain;
pub mod facade_list;
pub mod load;
pub mod machine;
pub mod report;
pub mod selector_latency;
pub mod spread;
pub mod stats;
