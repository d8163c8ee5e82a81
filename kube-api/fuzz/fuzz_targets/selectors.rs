//! Fuzzes `spinlink_kube_api::selector::fuzz_selectors`: the `labelSelector`
//! and `fieldSelector` of any list or watch a client sends the facade.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_kube_api::selector::fuzz_selectors(data);
});
