//! Storage faults on a live SQLite worker: the disk filling up under it (a 20 MB tmpfs), and
//! its database file moved away and replaced underneath. Each time the worker stays up,
//! `/readyz` answers 503 saying what is wrong, nothing committed is lost, and it heals by itself
//! once the fault is gone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{Worker, http_get, poll};

/// A tmpfs of `size` mounted on `at` for the test's life (needs root, as CI has).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(at).output().unwrap();
        assert!(out.status.success(), "cannot mount a {size} tmpfs on {}: {}", at.display(), String::from_utf8_lossy(&out.stderr));
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

const JOBS: &str = r#"
    tick:
      type: plugin
      plugin: shell-exec
      action: run
      cron: "* * * * * *"
      parameters: {command: "echo tick"}
    fill:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      parameters: {command: "head -c 40000000 /dev/zero > filler"}
"#;

fn readyz(w: &Worker) -> (u16, String) {
    http_get(w.port, "/readyz").unwrap_or_else(|| panic!("/readyz does not answer:\n{}", w.log()))
}

/// Waits until `/readyz` answers `code` with a body containing `says`.
fn wait_readyz(w: &Worker, code: u16, says: &str, within: Duration) -> String {
    poll(
        &format!("/readyz to answer {code} with {says:?}"),
        within,
        || Some(readyz(w)).filter(|(c, b)| *c == code && b.contains(says)).map(|(_, b)| b),
        || format!("{:?}\n{}", http_get(w.port, "/readyz"), w.log()),
    )
}

#[test]
fn a_full_disk_or_a_vanished_database_makes_the_worker_not_ready_and_it_heals_by_itself() {
    let mut w = Worker::new("");
    let data = w.dir.path().join("data");
    let _fs = Tmpfs::mount(&data, "20m");
    let config = format!(
        "framework:\n  data_dir: {}\nworker:\n  lease: 2s\n  shutdown_grace: 3s\n  mcp:\n    port: {}\nscheduling:\n  jobs:{JOBS}",
        data.display(),
        w.port
    );
    std::fs::write(w.config_path(), config).unwrap();
    w.start();
    let before = w
        .wait_for("a few ticks", Duration::from_secs(10), |r| r.iter().filter(|r| r.job == "tick" && r.status == "succeeded").count() >= 3);

    // The disk fills up: a job's output takes every byte left.
    let (code, out, err) = w.ctl(&["jobs", "trigger", "fill"]);
    assert_eq!(code, 0, "{out}{err}");
    let body = wait_readyz(&w, 503, "the disk is full", Duration::from_secs(30));
    assert!(body.starts_with("not ready: "), "{body}");
    assert!(w.log().contains("the storage refuses writes"), "{}", w.log());
    assert_eq!(http_get(w.port, "/healthz").map(|(c, _)| c), Some(200), "the worker is up");
    std::fs::remove_file(data.join("filler")).expect("free the space");
    wait_readyz(&w, 200, "ready", Duration::from_secs(30));
    // What was committed before is all there, the run that filled the disk has its end, and
    // ticks go on.
    let healed = w.wait_for("the fill run's end and new ticks", Duration::from_secs(30), |r| {
        r.iter().any(|r| r.job == "fill" && r.status == "failed")
            && r.iter().filter(|r| r.job == "tick" && r.status == "succeeded").count() > before.len() + 3
    });
    for old in &before {
        assert!(healed.iter().any(|r| r.job == old.job && r.scheduled_at == old.scheduled_at && r.status == old.status), "kept: {old:?}");
    }
    let fill = healed.iter().find(|r| r.job == "fill").unwrap();
    assert!(fill.error.as_deref().unwrap_or_default().contains("No space left"), "{fill:?}");

    // The database file moved away underneath: not ready, saying so; back in place: ready.
    let db = w.db();
    let aside = data.join("aside.db");
    std::fs::rename(&db, &aside).unwrap();
    let body = wait_readyz(&w, 503, "is gone", Duration::from_secs(10));
    assert!(body.contains("lamplighter.db"), "{body}");
    // Replaced by another file: still not ready (what it writes would go to the old one).
    std::fs::write(&db, b"").unwrap();
    wait_readyz(&w, 503, "was replaced underneath the worker", Duration::from_secs(10));
    std::fs::rename(&aside, &db).unwrap();
    wait_readyz(&w, 200, "ready", Duration::from_secs(10));
    let after = w.wait_for("ticks after the file came back", Duration::from_secs(10), |r| {
        r.iter().filter(|r| r.job == "tick" && r.status == "succeeded").count() > healed.iter().filter(|r| r.job == "tick").count() + 2
    });
    assert!(after.len() > healed.len());
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
}
