//! Fuzzes `spinlink_gateway::fuzz::h1_answer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_gateway::fuzz::h1_answer(data);
});
