//! The git revision the binaries were built from, for `--version`: `LAMPLIGHTER_GIT_REV` when
//! set (a container build, whose context has no `.git`), else `git rev-parse` of the checkout,
//! else `unknown`. Rebuilds when HEAD moves, not at every change to the work tree.
// A build script runs git itself; the rule that processes go through the plugin layer is for
// the worker at run time.
#![allow(clippy::disallowed_methods)]

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=LAMPLIGHTER_GIT_REV");
    let rev = match std::env::var("LAMPLIGHTER_GIT_REV").ok().map(|r| r.trim().to_owned()).filter(|r| !r.is_empty()) {
        Some(rev) => rev,
        None => {
            // Only files that exist: cargo reruns a script at every build for a watched path
            // that does not. `--git-path` finds each where git keeps it (a worktree's refs are
            // in the common directory); `logs/HEAD` moves with every commit and checkout, even
            // when the branch's ref is packed.
            let mut watched = vec!["HEAD".to_owned(), "logs/HEAD".to_owned(), "packed-refs".to_owned()];
            watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
            let here = std::env::current_dir().unwrap_or_default();
            for name in watched {
                if let Some(path) = git(&["rev-parse", "--git-path", &name]).map(|p| here.join(p))
                    && path.exists()
                {
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    // One token: it ends up in `--version` and in the MCP server's version.
    let rev: String = rev.chars().filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c)).take(40).collect();
    println!("cargo:rustc-env=LAMPLIGHTER_REV={}", if rev.is_empty() { "unknown" } else { &rev });
}
