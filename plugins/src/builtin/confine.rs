//! Keeps every file path an action touches inside the working directory.
//!
//! A user path is resolved against the working directory one component at a time: each
//! component that exists is canonicalized (so symlinks, including symlinked parents, are
//! followed to where they really lead), the ones that do not are appended as plain names, and
//! the result must lie under the canonical working directory. A dangling symlink is rejected, since writing through it could create a file
//! anywhere. This is a check, not a sandbox: a concurrent rename can still race it.

use std::path::{Component, Path, PathBuf};

use crate::ActionError;

/// Resolves `user` (relative to `root`, or absolute but inside it) to a path inside `root`.
pub(crate) fn resolve(action: &str, root: &Path, user: &str) -> Result<PathBuf, ActionError> {
    let reject =
        |problem: &str| ActionError::PathNotAllowed { action: action.to_owned(), path: user.to_owned(), problem: problem.to_owned() };
    if user.contains('\0') {
        return Err(reject("contains a NUL byte"));
    }
    if user.is_empty() {
        return Err(reject("is empty"));
    }
    let root = root.canonicalize().map_err(|e| ActionError::Failed {
        action: action.to_owned(),
        message: format!("working directory \"{}\" cannot be resolved: {e}", root.display()),
    })?;
    // Walk the path one component at a time. `current` is canonical (symlink-free) until a
    // component does not exist; from then on the remaining names are plain and `..` just pops.
    let mut resolved = root.clone();
    for component in Path::new(user).components() {
        match component {
            Component::Prefix(_) | Component::RootDir => resolved = PathBuf::from("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(name) => {
                let candidate = resolved.join(name);
                match candidate.symlink_metadata() {
                    Err(_) => resolved = candidate,
                    Ok(_) => match candidate.canonicalize() {
                        Ok(real) => resolved = real,
                        Err(_) => {
                            return Err(reject("goes through a symlink whose target does not exist"));
                        }
                    },
                }
            }
        }
    }
    if !resolved.starts_with(&root) {
        return Err(reject("is outside the working directory"));
    }
    Ok(resolved)
}

/// An optional directory parameter: absent means the working directory itself.
pub(crate) fn resolve_dir(action: &str, root: &Path, user: Option<&str>) -> Result<PathBuf, ActionError> {
    match user {
        None | Some("") | Some(".") => resolve(action, root, "."),
        Some(path) => resolve(action, root, path),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;

    struct Fixture {
        _outside: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
    }

    /// `<tmp>/root` with `sub/file.txt`, a symlink escaping to `<tmp>/outside`, a symlink
    /// staying inside, and a dangling symlink.
    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(root.join("sub")).expect("mkdir");
        fs::create_dir_all(&outside).expect("mkdir");
        fs::write(root.join("sub/file.txt"), "x").expect("write");
        fs::write(outside.join("secret"), "s").expect("write");
        symlink(&outside, root.join("escape")).expect("symlink");
        symlink(root.join("sub"), root.join("inner")).expect("symlink");
        symlink(outside.join("nonexistent"), root.join("dangling")).expect("symlink");
        symlink("/etc/passwd", root.join("passwd")).expect("symlink");
        let root = root.canonicalize().expect("canonical");
        let outside = outside.canonicalize().expect("canonical");
        Fixture { _outside: tmp, root, outside }
    }

    #[test]
    fn paths_inside_resolve() {
        let f = fixture();
        let ok = |p: &str| resolve("t.t", &f.root, p).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(ok("sub/file.txt"), f.root.join("sub/file.txt"));
        assert_eq!(ok("./sub/../sub/file.txt"), f.root.join("sub/file.txt"));
        assert_eq!(ok("new/dir/file.txt"), f.root.join("new/dir/file.txt"));
        assert_eq!(ok("new/../other.txt"), f.root.join("other.txt"));
        assert_eq!(ok("inner/file.txt"), f.root.join("sub/file.txt"));
        assert_eq!(ok("."), f.root);
        let abs = f.root.join("sub/file.txt");
        assert_eq!(ok(abs.to_str().expect("utf-8")), abs);
        assert_eq!(resolve_dir("t.t", &f.root, None).expect("root"), f.root);
    }

    #[test]
    fn escape_attempts_are_rejected() {
        let f = fixture();
        let outside_abs = f.outside.join("secret");
        let outside_new = f.outside.join("new.txt");
        let cases = [
            "..",
            "../outside/secret",
            "sub/../../outside/secret",
            "sub/../..",
            "nonexistent/../../outside",
            "nonexistent/../../../etc/passwd",
            "/etc/passwd",
            "/",
            outside_abs.to_str().expect("utf-8"),
            outside_new.to_str().expect("utf-8"),
            "escape/secret",
            "escape/new-file.txt",
            "escape/newdir/new.txt",
            "escape",
            "passwd",
            "dangling",
            "dangling/child",
            "inner/../../outside",
            "nonexistent/../escape/secret",
            "nonexistent/../escape/new.txt",
            "sub/file.txt\0/../../x",
            "",
        ];
        for case in cases {
            match resolve("t.t", &f.root, case) {
                Err(ActionError::PathNotAllowed { action, path, .. }) => {
                    assert_eq!(action, "t.t");
                    assert_eq!(path, case);
                }
                other => panic!("{case:?} should be rejected, got {other:?}"),
            }
        }
    }

    #[test]
    fn error_names_the_path() {
        let f = fixture();
        let err = resolve("file-read.read", &f.root, "../x").expect_err("escape");
        assert_eq!(err.to_string(), "file-read.read: path \"../x\" is outside the working directory");
    }
}
