#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mdrelay_fuzz::protobuf(data));
