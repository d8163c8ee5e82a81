//! Fuzzes `spinlink_gateway::fuzz::client_hello`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_gateway::fuzz::client_hello(data);
});
