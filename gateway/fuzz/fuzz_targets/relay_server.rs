//! Fuzzes `spinlink_gateway::fuzz::relay_server`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_gateway::fuzz::relay_server(data);
});
