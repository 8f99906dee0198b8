//! Fuzz target `config_load`: libFuzzer's input into `lamplighter_fuzz::checks::config_load` (what it asserts is documented there).
#![no_main]

use libfuzzer_sys::fuzz_target;

thread_local! {
    static DIR: tempfile::TempDir = tempfile::tempdir().expect("a temporary directory");
}

fuzz_target!(|data: &[u8]| {
    DIR.with(|dir| lamplighter_fuzz::checks::config_load(dir.path(), data));
});
