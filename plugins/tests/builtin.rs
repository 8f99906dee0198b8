//! Drives the built-in plugins through `Registry::invoke`, as the worker does.

// Tests set up repositories with `git` directly.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, Instant};

use lamplighter_plugins::{ActionContext, ActionError, Registry};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

fn ctx(dir: &Path, allowed: &[&str]) -> ActionContext {
    ActionContext {
        working_directory: dir.to_path_buf(),
        allowed_commands: allowed.iter().map(|s| (*s).to_owned()).collect(),
        cancel: CancellationToken::new(),
        usage: Default::default(),
        output: None,
        host: None,
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
async fn a_line_longer_than_a_read_is_cut_and_the_next_keeps_its_number() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 3 MiB without a newline, then a short line: read a piece at a time, the long line's
    // rest skipped, never held whole.
    let long = "x".repeat(3 * 1024 * 1024);
    std::fs::write(dir.path().join("long.txt"), format!("{long}\nafter\n")).expect("write");
    let c = ctx(dir.path(), &[]);
    let second = call("file-read", "read", json!({"path": "long.txt", "offset": 2}), &c).await.expect("read");
    assert_eq!(second, json!("     2\tafter\n"), "the line after the long one is line 2");
    let first = call("file-read", "read", json!({"path": "long.txt"}), &c).await.expect("read");
    let text = first.as_str().expect("text");
    assert!(text.starts_with("     1\txxx") && text.contains("(output cut at 1048576 bytes"), "{}", &text[text.len() - 200..]);
    assert!(text.len() < 1024 * 1024 + 200, "one piece of the long line, not all of it: {} bytes", text.len());
    // A stopped run's read stops.
    c.cancel.cancel();
    let err = call("file-read", "read", json!({"path": "long.txt"}), &c).await.expect_err("stopped");
    assert!(matches!(err, ActionError::Cancelled { .. }), "{err}");
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
    let c = ctx(dir.path(), &["ls", "echo *"]);
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

/// A call whose future is dropped (the engine stopped the run: a fence, a drain) leaves
/// nothing of its command running.
#[tokio::test]
async fn a_dropped_call_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    let call = call("shell-exec", "run", json!({"command": "sleep 30 & echo $! > sleep.pid; wait"}), &c);
    assert!(tokio::time::timeout(Duration::from_millis(500), call).await.is_err(), "still running when dropped");
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

#[tokio::test]
async fn new_actions_name_the_parameter_that_is_missing_or_of_the_wrong_type() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    let cases = [
        ("file-edit", "search-replace", json!({"path": "a", "search": "x"}), "parameter \"replace\" is required"),
        (
            "file-edit",
            "search-replace",
            json!({"path": "a", "search": "x", "replace": "y", "occurrence": "2"}),
            "parameter \"occurrence\" must be an integer, not a string",
        ),
        (
            "file-edit",
            "search-replace",
            json!({"path": "a", "search": "x", "replace": "y", "occurrence": -1}),
            "parameter \"occurrence\" must be between 0 and 4294967295, not -1",
        ),
        (
            "file-edit",
            "search-replace",
            json!({"path": "a", "search": "", "replace": "y"}),
            "parameter \"search\" is empty; give the exact text to find",
        ),
        ("file-edit", "insert", json!({"path": "a", "content": "x"}), "parameter \"line\" is required"),
        ("file-edit", "insert", json!({"path": "a", "line": "3", "content": "x"}), "parameter \"line\" must be an integer, not a string"),
        (
            "file-edit",
            "insert",
            json!({"path": "a", "line": 0, "content": "x"}),
            "parameter \"line\" must be between 1 and 4294967295, not 0",
        ),
        ("file-delete", "delete", json!({}), "parameter \"path\" is required"),
        ("file-delete", "delete", json!({"path": ["a"]}), "parameter \"path\" must be a string, not an array"),
        ("file-glob", "search", json!({"pattern": 5}), "parameter \"pattern\" must be a string, not an integer"),
        ("file-glob", "search", json!({"search_term": true}), "parameter \"search_term\" must be a string, not a boolean"),
        ("file-glob", "search", json!({"pattern": "[abc"}), "parameter \"pattern\" is not a valid glob: "),
        ("project-detect", "analyze", json!({"directory": 1}), "parameter \"directory\" must be a string, not an integer"),
        ("web-fetch", "fetch", json!({}), "parameter \"url\" is required"),
        (
            "web-fetch",
            "fetch",
            json!({"url": "http://x.example", "max_length": "10"}),
            "parameter \"max_length\" must be an integer, not a string",
        ),
        (
            "web-fetch",
            "fetch",
            json!({"url": "http://x.example", "max_length": 0}),
            "parameter \"max_length\" must be between 1 and 5000000, not 0",
        ),
        ("web-fetch", "fetch", json!({"url": "ftp://x.example/y"}), "parameter \"url\" must be an http or https URL, not \"ftp:\""),
        ("web-fetch", "fetch", json!({"url": "no scheme"}), "parameter \"url\" is not a valid URL"),
    ];
    for (plugin, action, params, expected) in cases {
        let err = call(plugin, action, params, &c).await.expect_err(expected);
        assert!(matches!(err, ActionError::InvalidParameter { .. }), "{plugin}.{action}: {err}");
        assert!(err.to_string().starts_with(&format!("{plugin}.{action}: {expected}")), "{plugin}.{action}: {err}");
        assert!(err.is_permanent());
    }
}

#[tokio::test]
async fn read_edges_offset_past_the_end_and_limit_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.txt"), "one\ntwo").expect("write");
    let c = ctx(dir.path(), &[]);
    let all = call("file-read", "read", json!({"path": "a.txt"}), &c).await.expect("read");
    assert_eq!(all, json!("     1\tone\n     2\ttwo\n"), "a last line without a newline is still a line");
    let past = call("file-read", "read", json!({"path": "a.txt", "offset": 10}), &c).await.expect("read");
    assert_eq!(past, json!(""));
    let err = call("file-read", "read", json!({"path": "a.txt", "limit": 0}), &c).await.expect_err("limit 0");
    assert!(matches!(err, ActionError::InvalidParameter { ref parameter, .. } if parameter == "limit"), "{err}");
    let err = call("file-read", "read", json!({"path": "."}), &c).await.expect_err("a directory");
    assert!(err.to_string().contains("is a directory"), "{err}");
}

#[tokio::test]
async fn tree_rejects_a_wrong_type_and_a_depth_out_of_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    let err = call("directory-list", "tree", json!({"include_hidden": "yes"}), &c).await.expect_err("type");
    assert_eq!(err.to_string(), "directory-list.tree: parameter \"include_hidden\" must be a boolean, not a string");
    let err = call("directory-list", "tree", json!({"depth": 0}), &c).await.expect_err("range");
    assert!(matches!(err, ActionError::InvalidParameter { ref parameter, .. } if parameter == "depth"), "{err}");
}

fn contents(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).expect("readable")
}

#[tokio::test]
async fn search_replace_first_nth_and_all_occurrences() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let c = ctx(root, &[]);
    let edit = |occurrence: Option<i64>| {
        let mut params = json!({"path": "f.txt", "search": "a", "replace": "b"});
        if let Some(n) = occurrence {
            params["occurrence"] = json!(n);
        }
        params
    };

    std::fs::write(root.join("f.txt"), "a x a x a").expect("write");
    let out = call("file-edit", "search-replace", edit(None), &c).await.expect("first");
    assert_eq!(out, json!({"path": "f.txt", "replacements": 1}));
    assert_eq!(contents(root, "f.txt"), "b x a x a", "the default is the first occurrence");

    std::fs::write(root.join("f.txt"), "a x a x a").expect("write");
    call("file-edit", "search-replace", edit(Some(2)), &c).await.expect("second");
    assert_eq!(contents(root, "f.txt"), "a x b x a");

    std::fs::write(root.join("f.txt"), "a x a x a").expect("write");
    let out = call("file-edit", "search-replace", edit(Some(0)), &c).await.expect("all");
    assert_eq!(out, json!({"path": "f.txt", "replacements": 3}));
    assert_eq!(contents(root, "f.txt"), "b x b x b", "occurrence 0 replaces all");

    std::fs::write(root.join("f.txt"), "a x a x a").expect("write");
    let err = call("file-edit", "search-replace", edit(Some(4)), &c).await.expect_err("no 4th");
    assert_eq!(
        err.to_string(),
        "file-edit.search-replace: parameter \"occurrence\" is 4, but \"a\" occurs only 3 times in \"f.txt\" (use 0 to replace every occurrence)"
    );
    let err = call("file-edit", "search-replace", json!({"path": "f.txt", "search": "zzz", "replace": "y"}), &c).await.expect_err("absent");
    assert_eq!(err.to_string(), "file-edit.search-replace: parameter \"search\" does not occur in \"f.txt\" (searched for \"zzz\")");
    assert!(err.is_permanent());
    assert_eq!(contents(root, "f.txt"), "a x a x a", "a failed edit leaves the file alone");

    // Multi-line text, and a replacement that contains the search text (no re-scanning).
    std::fs::write(root.join("g.rs"), "fn a() {\n    old();\n}\nfn b() {\n    old();\n}\n").expect("write");
    let out = call(
        "file-edit",
        "search-replace",
        json!({"path": "g.rs", "search": "    old();\n", "replace": "    old();\n    new();\n", "occurrence": 0}),
        &c,
    )
    .await
    .expect("multi-line");
    assert_eq!(out["replacements"], json!(2));
    assert_eq!(contents(root, "g.rs"), "fn a() {\n    old();\n    new();\n}\nfn b() {\n    old();\n    new();\n}\n");
    let err = call("file-edit", "search-replace", json!({"path": "g.rs", "search": "fn c", "replace": "", "occurrence": 2}), &c)
        .await
        .expect_err("absent");
    assert!(matches!(err, ActionError::InvalidParameter { ref parameter, .. } if parameter == "search"), "{err}");

    let err =
        call("file-edit", "search-replace", json!({"path": "missing.txt", "search": "a", "replace": "b"}), &c).await.expect_err("missing");
    assert!(matches!(err, ActionError::Failed { .. }) && err.to_string().contains("\"missing.txt\""), "{err}");
    let err =
        call("file-edit", "search-replace", json!({"path": "../f.txt", "search": "a", "replace": "b"}), &c).await.expect_err("outside");
    assert!(matches!(err, ActionError::PathNotAllowed { ref path, .. } if path == "../f.txt"), "{err}");
    std::fs::write(root.join("bin"), [0xff, 0xfe, b'a']).expect("write");
    let err = call("file-edit", "search-replace", json!({"path": "bin", "search": "a", "replace": "b"}), &c).await.expect_err("binary");
    assert!(err.to_string().contains("\"bin\" is not UTF-8 text"), "{err}");
}

#[tokio::test]
async fn insert_before_a_line_appends_and_keeps_line_endings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let c = ctx(root, &[]);
    let insert = |path: &str, line: i64, content: &str| json!({"path": path, "line": line, "content": content});

    std::fs::write(root.join("f.txt"), "one\ntwo\n").expect("write");
    let out = call("file-edit", "insert", insert("f.txt", 1, "zero"), &c).await.expect("at the top");
    assert_eq!(out, json!({"path": "f.txt", "line": 1, "lines_inserted": 1}));
    assert_eq!(contents(root, "f.txt"), "zero\none\ntwo\n");
    call("file-edit", "insert", insert("f.txt", 4, "three"), &c).await.expect("one past the end appends");
    assert_eq!(contents(root, "f.txt"), "zero\none\ntwo\nthree\n");
    let out = call("file-edit", "insert", insert("f.txt", 3, "a\nb\n"), &c).await.expect("several lines");
    assert_eq!(out["lines_inserted"], json!(2));
    assert_eq!(contents(root, "f.txt"), "zero\none\na\nb\ntwo\nthree\n");
    let err = call("file-edit", "insert", insert("f.txt", 9, "x"), &c).await.expect_err("past the end");
    assert_eq!(err.to_string(), "file-edit.insert: parameter \"line\" is 9, but \"f.txt\" has 6 lines; use 1 to 7 (7 appends)");

    std::fs::write(root.join("no-newline.txt"), "x").expect("write");
    call("file-edit", "insert", insert("no-newline.txt", 2, "y"), &c).await.expect("append");
    assert_eq!(contents(root, "no-newline.txt"), "x\ny\n");
    std::fs::write(root.join("crlf.txt"), "a\r\nb\r\n").expect("write");
    call("file-edit", "insert", insert("crlf.txt", 2, "c"), &c).await.expect("crlf");
    assert_eq!(contents(root, "crlf.txt"), "a\r\nc\r\nb\r\n");
    std::fs::write(root.join("empty.txt"), "").expect("write");
    call("file-edit", "insert", insert("empty.txt", 1, "first"), &c).await.expect("empty file");
    assert_eq!(contents(root, "empty.txt"), "first\n");
    let err = call("file-edit", "insert", insert("empty.txt", 3, "x"), &c).await.expect_err("past the end");
    assert!(err.to_string().contains("has 1 line; use 1 to 2"), "{err}");
    let err = call("file-edit", "insert", insert("/etc/passwd", 1, "x"), &c).await.expect_err("outside");
    assert!(matches!(err, ActionError::PathNotAllowed { .. }), "{err}");
}

#[tokio::test]
async fn delete_removes_files_and_links_but_not_directories_or_the_root() {
    let outer = tempfile::tempdir().expect("tempdir");
    let root = outer.path().join("root");
    std::fs::create_dir_all(root.join("sub")).expect("mkdir");
    std::fs::write(root.join("a.txt"), "a").expect("write");
    std::fs::write(root.join("sub/b.txt"), "b").expect("write");
    std::fs::write(outer.path().join("secret"), "s").expect("write");
    std::os::unix::fs::symlink(root.join("sub/b.txt"), root.join("link.txt")).expect("symlink");
    std::os::unix::fs::symlink(outer.path(), root.join("up")).expect("symlink");
    let c = ctx(&root, &[]);

    let out = call("file-delete", "delete", json!({"path": "a.txt"}), &c).await.expect("delete");
    assert_eq!(out, json!({"path": "a.txt", "deleted": "file"}));
    assert!(!root.join("a.txt").exists());

    let out = call("file-delete", "delete", json!({"path": "link.txt"}), &c).await.expect("delete link");
    assert_eq!(out["deleted"], json!("symlink"));
    assert!(root.join("link.txt").symlink_metadata().is_err() && root.join("sub/b.txt").exists(), "the link goes, its target stays");

    let err = call("file-delete", "delete", json!({"path": "sub"}), &c).await.expect_err("directory");
    assert_eq!(err.to_string(), "file-delete.delete: parameter \"path\" \"sub\" is a directory; file-delete.delete deletes files only");
    for path in [".", "./", "sub/..", root.to_str().expect("utf-8")] {
        let err = call("file-delete", "delete", json!({"path": path}), &c).await.expect_err(path);
        assert!(matches!(err, ActionError::PathNotAllowed { path: ref p, .. } if p == path), "{path}: {err}");
        assert!(err.to_string().contains("is the working directory itself"), "{err}");
    }
    for path in ["../secret", "up/secret", "/etc/passwd", ""] {
        let err = call("file-delete", "delete", json!({"path": path}), &c).await.expect_err(path);
        assert!(matches!(err, ActionError::PathNotAllowed { path: ref p, .. } if p == path), "{path}: {err}");
    }
    assert!(outer.path().join("secret").exists() && root.join("sub/b.txt").exists());
    let err = call("file-delete", "delete", json!({"path": "gone.txt"}), &c).await.expect_err("missing");
    assert!(matches!(err, ActionError::Failed { .. }) && err.to_string().contains("cannot delete \"gone.txt\""), "{err}");
}

/// `README.md`, `docs/guide.md`, `docs/deep/x.md`, `notes.txt`, `src/{lib,main}.rs`,
/// `.hidden/secret.md`, with a few TODOs.
fn glob_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    for (path, text) in [
        ("README.md", "# Readme\n"),
        ("docs/guide.md", "Guide\n"),
        ("docs/deep/x.md", "deep\n"),
        ("notes.txt", "TODO one\nnothing\n    todo: two\n"),
        ("src/lib.rs", "pub fn f() {}\n"),
        ("src/main.rs", "// TODO: fix\nfn main() {}\n"),
        (".hidden/secret.md", "todo hidden\n"),
    ] {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    dir
}

#[tokio::test]
async fn glob_lists_matching_files_relative_to_the_working_directory() {
    let dir = glob_fixture();
    let c = ctx(dir.path(), &[]);
    let search = |params: Value| call("file-glob", "search", params, &c);
    assert_eq!(search(Value::Null).await.expect("default"), json!("README.md\n"), "the default *.md is the top level only");
    assert_eq!(search(json!({"pattern": "**/*.md"})).await.expect("recursive"), json!("README.md\ndocs/deep/x.md\ndocs/guide.md\n"));
    assert_eq!(search(json!({"pattern": "**/*.{rs,txt}"})).await.expect("braces"), json!("notes.txt\nsrc/lib.rs\nsrc/main.rs\n"));
    assert_eq!(search(json!({"pattern": "src/m?in.rs"})).await.expect("one level"), json!("src/main.rs\n"));
    assert_eq!(search(json!({"directory": "docs", "pattern": "*.md"})).await.expect("in a directory"), json!("docs/guide.md\n"));
    assert_eq!(
        search(json!({"directory": "docs", "pattern": "**/*.md"})).await.expect("in a directory"),
        json!("docs/deep/x.md\ndocs/guide.md\n")
    );
    assert_eq!(search(json!({"pattern": "*.zip"})).await.expect("none"), json!("No matches found"));
    assert_eq!(search(json!({"pattern": "**/secret.md"})).await.expect("hidden skipped"), json!("No matches found"));
    assert_eq!(search(json!({"pattern": ".hidden/*.md"})).await.expect("hidden named"), json!(".hidden/secret.md\n"));
    let absolute = format!("{}/docs/*.md", dir.path().display());
    assert_eq!(search(json!({"pattern": absolute})).await.expect("absolute inside"), json!("docs/guide.md\n"));
}

#[tokio::test]
async fn glob_search_term_returns_matching_lines_case_insensitively() {
    let dir = glob_fixture();
    let c = ctx(dir.path(), &[]);
    let out = call("file-glob", "search", json!({"pattern": "**/*", "search_term": "todo"}), &c).await.expect("search");
    assert_eq!(out, json!("notes.txt:1: TODO one\nnotes.txt:3: todo: two\nsrc/main.rs:1: // TODO: fix\n"));
    let out = call("file-glob", "search", json!({"pattern": "**/*.md", "search_term": "nowhere"}), &c).await.expect("search");
    assert_eq!(out, json!("No matches found"));
}

#[tokio::test]
async fn glob_refuses_patterns_that_leave_and_never_follows_links_out() {
    let outer = tempfile::tempdir().expect("tempdir");
    let root = outer.path().join("root");
    let outside = outer.path().join("outside");
    std::fs::create_dir_all(&root).expect("mkdir");
    std::fs::create_dir_all(&outside).expect("mkdir");
    std::fs::write(root.join("in.md"), "in").expect("write");
    std::fs::write(outside.join("secret.md"), "s").expect("write");
    std::os::unix::fs::symlink(&outside, root.join("outdir")).expect("symlink");
    std::os::unix::fs::symlink(outside.join("secret.md"), root.join("out.md")).expect("symlink");
    std::os::unix::fs::symlink(root.join("in.md"), root.join("alias.md")).expect("symlink");
    let c = ctx(&root, &[]);

    let out = call("file-glob", "search", json!({"pattern": "**/*.md"}), &c).await.expect("search");
    assert_eq!(out, json!("alias.md\nin.md\n(1 symlinked files leading outside the working directory were skipped)"));
    let out = call("file-glob", "search", json!({"pattern": "outdir/*.md"}), &c).await.expect("search");
    assert_eq!(out, json!("No matches found"), "a symlinked directory is not entered");
    let outside_pattern = format!("{}/*.md", outside.display());
    for pattern in ["../*.md", "../outside/*.md", "**/../../*", "{..,x}/*.md", "/etc/*", outside_pattern.as_str()] {
        let err = call("file-glob", "search", json!({"pattern": pattern}), &c).await.expect_err(pattern);
        assert!(matches!(err, ActionError::PathNotAllowed { ref path, .. } if path == pattern), "{pattern}: {err}");
    }
    for directory in ["..", "outdir", "/"] {
        let err = call("file-glob", "search", json!({"directory": directory}), &c).await.expect_err(directory);
        assert!(matches!(err, ActionError::PathNotAllowed { ref path, .. } if path == directory), "{directory}: {err}");
    }
}

#[tokio::test]
async fn project_detect_reads_markers_and_dependencies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    for (path, text) in [
        ("Cargo.toml", "[package]\nname = \"x\"\n\n[dependencies]\naxum = \"0.8\"\nserde = \"1\"\n"),
        ("package.json", r#"{"dependencies": {"react": "19"}, "devDependencies": {"typescript": "5", "vite": "6"}}"#),
        ("yarn.lock", ""),
        ("Dockerfile", "FROM scratch\n"),
        ("api/App.csproj", "<Project Sdk=\"Microsoft.NET.Sdk.Web\"></Project>\n"),
        ("node_modules/dep/go.mod", "module x\n"),
        (".git/HEAD", "ref: refs/heads/main\n"),
    ] {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    let out = call("project-detect", "analyze", Value::Null, &ctx(root, &[])).await.expect("analyze");
    assert_eq!(
        out,
        json!({
            "directory": ".",
            "languages": ["Rust", "JavaScript", "TypeScript", "C#"],
            "frameworks": ["Axum", "React", "ASP.NET Core"],
            "build_tools": ["Cargo", "Docker", "Vite", "Yarn", ".NET"],
            "markers": ["Cargo.toml", "Dockerfile", "package.json", "yarn.lock", "api/App.csproj"],
        })
    );
}

#[tokio::test]
async fn project_detect_python_empty_and_bad_directories() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("py")).expect("mkdir");
    std::fs::create_dir_all(root.join("empty")).expect("mkdir");
    std::fs::write(root.join("py/pyproject.toml"), "[tool.poetry]\nname = \"x\"\n[tool.poetry.dependencies]\nfastapi = \"*\"\n")
        .expect("write");
    std::fs::write(root.join("py/package.json"), "{}").expect("write");
    let c = ctx(root, &[]);
    let out = call("project-detect", "analyze", json!({"directory": "py"}), &c).await.expect("analyze");
    assert_eq!(out["languages"], json!(["JavaScript", "Python"]));
    assert_eq!(out["frameworks"], json!(["FastAPI"]));
    assert_eq!(out["build_tools"], json!(["Poetry", "npm"]), "package.json without a lock file means npm");
    let out = call("project-detect", "analyze", json!({"directory": "empty"}), &c).await.expect("analyze");
    assert_eq!(out, json!({"directory": "empty", "languages": [], "frameworks": [], "build_tools": [], "markers": []}));
    let err = call("project-detect", "analyze", json!({"directory": ".."}), &c).await.expect_err("outside");
    assert!(matches!(err, ActionError::PathNotAllowed { .. }), "{err}");
    let err = call("project-detect", "analyze", json!({"directory": "missing"}), &c).await.expect_err("missing");
    assert_eq!(err.to_string(), "project-detect.analyze failed: \"missing\" is not a directory");
}

#[tokio::test]
async fn shell_allowed_commands_really_run_and_quoted_separators_are_arguments() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("marker.txt"), "marked\n").expect("write");
    let c = ctx(dir.path(), &["echo *", "tr *", "cat *", "printf hello*", "sh -c *"]);
    let out = call("shell-exec", "run", json!({"command": "echo hello | tr a-z A-Z"}), &c).await.expect("pipe");
    assert_eq!(out["stdout"], json!("HELLO\n"));
    let out = call("shell-exec", "run", json!({"command": "cat marker.txt && echo done"}), &c).await.expect("and");
    assert_eq!(out["stdout"], json!("marked\ndone\n"));
    let out = call("shell-exec", "run", json!({"command": "printf hello-world"}), &c).await.expect("multi-word prefix");
    assert_eq!(out["stdout"], json!("hello-world"));
    // A quoted separator is an argument: `sh` runs one command, and so does the check.
    let out = call("shell-exec", "run", json!({"command": "echo \"a;b\" 'x|y'"}), &c).await.expect("quoted");
    assert_eq!(out["stdout"], json!("a;b x|y\n"));
    let out = call("shell-exec", "run", json!({"command": "sh -c 'for i in 1 2; do echo $i; done'"}), &c).await.expect("a loop");
    assert_eq!(out["stdout"], json!("1\n2\n"));
    for (command, refused) in
        [("printf bye", "printf bye"), ("echo 'a'; touch pwned", "touch pwned"), ("echo 'open; touch pwned", "echo 'open; touch pwned")]
    {
        let err = call("shell-exec", "run", json!({"command": command}), &c).await.expect_err(command);
        assert!(matches!(err, ActionError::CommandNotAllowed { command: ref cmd, .. } if cmd == refused), "{command:?}: {err}");
    }
    assert!(!dir.path().join("pwned").exists());
}

#[tokio::test]
async fn shell_injection_corpus_never_runs_the_payload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &["ls", "echo"]);
    for command in [
        "ls;touch pwned",
        "ls || touch pwned",
        "false & touch pwned",
        "ls & touch pwned",
        "ls |& touch pwned",
        "echo $((1)); touch pwned",
        "echo ${IFS}$(touch pwned)",
        "echo `touch pwned`",
        "ls\rtouch pwned",
        "ls${IFS};touch${IFS}pwned",
        "echo ok > x; touch pwned",
        "echo \"x;touch pwned\"",
        "ls 2>&1&touch pwned",
        "cat <(touch pwned)",
        "/usr/bin/touch pwned",
        "env touch pwned",
        "sh -c 'touch pwned'",
    ] {
        let err = call("shell-exec", "run", json!({"command": command}), &c).await.expect_err(command);
        assert!(matches!(err, ActionError::CommandNotAllowed { .. }), "{command:?}: {err}");
    }
    assert!(!dir.path().join("pwned").exists() && !dir.path().join("x").exists());
}

/// An HTTP/1.1 server on 127.0.0.1 that answers each request with `respond(path)`, as raw bytes.
async fn http_server(respond: fn(&str) -> Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("/");
                let _ = stream.write_all(&respond(path)).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

fn http_response(status: &str, content_type: &str, body: &str) -> Vec<u8> {
    format!("HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
        .into_bytes()
}

const PAGE: &str = "<html><head><title>Greeting</title><script>alert('x')</script></head>\
                    <body><h1>Hello</h1><p>world &amp; friends</p></body></html>";

fn site(path: &str) -> Vec<u8> {
    match path {
        "/page" => http_response("200 OK", "text/html; charset=utf-8", PAGE),
        "/plain" => http_response("200 OK", "text/plain", "Hello, plain world"),
        "/old" => b"HTTP/1.1 302 Found\r\nlocation: /page\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec(),
        "/image" => http_response("200 OK", "image/png", "PNG"),
        _ => http_response("404 Not Found", "text/plain", "nope"),
    }
}

#[tokio::test]
async fn web_fetch_returns_text_follows_redirects_and_cuts_at_max_length() {
    let base = http_server(site).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    let page = call("web-fetch", "fetch", json!({"url": format!("{base}/page")}), &c).await.expect("page");
    assert_eq!(
        page,
        json!({
            "url": format!("{base}/page"),
            "status": 200,
            "content_type": "text/html; charset=utf-8",
            "content": "Greeting\nHello\nworld & friends",
            "truncated": false,
        })
    );
    let moved = call("web-fetch", "fetch", json!({"url": format!("{base}/old")}), &c).await.expect("redirect");
    assert_eq!(moved["url"], json!(format!("{base}/page")));
    assert_eq!(moved["content"], page["content"]);
    let cut = call("web-fetch", "fetch", json!({"url": format!("{base}/plain"), "max_length": 5}), &c).await.expect("plain");
    assert_eq!((&cut["content"], &cut["truncated"]), (&json!("Hello"), &json!(true)));
}

#[tokio::test]
async fn web_fetch_errors_name_the_url_and_the_problem() {
    let base = http_server(site).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    let err = call("web-fetch", "fetch", json!({"url": format!("{base}/missing")}), &c).await.expect_err("404");
    assert_eq!(err.to_string(), format!("web-fetch.fetch failed: \"{base}/missing\" answered HTTP 404 Not Found"));
    let err = call("web-fetch", "fetch", json!({"url": format!("{base}/image")}), &c).await.expect_err("not text");
    assert!(err.to_string().contains("is \"image/png\", not text"), "{err}");

    // A port nobody listens on: connection refused.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let err = call("web-fetch", "fetch", json!({"url": format!("http://{addr}/")}), &c).await.expect_err("refused");
    assert!(matches!(err, ActionError::Failed { .. }) && err.to_string().contains(&format!("cannot fetch \"http://{addr}/\"")), "{err}");
}

#[tokio::test]
async fn web_fetch_stops_reading_an_endless_body_at_the_cap() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n";
                if stream.write_all(head).await.is_err() {
                    return;
                }
                let chunk = vec![b'a'; 64 * 1024];
                while stream.write_all(&chunk).await.is_ok() {}
            });
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let out = call("web-fetch", "fetch", json!({"url": format!("http://{addr}/"), "max_length": 1000}), &ctx(dir.path(), &[]))
        .await
        .expect("capped, not endless");
    assert_eq!(out["truncated"], json!(true));
    assert_eq!(out["content"].as_str().map(str::len), Some(1000));
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn web_fetch_is_cancelled_while_a_server_never_answers() {
    // Bound but never accepting: the connection completes in the kernel and nobody replies.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = silent.local_addr().expect("addr");
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    let cancel = c.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let err = call("web-fetch", "fetch", json!({"url": format!("http://{addr}/")}), &c).await.expect_err("cancelled");
    assert_eq!(err, ActionError::Cancelled { action: "web-fetch.fetch".to_owned() });
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    drop(silent);
}

/// Found in review: inputs whose cost grew without bound. Each must end quickly with a clear
/// error (a regression here hangs or aborts the test process).
#[tokio::test]
async fn hostile_sizes_are_refused_not_computed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = ctx(dir.path(), &[]);
    // 2^40 brace expansions of the same name.
    let pattern = "{a,a}".repeat(40);
    let err = call("file-glob", "search", json!({ "pattern": pattern }), &c).await.expect_err("refused");
    assert!(err.to_string().contains("alternatives"), "{err}");
    let err = call("file-glob", "search", json!({ "pattern": "{".repeat(100_000) }), &c).await.expect_err("refused");
    assert!(err.to_string().contains("longer than"), "{err}");

    // Replace-all whose result would be gigabytes.
    std::fs::write(dir.path().join("a.txt"), "a".repeat(1024 * 1024)).expect("write");
    let err =
        call("file-edit", "search-replace", json!({"path": "a.txt", "search": "a", "replace": "x".repeat(1024), "occurrence": 0}), &c)
            .await
            .expect_err("refused");
    assert!(err.to_string().contains("larger than"), "{err}");
    assert_eq!(std::fs::metadata(dir.path().join("a.txt")).expect("still there").len(), 1024 * 1024, "file untouched");
}

#[tokio::test]
async fn web_fetch_does_not_follow_a_redirect_to_plain_http() {
    let base = http_server(|_| {
        b"HTTP/1.1 302 Found\r\nlocation: http://example.invalid/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let err = call("web-fetch", "fetch", json!({ "url": format!("{base}/start") }), &ctx(dir.path(), &[])).await.expect_err("refused");
    assert!(err.to_string().contains("redirect to http://example.invalid/ refused"), "{err}");
}

#[tokio::test]
async fn web_fetch_turns_a_page_of_ampersands_into_text_quickly() {
    let base = http_server(|_| {
        let body = "&".repeat(2 * 1024 * 1024);
        format!("HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
            .into_bytes()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    // Quadratic decoding (the bug) would not finish within the test run.
    let page = call("web-fetch", "fetch", json!({ "url": format!("{base}/amp") }), &ctx(dir.path(), &[])).await.expect("fetched");
    assert!(page.to_string().contains("&&&"), "entities left as text");
}
