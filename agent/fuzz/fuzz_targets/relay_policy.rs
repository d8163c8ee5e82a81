//! Fuzzes `spinlink_agent::policy::fuzz_check`: the method, path and query of
//! any request a sidecar relays, against an account's relay policy.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_agent::policy::fuzz_check(data);
});
