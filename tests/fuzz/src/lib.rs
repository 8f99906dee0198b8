//! The fuzz targets' checks, one function per target; also run over the committed corpora by
//! the main workspace (`tests/tests/fuzz_corpus.rs`), so that an input that once failed stays
//! a test.
#[path = "checks.rs"]
pub mod checks;

/// The plugins crate's reader of WASM call output, as it is (it needs std and serde_json only).
#[path = "../../../plugins/src/wasm_output.rs"]
mod wasm_output;
