//! What the tests need from the machine beyond Rust, installed on first use where the machine
//! allows it, so that `cargo test --workspace` alone sets up a fresh machine: Debian's
//! packages as root (CI runs as root). Without root, the error names the package to install.

// Installing packages is this module's job.
#![allow(clippy::disallowed_methods)]

use std::process::Command;

/// One `apt-get` at a time across test processes (and `.ci/deploy-tools.sh`): dpkg has one lock
/// and a second install would fail on it rather than wait.
const LOCK: &str = "/tmp/lamplighter-apt.lock";

/// Whether the tests run as root (as CI does).
pub fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

/// Installs Debian `packages` unless `present()` says they are there already; `why` says what
/// needs them, for the error without root.
pub fn debian_packages(packages: &[&str], why: &str, present: impl Fn() -> bool) {
    if present() {
        return;
    }
    assert!(is_root(), "{why} needs {0}; install it (`sudo apt-get install {0}`) and run the tests again", packages.join(" "));
    let lock = std::fs::File::create(LOCK).unwrap_or_else(|e| panic!("{LOCK}: {e}"));
    lock.lock().unwrap_or_else(|e| panic!("lock {LOCK}: {e}"));
    // Another test may have installed them while this one waited.
    if present() {
        return;
    }
    for args in [&["update", "-qq"][..], &[&["install", "-y", "-qq", "--no-install-recommends"][..], packages].concat()] {
        let out = Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive").output();
        let out = out.unwrap_or_else(|e| panic!("{why}: cannot run apt-get to install {}: {e}", packages.join(" ")));
        assert!(out.status.success(), "{why}: apt-get {} failed:\n{}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    assert!(present(), "{why}: installed {}, but still not found", packages.join(" "));
}

/// The python of a venv with the official Python MCP SDK (`.ci/python-mcp.sh`, once per
/// machine and test process).
pub fn python_mcp() -> std::path::PathBuf {
    static PYTHON: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| script_output("python-mcp.sh")).clone()
}

/// The path `.ci/SCRIPT` prints after installing what it installs (once per machine).
fn script_output(script: &str) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci").join(script);
    let out = Command::new("bash").arg(&path).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(out.status.success(), ".ci/{script} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The python of a venv with the iCalendar oracle's libraries (`icalendar`,
/// `recurring-ical-events`, `croniter`: `.ci/python-ics.sh`, once per machine and test process).
pub fn python_ics() -> std::path::PathBuf {
    static PYTHON: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| script_output("python-ics.sh")).clone()
}

/// The folder `.ci/oidc.sh` installed the OpenID provider (npm `oidc-provider`) and its Node
/// into, once per machine and test process: `<dir>/node tests/clients/oidc_provider.mjs
/// --modules <dir>` starts it.
pub fn oidc_provider() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| script_output("oidc.sh")).clone()
}
