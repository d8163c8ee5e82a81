//! Fuzzes `spinlink_agent::scrub::fuzz_scrub`: Secret bodies from the API
//! server, whose values must never leave the agent.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_agent::scrub::fuzz_scrub(data);
});
