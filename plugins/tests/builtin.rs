//! Drives the built-in plugins through `Registry::invoke`, as the worker does.

// Tests set up repositories with `git` directly.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, Instant};

use lamplighter_plugins::{ActionContext, ActionError, Registry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

fn ctx(dir: &Path, allowed: &[&str]) -> ActionContext {
    ActionContext {
        working_directory: dir.to_path_buf(),
        allowed_commands: allowed.iter().map(|s| (*s).to_owned()).collect(),
        cancel: CancellationToken::new(),
    }
}

async fn call(plugin: &str, action: &str, params: Value, ctx: &ActionContext) -> Result<Value, ActionError> {
    Registry::builtin().invoke(plugin, action, params, ctx).await
}

#[test]
fn registry_lists_builtins_with_manifest_schemas() {
    let registry = Registry::builtin();
    let shell = registry.plugins().iter().find(|p| p.name == "shell-exec").expect("shell-exec listed");
    assert_eq!((shell.kind.as_str(), shell.version.as_str()), ("builtin", "1.0.0"));
    assert_eq!(shell.actions[0].name, "run");
    assert_eq!(shell.actions[0].parameters["required"], json!(["command"]));
    assert!(registry.has_action("git-operations", "commit"));
    assert!(registry.action_names().contains(&"file-read.read".to_owned()));
}

#[tokio::test]
async fn unknown_action_and_bad_parameters_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    let err = call("file-read", "write", json!({}), &c).await.expect_err("unknown");
    assert!(matches!(err, ActionError::UnknownAction { ref name, .. } if name == "file-read.write"), "{err}");
    let err = call("file-read", "read", json!({}), &c).await.expect_err("missing");
    assert_eq!(err.to_string(), "file-read.read: parameter \"path\" is required");
    assert!(err.is_permanent());
    let err = call("file-read", "read", json!({"path": 3}), &c).await.expect_err("type");
    assert_eq!(err.to_string(), "file-read.read: parameter \"path\" must be a string, not an integer");
    let err = call("file-save", "save", json!({"path": "a", "content": "b", "mode": "0600"}), &c).await.expect_err("extra");
    assert_eq!(err.to_string(), "file-save.save: parameter \"mode\" is not a parameter of file-save.save; known: \"content\", \"path\"");
    let err = call("shell-exec", "run", json!({"command": "true", "timeout_seconds": 0}), &c).await.expect_err("range");
    assert!(matches!(err, ActionError::InvalidParameter { ref parameter, .. } if parameter == "timeout_seconds"), "{err}");
    let err = call("git-operations", "commit", json!({"message": "m", "paths": "a.txt"}), &c).await.expect_err("array");
    assert_eq!(err.to_string(), "git-operations.commit: parameter \"paths\" must be an array, not a string");
}

#[tokio::test]
async fn save_then_read_with_offset_and_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    let saved =
        call("file-save", "save", json!({"path": "notes/deep/a.txt", "content": "one\ntwo\nthree\nfour\n"}), &c).await.expect("save");
    assert_eq!(saved, json!({"path": "notes/deep/a.txt", "bytes_written": 19}));
    assert_eq!(std::fs::read_to_string(dir.path().join("notes/deep/a.txt")).expect("written"), "one\ntwo\nthree\nfour\n");
    let all = call("file-read", "read", json!({"path": "notes/deep/a.txt"}), &c).await.expect("read");
    assert_eq!(all, json!("     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n"));
    let some = call("file-read", "read", json!({"path": "notes/deep/a.txt", "offset": 2, "limit": 2}), &c).await.expect("read");
    assert_eq!(some, json!("     2\ttwo\n     3\tthree\n"));
    let err = call("file-read", "read", json!({"path": "missing.txt"}), &c).await.expect_err("missing file");
    assert!(matches!(err, ActionError::Failed { .. }) && err.to_string().contains("\"missing.txt\""), "{err}");
}

#[tokio::test]
async fn file_actions_refuse_paths_outside() {
    let outer = tempfile::tempdir().expect("tempdir");
    let root = outer.path().join("root");
    std::fs::create_dir(&root).expect("mkdir");
    std::fs::write(outer.path().join("secret"), "s").expect("write");
    std::os::unix::fs::symlink(outer.path(), root.join("up")).expect("symlink");
    let c = ctx(&root, &[]);
    for path in ["../secret", "up/secret", "/etc/passwd"] {
        let err = call("file-read", "read", json!({"path": path}), &c).await.expect_err(path);
        assert!(matches!(err, ActionError::PathNotAllowed { path: ref p, .. } if p == path), "{err}");
    }
    for path in ["../evil.txt", "up/evil.txt", "up/new/evil.txt"] {
        let err = call("file-save", "save", json!({"path": path, "content": "x"}), &c).await.expect_err(path);
        assert!(matches!(err, ActionError::PathNotAllowed { .. }), "{err}");
    }
    assert!(!outer.path().join("evil.txt").exists() && !outer.path().join("new").exists());
}

#[tokio::test]
async fn shell_runs_in_working_directory_and_captures_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("marker.txt"), "").expect("write");
    let c = ctx(dir.path(), &["ls", "echo"]);
    let out = call("shell-exec", "run", json!({"command": "ls; echo err >&2"}), &c).await.expect("run");
    assert_eq!(out, json!({"exit_code": 0, "stdout": "marker.txt\n", "stderr": "err\n", "truncated": false}));
}

#[tokio::test]
async fn shell_nonzero_exit_is_failed_with_code_and_stderr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = call("shell-exec", "run", json!({"command": "echo boom >&2; exit 3"}), &ctx(dir.path(), &[])).await.expect_err("exit 3");
    assert_eq!(err.to_string(), "shell-exec.run failed: command exited with code 3; stderr: boom");
}

#[tokio::test]
async fn shell_allowlist_refuses_injection_before_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &["ls", "echo"]);
    for command in [
        "touch pwned",
        "ls; touch pwned",
        "ls $(touch pwned)",
        "ls `touch pwned`",
        "ls\ntouch pwned",
        "ls && touch pwned",
        "ls | touch pwned",
    ] {
        let err = call("shell-exec", "run", json!({"command": command}), &c).await.expect_err(command);
        assert!(matches!(err, ActionError::CommandNotAllowed { .. }), "{command:?}: {err}");
        assert!(err.is_permanent());
    }
    assert!(!dir.path().join("pwned").exists());
}

#[tokio::test]
async fn shell_output_is_capped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out =
        call("shell-exec", "run", json!({"command": "head -c 3000000 /dev/zero | tr '\\0' a"}), &ctx(dir.path(), &[])).await.expect("run");
    assert_eq!(out["truncated"], json!(true));
    assert_eq!(out["stdout"].as_str().map(str::len), Some(1024 * 1024));
}

fn pid_alive(pid: &str) -> bool {
    // A zombie waiting for a reaper counts as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn assert_gone(pid_file: &Path) {
    let pid = std::fs::read_to_string(pid_file).expect("pid written").trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(3);
    while pid_alive(&pid) {
        assert!(Instant::now() < deadline, "background sleep {pid} survived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn shell_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let err =
        call("shell-exec", "run", json!({"command": "sleep 30 & echo $! > sleep.pid; wait", "timeout_seconds": 1}), &ctx(dir.path(), &[]))
            .await
            .expect_err("timeout");
    assert_eq!(err, ActionError::Timeout { action: "shell-exec.run".to_owned(), seconds: 1 });
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_gone(&dir.path().join("sleep.pid")).await;
}

#[tokio::test]
async fn shell_cancel_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    let cancel = c.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let err = call("shell-exec", "run", json!({"command": "sleep 30 & echo $! > sleep.pid; wait"}), &c).await.expect_err("cancelled");
    assert_eq!(err, ActionError::Cancelled { action: "shell-exec.run".to_owned() });
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_gone(&dir.path().join("sleep.pid")).await;
}

/// Test setup runs `git` directly; the plugin itself goes through its process module.
fn git_setup(dir: &Path, args: &[&str]) {
    let status = std::process::Command::new("git")
        .args(["-c", "user.name=Test", "-c", "user.email=test@example.com", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

#[tokio::test]
async fn git_log_status_diff_and_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    git_setup(root, &["init", "--quiet"]);
    git_setup(root, &["config", "user.name", "Test"]);
    git_setup(root, &["config", "user.email", "test@example.com"]);
    std::fs::write(root.join("a.txt"), "one\n").expect("write");
    git_setup(root, &["add", "a.txt"]);
    git_setup(root, &["commit", "--quiet", "-m", "first commit"]);
    let c = ctx(root, &[]);

    let log = call("git-operations", "log", Value::Null, &c).await.expect("log");
    let log = log.as_str().expect("text");
    assert!(log.trim_end().ends_with(" first commit") && log.lines().count() == 1, "{log}");
    let long = call("git-operations", "log", json!({"oneline": false, "count": 1}), &c).await.expect("log");
    assert!(long.as_str().is_some_and(|l| l.contains("Author: Test <test@example.com>")), "{long}");

    std::fs::write(root.join("a.txt"), "two\n").expect("write");
    let status = call("git-operations", "status", json!({}), &c).await.expect("status");
    assert!(status.as_str().is_some_and(|s| s.contains("modified:   a.txt")), "{status}");
    let diff = call("git-operations", "diff", json!({"path": "a.txt"}), &c).await.expect("diff");
    assert!(diff.as_str().is_some_and(|d| d.contains("-one") && d.contains("+two")), "{diff}");
    let staged = call("git-operations", "diff", json!({"staged": true}), &c).await.expect("diff");
    assert_eq!(staged, json!(""));

    call("git-operations", "commit", json!({"message": "second commit", "paths": ["a.txt"]}), &c).await.expect("commit");
    let log = call("git-operations", "log", json!({"count": 5}), &c).await.expect("log");
    assert_eq!(log.as_str().map(|l| l.lines().count()), Some(2), "{log}");

    let err = call("git-operations", "diff", json!({"path": "../x"}), &c).await.expect_err("outside");
    assert!(matches!(err, ActionError::PathNotAllowed { .. }), "{err}");
    let err = call("git-operations", "log", json!({"directory": "/"}), &c).await.expect_err("outside");
    assert!(matches!(err, ActionError::PathNotAllowed { .. }), "{err}");
}

#[tokio::test]
async fn git_does_not_find_a_repository_above_the_working_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    git_setup(dir.path(), &["init", "--quiet"]);
    let inner = dir.path().join("inner");
    std::fs::create_dir(&inner).expect("mkdir");
    let err = call("git-operations", "status", json!({}), &ctx(&inner, &[])).await.expect_err("not a repo");
    assert!(err.to_string().contains("not a git repository"), "{err}");
}

#[tokio::test]
async fn tree_lists_with_sizes_depth_pattern_and_hidden() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("src/deep/deeper")).expect("mkdir");
    std::fs::write(root.join("src/main.rs"), "fn main() {}\n").expect("write");
    std::fs::write(root.join("src/deep/deeper/x.rs"), "").expect("write");
    std::fs::write(root.join("README.md"), "hi").expect("write");
    std::fs::write(root.join(".hidden"), "").expect("write");
    let c = ctx(root, &[]);
    let name = root.file_name().and_then(|n| n.to_str()).expect("name").to_owned();

    let out = call("directory-list", "tree", json!({"depth": 2}), &c).await.expect("tree");
    assert_eq!(out, json!(format!("{name}/\n  README.md (2 B)\n  src/\n    deep/\n    main.rs (13 B)\n")));
    let out = call("directory-list", "tree", json!({"pattern": "*.rs", "include_hidden": true}), &c).await.expect("tree");
    assert_eq!(out, json!(format!("{name}/\n  src/\n    deep/\n      deeper/\n    main.rs (13 B)\n")));
    let out = call("directory-list", "tree", json!({"include_hidden": true, "depth": 1}), &c).await.expect("tree");
    assert!(out.as_str().is_some_and(|t| t.contains(".hidden (0 B)")), "{out}");
    let err = call("directory-list", "tree", json!({"directory": ".."}), &c).await.expect_err("outside");
    assert!(matches!(err, ActionError::PathNotAllowed { .. }), "{err}");
}
