//! Fuzzes `spinlink_gateway::fuzz::message_sizes`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_gateway::fuzz::message_sizes(data);
});
