//! `lamplighter config validate|show`: the reference config, and broken configs that must each
//! exit 2 with every error and its location, never a panic.

use crate::support::{repo_root, run_cli};

#[test]
fn a_seed_shaped_config_validates() {
    let tmp = tempfile::tempdir().unwrap();
    // The seed's own directory is checked by the `seed` test target (an explicit CI step).
    let reference = repo_root().join("tests/fixtures/seed-shaped/gantri.yaml");
    // Without its keys, what needs them is an error (a worker would run with it disabled).
    let (code, out, err) = run_cli(&["config", "validate", "--config", reference.to_str().unwrap()], tmp.path());
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains("error: job \"morning-digest-7am\" runs workflow \"morning-digest\": step \"gather-and-write\" needs agent \"digest-writer\", which is disabled: its provider \"azure-openai\" is disabled: ${AZURE_OPENAI_API_KEY} is not set"),
        "{err}"
    );
    // With them set, it validates.
    let out = std::process::Command::new(crate::support::bin())
        .args(["config", "validate", "--config", reference.to_str().unwrap()])
        .current_dir(tmp.path())
        .env("AZURE_OPENAI_API_KEY", "k")
        .env("BRAVE_API_KEY", "k")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("1 jobs, 7 agents, 3 workflows"), "{stdout}");
    assert!(stderr.contains("section \"dataverse\""), "{stderr}");
    let (code, out, _) = run_cli(&["config", "show", "--config", reference.to_str().unwrap()], tmp.path());
    assert_eq!(code, 0);
    assert!(out.contains("morning-digest-7am:"));
}

#[test]
fn quickstart_config_validates() {
    let (code, out, err) = run_cli(&["config", "validate", "--config", "deploy/quickstart/lamplighter.yaml"], &repo_root());
    assert_eq!(code, 0, "{out}{err}");
}

/// A folder of `plugins.dirs` that does not exist is told, located, as the seed's validate
/// checks it; a warning, since a worker runs without it (what needs one of its plugins is an
/// error of its own).
#[test]
fn a_missing_plugin_directory_and_a_loose_command_pattern_are_told() {
    let tmp = tempfile::tempdir().unwrap();
    let text = "plugins:\n  dirs: [./nope]\nscheduling:\n  jobs:\n    a:\n      every: 1h\n      plugin: shell-exec\n      action: run\n      allowed_commands: [git, \"date *\"]\n";
    std::fs::write(tmp.path().join("lamplighter.yaml"), text).unwrap();
    let (code, out, err) = run_cli(&["config", "validate", "--config", "lamplighter.yaml"], tmp.path());
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("lamplighter.yaml:2:3: warning: plugin directory ") && err.contains("nope does not exist"), "{err}");
    // A one-word pattern once allowed any arguments; the seed's exact rule is told.
    assert!(err.contains("lamplighter.yaml:9:7: warning: allowed_commands pattern \"git\" allows only the bare command \"git\""), "{err}");
    assert!(out.contains("2 warnings"), "{out}");
}

/// Each fixture lists the errors it must produce in `# expect:` lines.
#[test]
fn broken_configs_exit_2_with_every_error_located() {
    let dir = repo_root().join("tests/fixtures/broken");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let expected: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# expect: ")).collect();
        assert!(!expected.is_empty(), "{} has no `# expect:` lines", path.display());
        let tmp = tempfile::tempdir().unwrap();
        let (code, out, err) = run_cli(&["config", "validate", "--config", path.to_str().unwrap()], tmp.path());
        let name = path.file_name().unwrap().to_string_lossy();
        assert_eq!(code, 2, "{name}: expected exit 2\nstdout: {out}\nstderr: {err}");
        assert!(!err.contains("panicked"), "{name} panicked:\n{err}");
        for e in &expected {
            let want = format!("{name}:{e}");
            assert!(err.lines().any(|l| l.contains(&want)), "{name}: missing `{want}` in:\n{err}");
        }
        let n_errors = err.lines().filter(|l| l.contains(": error: ")).count();
        assert_eq!(n_errors, expected.len(), "{name}: error count differs:\n{err}");
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} fixtures");
}
