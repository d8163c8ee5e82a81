//! Fuzzes `spinlink_gateway::fuzz::host`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_gateway::fuzz::host(data);
});
