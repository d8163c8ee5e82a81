//! Fuzzes `spinlink_gateway::fuzz::token`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_gateway::fuzz::token(data);
});
