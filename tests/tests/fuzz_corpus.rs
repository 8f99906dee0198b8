//! Every committed fuzz input, through the fuzz targets' own checks (`tests/fuzz/src/checks.rs`,
//! included here): the corpora in `tests/fuzz/corpus/` and the inputs that once failed in
//! `tests/fuzz/regressions/`. A fix that regresses fails here, on stable, in every test run;
//! `.ci/fuzz.sh` searches for new failures with libFuzzer.

#[path = "../fuzz/src/checks.rs"]
#[allow(unreachable_pub, reason = "public for the fuzz crate, which includes the same file")]
mod checks;

/// The plugins crate's reader of WASM call output, which `checks::wasm_output` calls.
#[path = "../../plugins/src/wasm_output.rs"]
mod wasm_output;

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for dir in [root.join("corpus").join(target), root.join("regressions").join(target)] {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            files.extend(entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()));
        }
    }
    files.sort();
    files
}

fn each(target: &str, check: impl Fn(&[u8])) {
    let files = inputs(target);
    assert!(files.len() >= 10, "the {target} corpus is missing ({} files)", files.len());
    for file in files {
        let data = std::fs::read(&file).unwrap();
        // The file's name in the failure: the check's own panic says what broke.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&data)));
        assert!(result.is_ok(), "{target}: {} fails its check", file.display());
    }
}

#[test]
fn config_load_inputs_pass() {
    let dir = tempfile::tempdir().unwrap();
    each("config_load", |data| checks::config_load(dir.path(), data));
}

#[test]
fn schedule_inputs_pass() {
    each("schedule", checks::schedule);
}

#[test]
fn template_inputs_pass() {
    each("template", checks::template);
}

#[test]
fn wasm_output_inputs_pass() {
    each("wasm_output", checks::wasm_output);
}

#[test]
fn ics_inputs_pass() {
    each("ics", checks::ics);
}

#[test]
fn mcp_args_inputs_pass() {
    each("mcp_args", checks::mcp_args);
}
