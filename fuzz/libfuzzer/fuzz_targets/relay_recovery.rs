#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mdrelay_fuzz::relay_recovery(data));
