//! spinlink's benchmarks (issue 5, "Performance"). Each benchmark is one
//! module with a `run(opts)` that starts what it measures, measures it together
//! with its peer in the same run, and returns a [`report::Report`] that
//! `main` prints as the Markdown block `bench/RESULTS.md` is made of.
//!
//! Start at `main.rs` for the subcommands, then [`chain`] (kube-sim and
//! `spinlink dev` as separate processes on loopback), [`load`] (the bounded
//! HTTP load loop) and the benchmarks: [`facade_list`], [`selector_latency`],
//! [`cache_memory`], [`spread`] (the gateway's account spread over sidecars),
//! [`grpc_proxy`] (issue 4: the gateway against nginx, HAProxy and Envoy),
//! and the agent's (issue 3, the agent in a process of its own:
//! [`agent_chain`]): [`agent_memory`] and [`agent_sync`]; and issues 4 and 6's
//! reconnect storm of 1,000 simulated agents, [`agent_storm`], behind an
//! in-process [`balancer`].

pub mod agent_chain;
pub mod agent_connections;
pub mod agent_memory;
pub mod agent_storm;
pub mod agent_sync;
pub mod alloc;
pub mod balancer;
pub mod cache_memory;
pub mod chain;
pub mod facade_list;
pub mod grpc_echo;
pub mod grpc_peers;
pub mod grpc_proxy;
pub mod grpc_wire;
pub mod hostile;
pub mod instructions;
pub mod load;
pub mod machine;
pub mod report;
pub mod selector_latency;
pub mod spread;
pub mod stats;
pub mod syscalls;
