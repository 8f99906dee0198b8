//! The fuzz targets' checks, one function per target; also run over the committed corpora by
//! the main workspace (`tests/tests/fuzz_corpus.rs`), so that an input that once failed stays
//! a test.
#[path = "checks.rs"]
pub mod checks;
