//! Keeps every file path an action touches inside the working directory.
//!
//! A user path is resolved against the working directory one component at a time: each
//! component that exists is canonicalized (so symlinks, including symlinked parents, are
//! followed to where they really lead), the ones that do not are appended as plain names, and
//! the result must lie under the canonical working directory. A dangling symlink is rejected,
//! since writing through it could create a file anywhere. This is a check, not a sandbox: a
//! concurrent rename can still race it.
//!
//! Names are taken literally, as the kernel takes them: `%2e%2e`, `..%2f`, `~`, `$HOME`, a
//! backslash or a fullwidth `．．` are ordinary file names inside the directory, not escapes, so
//! they are accepted (and tested as such). Only what the kernel would resolve outside is refused.

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
    // Walk the path one component at a time. `resolved` is canonical (symlink-free) until a
    // component does not exist; from then on the remaining names are plain and `..` just pops.
    let mut resolved = root.clone();
    // Whether `resolved` is known canonical: no missing name was added to it (one that exists
    // later, made meanwhile, may be a symlink).
    let mut canonical = true;
    for component in Path::new(user).components() {
        match component {
            Component::Prefix(_) | Component::RootDir => {
                resolved = PathBuf::from("/");
                canonical = true;
            }
            Component::CurDir => {}
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(name) => {
                let candidate = resolved.join(name);
                match candidate.symlink_metadata() {
                    Err(_) => {
                        resolved = candidate;
                        canonical = false;
                    }
                    // A name that is no symlink, under a canonical path, is canonical: resolving
                    // the whole path again (a `readlink` for each of its components) is only
                    // for symlinks, or under a name that was missing.
                    Ok(m) if canonical && !m.file_type().is_symlink() => resolved = candidate,
                    Ok(_) => match candidate.canonicalize() {
                        Ok(real) => {
                            resolved = real;
                            canonical = true;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            return Err(reject("goes through a symlink whose target does not exist"));
                        }
                        Err(_) => {
                            return Err(reject("goes through a symlink that cannot be resolved (a loop, or no permission)"));
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

/// Makes `dir` and its parents if `dir` is not a directory yet. Actions and runs make the same
/// directories over and over (a run's working directory, a saved file's parent, a plugin's
/// sandbox): on one that exists this is one `stat`, where `create_dir_all` alone makes a `mkdir`
/// that fails and then a `stat`.
pub fn make_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)
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

    /// `<tmp>/root` with `sub/file.txt`, and symlinks: `escape` → `<tmp>/outside`, `inner` →
    /// `sub` (stays inside), `dangling` → a missing file outside, `passwd` → `/etc/passwd`,
    /// `chain` → `escape` (a link to a link out), `rel-up` → `../outside` (relative target),
    /// `up` → `..`, `rootlink` → `/`, `loop` → itself, `self` → `.`.
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
        symlink("escape", root.join("chain")).expect("symlink");
        symlink("../outside", root.join("rel-up")).expect("symlink");
        symlink("..", root.join("up")).expect("symlink");
        symlink("/", root.join("rootlink")).expect("symlink");
        symlink("loop", root.join("loop")).expect("symlink");
        symlink(".", root.join("self")).expect("symlink");
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

    /// Odd spellings that look like escapes but are literal names (or real paths) inside.
    #[test]
    fn lookalikes_are_literal_names_inside() {
        let f = fixture();
        let abs_back_in = format!("{}/sub/../sub/file.txt", f.root.display());
        let cases: &[(&str, &str)] = &[
            ("%2e%2e/%2e%2e/etc/passwd", "%2e%2e/%2e%2e/etc/passwd"),
            ("%2E%2E%2F%2E%2E%2Fetc", "%2E%2E%2F%2E%2E%2Fetc"),
            ("..%2f..%2fetc/passwd", "..%2f..%2fetc/passwd"),
            ("%252e%252e/x", "%252e%252e/x"),
            ("..\\..\\etc\\passwd", "..\\..\\etc\\passwd"),
            ("\u{ff0e}\u{ff0e}/\u{ff0e}\u{ff0e}/etc", "\u{ff0e}\u{ff0e}/\u{ff0e}\u{ff0e}/etc"),
            ("\u{2025}/x", "\u{2025}/x"),
            ("sub\u{2215}..\u{2215}..", "sub\u{2215}..\u{2215}.."),
            ("...", "..."),
            ("..../x", "..../x"),
            (" ../x", " ../x"),
            ("..;/x", "..;/x"),
            ("~/x", "~/x"),
            ("$HOME/.ssh", "$HOME/.ssh"),
            ("sub/", "sub"),
            ("sub//file.txt", "sub/file.txt"),
            ("./sub/./file.txt", "sub/file.txt"),
            ("sub/file.txt/", "sub/file.txt"),
            ("inner/../sub/file.txt", "sub/file.txt"),
            ("self/sub/file.txt", "sub/file.txt"),
            // `escape/..` is `<tmp>`, as the kernel resolves it, and `<tmp>/root` is back inside.
            ("escape/../root/sub/file.txt", "sub/file.txt"),
            (abs_back_in.as_str(), "sub/file.txt"),
        ];
        for (case, inside) in cases {
            match resolve("t.t", &f.root, case) {
                Ok(path) => assert_eq!(path, f.root.join(inside), "{case:?}"),
                Err(e) => panic!("{case:?} should resolve inside, got {e}"),
            }
        }
    }

    #[test]
    fn escape_attempts_are_rejected() {
        let f = fixture();
        let outside_abs = f.outside.join("secret");
        let outside_new = f.outside.join("new.txt");
        let root_then_up = format!("{}/../outside/secret", f.root.display());
        let root_trailing_up = format!("{}/..", f.root.display());
        let cases = [
            // `..` in its forms
            "..",
            "../",
            "./..",
            "./../outside",
            "../outside/secret",
            "sub/../../outside/secret",
            "sub/./../../outside/",
            "sub/../..",
            "sub/file.txt/../../..",
            "nonexistent/../../outside",
            "nonexistent/../../../etc/passwd",
            "a/b/c/../../../../outside",
            "a/../../../../../../../../../../../../etc/passwd",
            "../../../../../../../../../../../../../../../../etc/passwd",
            // absolute paths
            "/etc/passwd",
            "/",
            "//etc/passwd",
            "///etc",
            "/../etc/passwd",
            "/tmp",
            outside_abs.to_str().expect("utf-8"),
            outside_new.to_str().expect("utf-8"),
            root_then_up.as_str(),
            root_trailing_up.as_str(),
            // symlinks leading out, directly or as a parent
            "escape",
            "escape/",
            "escape/.",
            "escape/secret",
            "escape/new-file.txt",
            "escape/newdir/new.txt",
            "chain/secret",
            "rel-up/secret",
            "up",
            "up/outside/secret",
            "rootlink",
            "rootlink/etc/passwd",
            "passwd",
            "inner/../../outside",
            "nonexistent/../escape/secret",
            "nonexistent/../escape/new.txt",
            // links that cannot be resolved
            "dangling",
            "dangling/",
            "dangling/child",
            "loop",
            "loop/x",
            // malformed
            "sub/file.txt\0/../../x",
            "",
        ];
        // The issue asks for at least 30 distinct escape attempts; keep it that way.
        for case in cases {
            let err = match resolve("t.t", &f.root, case) {
                Ok(path) => panic!("{case:?} should be rejected, resolved to {}", path.display()),
                Err(err) => err,
            };
            let message = err.to_string();
            assert!(message.starts_with(&format!("t.t: path \"{case}\" ")), "{message}");
            match err {
                ActionError::PathNotAllowed { action, path, .. } => {
                    assert_eq!(action, "t.t");
                    assert_eq!(path, case);
                }
                other => panic!("{case:?} should be PathNotAllowed, got {other:?}"),
            }
        }
    }

    #[test]
    fn make_dir_makes_what_is_missing_and_refuses_a_file_in_the_way() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let deep = tmp.path().join("a/b/c");
        make_dir(&deep).expect("made with its parents");
        assert!(deep.is_dir());
        make_dir(&deep).expect("one that exists is fine");
        fs::write(tmp.path().join("file"), "x").expect("write");
        let err = make_dir(&tmp.path().join("file/sub")).expect_err("a file is in the way");
        assert_eq!(err.kind(), std::io::ErrorKind::NotADirectory, "{err}");
    }

    #[test]
    fn error_names_the_path_and_the_reason() {
        let f = fixture();
        let err = resolve("file-read.read", &f.root, "../x").expect_err("escape");
        assert_eq!(err.to_string(), "file-read.read: path \"../x\" is outside the working directory");
        let err = resolve("file-read.read", &f.root, "dangling").expect_err("dangling");
        assert_eq!(err.to_string(), "file-read.read: path \"dangling\" goes through a symlink whose target does not exist");
        let err = resolve("file-read.read", &f.root, "loop").expect_err("loop");
        assert!(err.to_string().starts_with("file-read.read: path \"loop\" goes through a symlink that cannot be resolved"), "{err}");
    }
}
