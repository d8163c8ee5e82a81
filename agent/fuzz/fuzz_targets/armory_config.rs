//! Fuzzes `spinlink_agent::config::armory::fuzz_armory_file`: an Armory
//! agent's configuration file and its override, as an operator writes them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    spinlink_agent::config::armory::fuzz_armory_file(data);
});
