//! Fuzz target `ics`: libFuzzer's input into `lamplighter_fuzz::checks::ics` (what it asserts is documented there).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lamplighter_fuzz::checks::ics(data));
