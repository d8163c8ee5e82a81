//! Fuzzes `spinlink_gateway::fuzz::jwt`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_gateway::fuzz::jwt(data);
});
