//! Snapshot files: the whole expected text of an output, committed under `tests/snapshots/`
//! and compared line for line. `UPDATE_SNAPSHOTS=1` rewrites them instead (review the diff
//! before committing: it is the contract changing).

use std::path::PathBuf;

/// Collects every mismatch of one test, so that one run shows them all.
#[derive(Debug, Default)]
pub struct Snapshots {
    mismatches: Vec<String>,
}

impl Snapshots {
    fn path(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("snapshots").join(name)
    }

    /// Compares `actual` with the snapshot `name` (a path under `tests/snapshots/`).
    pub fn check(&mut self, name: &str, actual: &str) {
        let path = Self::path(name);
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("create the snapshot directory");
            std::fs::write(&path, actual).expect("write the snapshot");
            return;
        }
        let expected = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                self.mismatches.push(format!("{name}: cannot read {} ({e}); create it with UPDATE_SNAPSHOTS=1", path.display()));
                return;
            }
        };
        if expected != actual {
            self.mismatches.push(format!("{name} differs from {}:\n{}", path.display(), diff(&expected, actual)));
        }
    }

    /// Panics naming every snapshot that did not match.
    pub fn assert_all(self) {
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
}
