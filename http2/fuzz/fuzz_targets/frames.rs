//! Fuzzes `spinlink_http2::fuzz::frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_http2::fuzz::frames(data);
});
