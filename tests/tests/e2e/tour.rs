//! The README's quickstart and guided tour, run as a newcomer would: the worker command and the
//! config it names, then every `lampctl` command of the tour, in order, as the README writes
//! them (`cargo run -p lamplighter-ctl -- ARGS` runs the built `lampctl` with ARGS). A command
//! renamed, an option dropped or a step of the quickstart's workflow broken fails here.

use std::process::Command;
use std::time::Duration;

use lamplighter_tests::proc::{KillOnDrop, READY_LINE, spawn_until};

use crate::support::{bin, ctl_bin, free_port, http_get, repo_root};

/// The indented command lines of the README section headed `heading`.
fn commands_under(readme: &str, heading: &str, prefix: &str) -> Vec<String> {
    let section = readme.split("\n## ").find(|s| s.starts_with(heading)).unwrap_or_else(|| panic!("no section {heading:?} in the README"));
    section.lines().filter_map(|l| l.strip_prefix("    ")).filter(|l| l.starts_with(prefix)).map(str::to_owned).collect()
}

/// Splits a command line as a POSIX shell would for these simple cases (double quotes only).
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    assert!(!quoted, "unbalanced quotes in {line:?}");
    if any {
        out.push(cur);
    }
    out
}

/// A run id (a UUID) in `text`, if there is one.
fn run_id_in(text: &str) -> Option<String> {
    text.split(|c: char| !(c.is_ascii_hexdigit() || c == '-')).find(|w| w.len() == 36 && w.matches('-').count() == 4).map(str::to_owned)
}

#[test]
fn the_readme_quickstart_and_tour_work_as_written() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let quickstart = commands_under(&readme, "Run the quickstart", "cargo run -p lamplighter-worker -- ");
    assert_eq!(quickstart.len(), 1, "{quickstart:?}");
    let worker_args = words(quickstart[0].strip_prefix("cargo run -p lamplighter-worker -- ").unwrap());
    let config_at = worker_args.iter().position(|a| a == "--config").map(|i| worker_args[i + 1].clone()).expect("--config");

    // "From the repository root": a repository of its own here, with the quickstart config at
    // the path the README gives, on a free port.
    let root = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .args(["-c", "user.name=tour", "-c", "user.email=tour@example.invalid"])
            .args(args)
            .current_dir(root.path())
            .output()
            .unwrap();
        assert!(ok.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&ok.stderr));
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "first"]);
    let port = free_port();
    let config = std::fs::read_to_string(repo_root().join(&config_at)).unwrap();
    assert!(config.contains("port: 5100\n"), "the quickstart's port moved; the README says 5100");
    let config_path = root.path().join(&config_at);
    std::fs::create_dir_all(config_path.parent().unwrap()).unwrap();
    std::fs::write(&config_path, &config).unwrap();

    // The config as written, on a free port by `$LAMPLIGHTER_PORT`, as the README says.
    let log = root.path().join("worker.log");
    let mut cmd = Command::new(bin());
    cmd.args(&worker_args)
        .current_dir(root.path())
        .env("RUST_LOG", "info")
        .env("LAMPLIGHTER_PORT", port.to_string())
        .stdout(std::process::Stdio::null());
    let mut worker = KillOnDrop(spawn_until(&mut cmd, &log, READY_LINE, Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e}")));
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200));

    // "Any MCP client works": the README's check with the official Python SDK, as written.
    let check = commands_under(&readme, "Control it", "python3 deploy/clients/check_mcp.py http");
    assert_eq!(check.len(), 1, "{check:?}");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let check_args = words(&check[0]);
    assert_eq!(check_args[2], "http://127.0.0.1:5100/mcp", "{check:?}");
    let out = Command::new(lamplighter_tests::setup::python_mcp())
        .arg(repo_root().join(&check_args[1]))
        .arg(&url)
        .args(&check_args[3..])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "check_mcp.py failed:\n{stdout}{stderr}\nworker log:\n{}", logs());
    assert!(stdout.contains("trigger_job repo-report wait: succeeded"), "{stdout}");
    // The second line, while the quickstart runs: its own worker cannot start beside it, and
    // the script says so in one line instead of the SDK's traceback.
    let stdio = commands_under(&readme, "Control it", "python3 deploy/clients/check_mcp.py stdio");
    assert_eq!(stdio.len(), 1, "{stdio:?}");
    let out = Command::new(lamplighter_tests::setup::python_mcp())
        .arg(repo_root().join("deploy/clients/check_mcp.py"))
        .args(["stdio", config_path.to_str().unwrap()])
        .arg(bin())
        .current_dir(root.path())
        .env("LAMPLIGHTER_PORT", port.to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second worker on the quickstart's database started:\n{stderr}");
    assert!(!stderr.contains("Traceback"), "{stderr}");
    assert!(stderr.contains("check_mcp: the MCP session failed: ") && stderr.contains("the worker it launched said why above"), "{stderr}");

    let tour = commands_under(&readme, "Control it", "cargo run -p lamplighter-ctl -- ");
    assert!(tour.len() >= 8, "the tour lost its commands: {tour:?}");
    let mut run_id: Option<String> = None;
    for line in &tour {
        let mut args = words(line.strip_prefix("cargo run -p lamplighter-ctl -- ").unwrap());
        for a in &mut args {
            if a == "RUN_ID" {
                *a = run_id.clone().unwrap_or_else(|| panic!("{line}: no command before it started a run"));
            }
        }
        let out = Command::new(ctl_bin())
            .args(&args)
            .env("LAMPLIGHTER_URL", format!("http://127.0.0.1:{port}/mcp"))
            .env_remove("LAMPLIGHTER_TOKEN")
            .current_dir(root.path())
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "`{line}` failed ({}):\n{stdout}{stderr}\nworker log:\n{}", out.status, logs());
        assert!(!stdout.trim().is_empty(), "`{line}` printed nothing");
        if args.iter().any(|a| a == "json") {
            assert!(serde_json::from_str::<serde_json::Value>(&stdout).is_ok(), "`{line}` is not JSON:\n{stdout}");
        }
        let starts_a_run = args.windows(2).any(|w| w == ["jobs", "trigger"] || w == ["workflows", "run"]);
        if starts_a_run {
            let id = run_id_in(&stdout).unwrap_or_else(|| panic!("`{line}` printed no run id:\n{stdout}"));
            // A person reads what the command printed before typing the next one; here the
            // run is given the time to get somewhere (to its end, or to a step that waits).
            let url = format!("http://127.0.0.1:{port}/mcp");
            crate::support::poll(
                &format!("run {id} to end or wait"),
                Duration::from_secs(30),
                || {
                    let (_, out, _) = crate::support::ctl_at(&url, None, &["runs", "show", &id, "-o", "json"]);
                    let status = serde_json::from_str::<serde_json::Value>(&out).ok()?["status"].as_str()?.to_owned();
                    (status != "queued" && status != "running").then_some(())
                },
                logs,
            );
            run_id = Some(id);
        }
        // What each step of the tour is there to show.
        if args.ends_with(&["approvals".into(), "list".into()]) {
            assert!(stdout.contains("publish-report"), "the waiting workflow is not listed:\n{stdout}");
            // The question shows the count the step printed, not its whole output as JSON.
            assert!(stdout.contains("Publish the report of 1 commits?"), "the approval's question:\n{stdout}");
        }
        if args.first().map(String::as_str) == Some("runs") && args.get(1).map(String::as_str) == Some("follow") {
            assert!(stdout.contains("succeeded"), "`{line}` did not end in success:\n{stdout}");
        }
    }
    // The approved workflow published the report; the paused job says why.
    let published = std::fs::read_to_string(root.path().join("data/published-report.txt")).unwrap_or_default();
    assert!(published.contains("first"), "the published report: {published:?}\n{}", logs());
    // The scheduled job's output carries its report (not only the file).
    let (code, out, _) =
        crate::support::ctl_at(&format!("http://127.0.0.1:{port}/mcp"), None, &["runs", "list", "--job", "repo-report", "-o", "json"]);
    assert_eq!(code, 0, "{out}");
    let first_id = run_id_in(&out).expect("a run of repo-report");
    let (_, out, _) = crate::support::ctl_at(&format!("http://127.0.0.1:{port}/mcp"), None, &["runs", "show", &first_id, "-o", "json"]);
    let run: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(run["output"]["stdout"].as_str().is_some_and(|s| s.contains("first")), "the run's output shows the report: {run}");
    let (code, out, _) =
        crate::support::ctl_at(&format!("http://127.0.0.1:{port}/mcp"), None, &["jobs", "show", "repo-report", "-o", "json"]);
    assert_eq!(code, 0);
    assert!(out.contains("not tonight"), "{out}");

    assert!(Command::new("kill").args(["-TERM", &worker.0.id().to_string()]).status().unwrap().success());
    assert_eq!(worker.0.wait().unwrap().code(), Some(0), "{}", logs());
}

#[test]
fn the_commands_the_readme_names_exist() {
    // `lamplighter config validate|show|schema` and `migrate`, on the quickstart config.
    let config = repo_root().join("deploy/quickstart/lamplighter.yaml");
    for args in [&["config", "validate"][..], &["config", "show"], &["config", "schema"]] {
        let out = Command::new(bin()).args(args).arg("--config").arg(&config).output().unwrap();
        assert!(out.status.success(), "lamplighter {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(Command::new(ctl_bin()).arg("--help").output().unwrap().status.success());
}
