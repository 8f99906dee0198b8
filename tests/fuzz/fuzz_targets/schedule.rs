//! Fuzz target `schedule`: libFuzzer's input into `lamplighter_fuzz::checks::schedule` (what it asserts is documented there).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lamplighter_fuzz::checks::schedule(data));
