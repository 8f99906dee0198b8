//! What a package of the two binaries ships besides them: `--version` with the git revision,
//! shell completions and manual pages, generated from the same clap definitions the binaries
//! parse with (so they cannot drift from the commands).

use std::path::PathBuf;
use std::process::Command;

use crate::support::{bin, ctl_bin, repo_root};

fn output(program: &PathBuf, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{} {args:?}: {}", program.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn both_binaries_print_the_revision_they_were_built_from() {
    let git = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(repo_root()).output().unwrap();
    // Built from a checkout (as CI builds), the revision is HEAD's; LAMPLIGHTER_GIT_REV wins.
    let rev = std::env::var("LAMPLIGHTER_GIT_REV")
        .ok()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| String::from_utf8_lossy(&git.stdout).trim().to_owned());
    assert!(!rev.is_empty(), "not a git checkout: {}", String::from_utf8_lossy(&git.stderr));
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(output(&bin(), &["--version"]), format!("lamplighter {version} (rev {rev})\n"));
    assert_eq!(output(&ctl_bin(), &["--version"]), format!("lampctl {version} (rev {rev})\n"));
}

#[test]
fn completion_scripts_know_every_command() {
    for (program, name, words) in [
        (bin(), "lamplighter", &["run", "validate", "migrate", "config", "log-format"][..]),
        (ctl_bin(), "lampctl", &["jobs", "trigger", "follow", "approve", "output", "url"][..]),
    ] {
        for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
            let script = output(&program, &["completions", shell]);
            for word in words {
                assert!(script.contains(word), "{name}'s {shell} completions lack {word}");
            }
        }
        // The bash script at least parses.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        std::fs::write(&file, output(&program, &["completions", "bash"])).unwrap();
        let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
        assert!(check.status.success(), "{name}'s bash completions: {}", String::from_utf8_lossy(&check.stderr));
    }
    let bad = Command::new(ctl_bin()).args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2), "an unknown shell is a usage error");
}

#[test]
fn manual_pages_cover_every_command() {
    let dir = tempfile::tempdir().unwrap();
    for (program, pages) in [
        (bin(), &["lamplighter.1", "lamplighter-run.1", "lamplighter-config-validate.1", "lamplighter-migrate.1"][..]),
        (ctl_bin(), &["lampctl.1", "lampctl-jobs-trigger.1", "lampctl-runs-follow.1", "lampctl-approvals-approve.1"][..]),
    ] {
        output(&program, &["man", "--dir", dir.path().to_str().unwrap()]);
        for page in pages {
            let text = std::fs::read_to_string(dir.path().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
            assert!(text.contains(".TH ") && text.contains(".SH SYNOPSIS"), "{page} is not a manual page:\n{text}");
        }
        // On standard output: the top page.
        assert!(output(&program, &["man"]).contains(".SH SUBCOMMANDS"));
    }
    let trigger = std::fs::read_to_string(dir.path().join("lampctl-jobs-trigger.1")).unwrap();
    assert!(trigger.contains("wait"), "lampctl jobs trigger's page does not mention --wait:\n{trigger}");
}
