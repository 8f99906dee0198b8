//! Storage faults on a live SQLite worker: the disk filling up under it (a 20 MB tmpfs), its
//! database file moved away and replaced underneath, writes failing with EIO (a preloaded
//! shim), and its file system turned read-only by the kernel (ext4 on a loop device). Each time the worker stays up,
//! `/readyz` answers 503 saying what is wrong, nothing committed is lost, and it heals by itself
//! once the fault is gone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lamplighter_tests::faultfs::{Ext4, FaultSwitch};

use crate::support::{Worker, http_get, now_ms, poll};

/// A tmpfs of `size` mounted on `at` for the test's life (needs root, as CI has).
pub(crate) struct Tmpfs(PathBuf);

impl Tmpfs {
    pub(crate) fn mount(at: &Path, size: &str) -> Tmpfs {
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

const TICKS: &str = r#"
    tick:
      type: plugin
      plugin: shell-exec
      action: run
      cron: "* * * * * *"
      parameters: {command: "echo tick"}
"#;

/// A worker with a per-second job and a 2 s lease (a renewal, a write, every few hundred
/// milliseconds), and its data directory.
fn ticking() -> (Worker, PathBuf) {
    let w = Worker::new("");
    let data = w.dir.path().join("data");
    let config = format!(
        "framework:\n  data_dir: {}\nworker:\n  lease: 2s\n  shutdown_grace: 3s\n  mcp:\n    port: {}\nscheduling:\n  jobs:{TICKS}",
        data.display(),
        w.port
    );
    std::fs::write(w.config_path(), config).unwrap();
    (w, data)
}

fn succeeded_ticks(runs: &[crate::support::RunRow]) -> usize {
    runs.iter().filter(|r| r.job == "tick" && r.status == "succeeded").count()
}

/// Each scheduled instant of the job has at most one run: no tick fired twice across the fault.
fn assert_each_tick_once(runs: &[crate::support::RunRow]) {
    let mut seen = std::collections::HashSet::new();
    for r in runs.iter().filter(|r| matches!(r.trigger.as_str(), "cron" | "catch_up")) {
        assert!(seen.insert((r.job.clone(), r.scheduled_at)), "a tick fired twice: {r:?}\n{runs:#?}");
    }
}

/// Every run seen before the fault is there after it, as it was.
fn assert_kept(before: &[crate::support::RunRow], after: &[crate::support::RunRow]) {
    for old in before.iter().filter(|r| r.status == "succeeded") {
        assert!(after.iter().any(|r| r.id == old.id && r.status == old.status && r.scheduled_at == old.scheduled_at), "lost: {old:?}");
    }
}

/// The disk under the database stops taking writes (every write fails with EIO) and starts
/// again: the worker stays up, `/readyz` names the fault, reads still answer, and once writes go
/// through it is ready by itself, with every run it had and each tick fired once.
#[test]
fn an_io_error_under_the_database_makes_the_worker_not_ready_and_it_heals_when_writes_go_through() {
    let (mut w, data) = ticking();
    let fault = FaultSwitch::new(w.dir.path(), &data);
    w.env = fault.env();
    w.start();
    let before = w.wait_for("a few ticks", Duration::from_secs(10), |r| succeeded_ticks(r) >= 3);

    fault.on();
    let body = wait_readyz(&w, 503, "SQLITE_IOERR", Duration::from_secs(20));
    assert!(body.starts_with("not ready: ") && body.contains("disk I/O error"), "{body}");
    assert!(!fault.failed_writes().is_empty(), "the fault happened: writes under {} failed", data.display());
    assert_eq!(http_get(w.port, "/healthz").map(|(c, _)| c), Some(200), "the worker is up");
    let (code, out, err) = w.ctl(&["runs", "list", "--job", "tick"]);
    assert_eq!(code, 0, "reads still answer: {out}{err}");
    let (code, out, err) = w.ctl(&["jobs", "trigger", "tick"]);
    assert_ne!(code, 0, "a trigger cannot be recorded: {out}{err}");
    assert!(err.contains("disk I/O error"), "the refusal says why: {err}");

    fault.off();
    wait_readyz(&w, 200, "ready", Duration::from_secs(20));
    let healed = w.wait_for("ticks after the disk healed", Duration::from_secs(20), |r| succeeded_ticks(r) >= succeeded_ticks(&before) + 3);
    assert_kept(&before, &healed);
    assert_each_tick_once(&healed);
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
    // Every run that started has its end: results held while the disk failed were written after.
    let last = w.runs();
    assert!(last.iter().all(|r| r.status != "running" && r.status != "queued"), "{last:#?}");
    assert_each_tick_once(&last);
}

/// The kernel finds an error in the file system holding the database and turns it read-only
/// under the running worker (ext4's `errors=remount-ro`): `/readyz` names the fault and reads
/// still answer. The operator stops the worker, repairs the file system and starts it again:
/// every run it had is there, each tick fired once, and it goes on.
#[test]
fn a_file_system_turned_read_only_under_the_worker_loses_nothing_across_the_repair_and_restart() {
    let (mut w, data) = ticking();
    let fs = Ext4::mount(&w.dir.path().join("data.img"), &data, 64);
    w.start();
    let before = w.wait_for("a few ticks", Duration::from_secs(10), |r| succeeded_ticks(r) >= 3);

    fs.fail();
    // The first write to fail is an I/O error; SQLite then finds the file read-only.
    let body = wait_readyz(&w, 503, "the database is read-only (SQLITE_READONLY)", Duration::from_secs(20));
    assert!(body.starts_with("not ready: "), "{body}");
    assert_eq!(http_get(w.port, "/healthz").map(|(c, _)| c), Some(200), "the worker is up");
    let (code, out, err) = w.ctl(&["runs", "list", "--job", "tick"]);
    assert_eq!(code, 0, "reads still answer: {out}{err}");

    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(30)), Some(0), "{}", w.log());
    fs.repair();
    w.start();
    let healed = w.wait_for("ticks after the repair", Duration::from_secs(20), |r| succeeded_ticks(r) >= succeeded_ticks(&before) + 3);
    assert_kept(&before, &healed);
    assert_each_tick_once(&healed);
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
}

/// A worker whose wall clock is this test's: it reads its offset from `offset` on every call
/// (libfaketime), while its monotonic clock is the machine's, as when NTP or a VM resume steps
/// the system clock.
fn faked(jobs: &str, offset: &Path) -> Worker {
    let mut w = Worker::new(jobs);
    w.env = vec![
        ("LD_PRELOAD".into(), crate::support::libfaketime().into()),
        ("FAKETIME_TIMESTAMP_FILE".into(), offset.display().to_string()),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
        ("DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    w
}

/// The system clock stepped forward an hour, then back. Forward: a worker that sleeps until its
/// next hourly tick wakes at once (not at the old wall time), and a per-second job behaves as
/// after an hour's downtime — one run for the newest tick (`catch_up: latest`), no burst.
/// Back: no tick fires twice, and the worker goes on answering.
#[test]
fn the_system_clock_stepped_forward_and_back_an_hour() {
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "+0\n").unwrap();
    let hourly =
        "hourly:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  cron: \"0 * * * *\"\n  parameters: {command: \"echo hour\"}\n";
    let sec = "sec:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  cron: \"* * * * * *\"\n  retention: {max_runs: 10000}\n  parameters: {command: \"echo sec\"}\n";
    // `h` has only the hourly job: its scheduler sleeps until the next hour.
    let (mut h, mut s) = (faked(hourly, &offset), faked(&format!("{sec}{hourly}"), &offset));
    h.start();
    s.start();
    let before = s.wait_for("per-second ticks", Duration::from_secs(10), |r| {
        r.iter().filter(|r| r.job == "sec" && r.status == "succeeded").count() >= 3
    });
    assert!(!before.is_empty());
    let hourly_before = h.runs().len();
    // Read just before the step: ticks between this read and the step are a second or two.
    let last_before = s.runs().iter().filter(|r| r.job == "sec").filter_map(|r| r.scheduled_at).max().unwrap();
    std::fs::write(&offset, "+1h\n").unwrap();
    let stepped = now_ms() + 3_600_000;
    let hr = h.wait_for("the hourly tick passed by the step to fire", Duration::from_secs(10), |r| {
        r.iter().filter(|r| r.job == "hourly").count() > hourly_before
    });
    assert_eq!(hr.iter().filter(|r| r.job == "hourly").count(), hourly_before + 1, "one run for the hour: {hr:?}");
    assert!(h.log().contains("the system clock jumped"), "{}", h.log());
    let runs = s.wait_for("per-second ticks after the step", Duration::from_secs(10), |r| {
        r.iter().filter(|r| r.job == "sec" && r.scheduled_at.is_some_and(|t| t >= stepped)).count() >= 3
    });
    // The hour skipped over is one run at most (latest), not 3,600.
    let skipped: Vec<_> =
        runs.iter().filter(|r| r.job == "sec" && r.scheduled_at.is_some_and(|t| t > last_before + 3000 && t < stepped - 3000)).collect();
    assert!(skipped.is_empty(), "no burst for the hour stepped over (last before {last_before}, stepped {stepped}): {skipped:?}");
    assert_eq!(runs.iter().filter(|r| r.job == "hourly").count(), 1, "one hourly run on s too");
    let last_forward = runs.iter().filter(|r| r.job == "sec").filter_map(|r| r.scheduled_at).max().unwrap();

    std::fs::write(&offset, "+0\n").unwrap();
    poll(
        "the worker to see the step back",
        Duration::from_secs(10),
        || (s.log().matches("the system clock jumped").count() >= 2).then_some(()),
        || s.log(),
    );
    // The loop goes on (a run asked for now runs), and no tick is fired again.
    let (code, out, err) = s.ctl(&["jobs", "trigger", "sec", "--wait", "--timeout", "20"]);
    assert_eq!(code, 0, "{out}{err}");
    let after = s.runs();
    let refired: Vec<_> = after
        .iter()
        .filter(|r| {
            r.job == "sec"
                && r.trigger != "manual"
                && r.scheduled_at.is_some_and(|t| t <= last_forward)
                && !runs.iter().any(|o| o.id == r.id)
        })
        .collect();
    assert!(refired.is_empty(), "ticks fired again after the step back: {refired:?}");
    let mut keys = std::collections::HashSet::new();
    for r in after.iter().filter(|r| r.trigger != "manual") {
        assert!(keys.insert((r.job.clone(), r.scheduled_at)), "a tick ran twice: {r:?}");
    }
    for w in [&h, &s] {
        w.signal("TERM");
    }
    assert_eq!(h.wait_exit(Duration::from_secs(20)), Some(0));
    assert_eq!(s.wait_exit(Duration::from_secs(20)), Some(0));
}
