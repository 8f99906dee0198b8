//! Fuzz target `wasm_output`: libFuzzer's input into `lamplighter_fuzz::checks::wasm_output` (what it asserts is documented there).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lamplighter_fuzz::checks::wasm_output(data));
