//! Snapshot files: the whole expected text of an output, committed under `tests/snapshots/`
//! and compared line for line. Each test owns one folder of them (`Snapshots::in_dir`), so a
//! file there that no check names any more is an orphan, and that fails too.
//!
//! `UPDATE_SNAPSHOTS=1` rewrites them instead and removes the orphans (review the diff before
//! committing: it is the contract changing). Unset, empty or `0` compares; any other value is
//! refused, so a typo never rewrites the contract silently.

use std::collections::BTreeSet;
use std::path::PathBuf;

/// Collects every mismatch of one test, so that one run shows them all.
#[derive(Debug)]
pub struct Snapshots {
    /// The folder's name under `tests/snapshots/`, for messages.
    dir: String,
    root: PathBuf,
    update: bool,
    checked: BTreeSet<String>,
    mismatches: Vec<String>,
}

/// What `UPDATE_SNAPSHOTS` asks for: `Ok(true)` to rewrite, `Ok(false)` to compare.
fn update_requested(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!("UPDATE_SNAPSHOTS={other:?}: set it to 1 to rewrite the snapshots, or unset it (or 0) to compare")),
    }
}

impl Snapshots {
    /// The snapshots under `tests/snapshots/<dir>/`, all of them this test's.
    pub fn in_dir(dir: &str) -> Self {
        let value = std::env::var("UPDATE_SNAPSHOTS").ok();
        let update = update_requested(value.as_deref()).unwrap_or_else(|e| panic!("{e}"));
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("snapshots").join(dir);
        Self { dir: dir.to_owned(), root, update, checked: BTreeSet::new(), mismatches: Vec::new() }
    }

    /// Compares `actual` with the snapshot `name` (a file name in this test's folder).
    pub fn check(&mut self, name: &str, actual: &str) {
        assert!(!name.contains('/'), "snapshot {name:?}: a name is a file in {}/, not a path", self.dir);
        assert!(self.checked.insert(name.to_owned()), "snapshot {}/{name} is checked twice in one test", self.dir);
        let path = self.root.join(name);
        if self.update {
            std::fs::create_dir_all(&self.root).expect("create the snapshot directory");
            std::fs::write(&path, actual).expect("write the snapshot");
            return;
        }
        let expected = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                self.mismatches.push(format!(
                    "{}/{name}: cannot read {} ({e}); create it with UPDATE_SNAPSHOTS=1",
                    self.dir,
                    path.display()
                ));
                return;
            }
        };
        if expected != actual {
            self.mismatches.push(format!("{}/{name} differs from {}:\n{}", self.dir, path.display(), diff(&expected, actual)));
        }
    }

    /// Files in the folder that no check of this test named.
    fn orphans(&self) -> Vec<String> {
        let entries = std::fs::read_dir(&self.root).unwrap_or_else(|e| panic!("cannot list {}: {e}", self.root.display()));
        let mut names: Vec<String> = entries
            .map(|e| e.unwrap_or_else(|e| panic!("cannot list {}: {e}", self.root.display())).file_name().to_string_lossy().into_owned())
            .filter(|n| !self.checked.contains(n))
            .collect();
        names.sort();
        names
    }

    /// Panics naming every snapshot that did not match, and every orphan; with
    /// `UPDATE_SNAPSHOTS=1`, removes the orphans instead.
    pub fn assert_all(mut self) {
        let orphans = self.orphans();
        if self.update {
            for name in &orphans {
                std::fs::remove_file(self.root.join(name)).expect("remove an orphaned snapshot");
            }
        } else {
            self.mismatches.extend(
                orphans.iter().map(|n| format!("{}/{n}: no check names this snapshot any more (UPDATE_SNAPSHOTS=1 removes it)", self.dir)),
            );
        }
        assert!(
            self.mismatches.is_empty(),
            "{}\n\nIf the change is intended, rerun with UPDATE_SNAPSHOTS=1 and commit the files.",
            self.mismatches.join("\n\n")
        );
    }
}

/// The lines that differ, `-` expected and `+` actual, with their line numbers.
fn diff(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let mut out = Vec::new();
    for i in 0..e.len().max(a.len()) {
        let (x, y) = (e.get(i), a.get(i));
        if x != y {
            if let Some(x) = x {
                out.push(format!("{:>4} - {x}", i + 1));
            }
            if let Some(y) = y {
                out.push(format!("{:>4} + {y}", i + 1));
            }
        }
        if out.len() > 40 {
            out.push("     …".into());
            break;
        }
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_names_the_lines_that_changed() {
        assert_eq!(diff("a\nb\nc\n", "a\nB\nc\nd\n"), "   2 - b\n   2 + B\n   4 + d");
    }

    #[test]
    fn only_one_rewrites_and_other_values_are_refused() {
        assert_eq!(update_requested(None), Ok(false));
        assert_eq!(update_requested(Some("")), Ok(false));
        assert_eq!(update_requested(Some("0")), Ok(false));
        assert_eq!(update_requested(Some("1")), Ok(true));
        for v in ["true", "yes", "2", " 1"] {
            assert!(update_requested(Some(v)).unwrap_err().contains("set it to 1"), "{v}");
        }
    }

    fn scratch(files: &[&str], update: bool) -> (tempfile::TempDir, Snapshots) {
        let dir = tempfile::tempdir().unwrap();
        for f in files {
            std::fs::write(dir.path().join(f), "x\n").unwrap();
        }
        let root = dir.path().to_path_buf();
        (dir, Snapshots { dir: "scratch".into(), root, update, checked: BTreeSet::new(), mismatches: Vec::new() })
    }

    #[test]
    fn an_orphaned_snapshot_fails_the_test_and_an_update_removes_it() {
        let (dir, mut s) = scratch(&["kept.txt", "gone.txt"], false);
        s.check("kept.txt", "x\n");
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.assert_all())).expect_err("an orphan must fail");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("gone.txt: no check names this snapshot") && !msg.contains("kept.txt"), "{msg}");
        assert!(dir.path().join("gone.txt").exists(), "a comparison removes nothing");

        let (dir, mut s) = scratch(&["kept.txt", "gone.txt"], true);
        s.check("kept.txt", "y\n");
        s.assert_all();
        assert!(!dir.path().join("gone.txt").exists(), "the update removes the orphan");
        assert_eq!(std::fs::read_to_string(dir.path().join("kept.txt")).unwrap(), "y\n");
    }

    #[test]
    fn a_mismatch_and_a_missing_file_fail_the_test() {
        let (_dir, mut s) = scratch(&["a.txt"], false);
        s.check("a.txt", "z\n");
        s.check("b.txt", "x\n");
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.assert_all())).expect_err("must fail");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("scratch/a.txt differs") && msg.contains("scratch/b.txt: cannot read"), "{msg}");
    }
}
