//! Fuzzes `spinlink_gateway::fuzz::proxy_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_gateway::fuzz::proxy_header(data);
});
