//! Fuzz target `mcp_args`: libFuzzer's input into `lamplighter_fuzz::checks::mcp_args` (what it asserts is documented there).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lamplighter_fuzz::checks::mcp_args(data));
