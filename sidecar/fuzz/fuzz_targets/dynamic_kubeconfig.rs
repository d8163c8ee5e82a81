//! Fuzzes `spinlink_sidecar::dynamic::kubeconfig::fuzz_check`: the kubeconfig
//! an operator (or anyone reaching the accounts API) posts for a dynamic
//! account.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_sidecar::dynamic::kubeconfig::fuzz_check(data);
});
