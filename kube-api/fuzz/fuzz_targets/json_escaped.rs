//! Fuzzes `spinlink_kube_api::json::fuzz_escaped`: the text of any object
//! an agent sends, escaped as the API server escapes JSON before the facade
//! answers with it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_kube_api::json::fuzz_escaped(data);
});
