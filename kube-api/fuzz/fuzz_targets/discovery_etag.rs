//! Fuzzes `spinlink_kube_api::discovery::fuzz_etag`: any aggregated
//! discovery body an agent sends, which the facade tags.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_kube_api::discovery::fuzz_etag(data);
});
