//! Fuzzes `spinlink_sidecar::cache::fuzz_object_text`: any object an agent
//! sends, written into the cache as the API server writes it and cut for a
//! LIST's items.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_sidecar::cache::fuzz_object_text(data);
});
