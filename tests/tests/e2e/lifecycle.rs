//! The worker's life: firing on time, restarts, reload, drain, crash recovery.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::{Worker, http_get, poll, query_runs, run_cli};

const EVERY_SECOND: &str =
    "tick:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  cron: \"* * * * * *\"\n  parameters: {command: \"echo tick\"}\n";

#[test]
fn a_job_fires_on_time_and_health_endpoints_answer() {
    let mut w = Worker::new(EVERY_SECOND);
    w.start();
    assert_eq!(http_get(w.port, "/healthz").map(|r| r.0), Some(200));
    let runs =
        w.wait_for("three succeeded cron runs", Duration::from_secs(10), |r| r.iter().filter(|r| r.status == "succeeded").count() >= 3);
    for r in runs.iter().filter(|r| r.status == "succeeded") {
        assert_eq!(r.trigger, "cron");
        let late = r.lateness_ms.unwrap();
        // Generous for a loaded 2-core CI machine; the benchmark measures the real figure.
        assert!((0..500).contains(&late), "run started {late} ms after its tick: {r:?}");
        assert_eq!(r.scheduled_at.unwrap() % 1000, 0, "ticks are whole seconds");
    }
}

#[test]
fn the_worker_writes_its_internal_events_for_each_tick_and_each_batch_of_ends() {
    use lamplighter_jobs::events::InternalEvent;
    let mut w = Worker::new(EVERY_SECOND);
    let file = w.dir.path().join("events.jsonl");
    w.args = vec!["--internal-events".into(), file.display().to_string()];
    w.start();
    w.wait_for("two succeeded cron runs", Duration::from_secs(10), |r| r.iter().filter(|r| r.status == "succeeded").count() >= 2);
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(15)), Some(0));
    let runs = w.runs();
    let text = std::fs::read_to_string(&file).expect("the events file");
    let events = crate::support::internal_events(&text);
    // Every tick that made a run was a burst of one, committed, its transaction's parts told.
    let mut bursts: Vec<i64> = events
        .iter()
        .filter_map(|e| match e {
            InternalEvent::TickBurst { ticks: 1, tick_ms, committed_us: Some(_), transaction: Some(tx), .. } if tx.total_us > 0 => {
                Some(*tick_ms)
            }
            _ => None,
        })
        .collect();
    bursts.sort_unstable();
    let mut ticks: Vec<i64> = runs.iter().filter_map(|r| r.scheduled_at).collect();
    ticks.sort_unstable();
    assert_eq!(bursts, ticks, "one burst per tick that made a run:\n{text}");
    // Every run that ended was in one batch of ends recorded.
    let ended: usize = events.iter().map(|e| if let InternalEvent::EndsRecorded { runs, .. } = e { *runs } else { 0 }).sum();
    let finished = runs.iter().filter(|r| !["queued", "running", "skipped"].contains(&r.status.as_str())).count();
    assert_eq!(ended, finished, "each end recorded once, as the database has them:\n{text}");
}

#[test]
fn an_internal_events_file_that_cannot_be_written_stops_the_start_and_says_where() {
    let w = Worker::new(EVERY_SECOND);
    let config = w.config_path();
    let (code, _, err) =
        run_cli(&["run", "--config", config.to_str().expect("utf-8 path"), "--internal-events", "/no/such/dir/events.jsonl"], w.dir.path());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot write internal events to /no/such/dir/events.jsonl"), "{err}");
}

#[test]
fn a_restart_does_not_fire_a_tick_twice() {
    let mut w = Worker::new(EVERY_SECOND);
    for i in 0..3 {
        let before = if i == 0 { 0 } else { w.runs().iter().filter(|r| r.status == "succeeded").count() };
        w.start();
        // Stopped once this start has run a tick of its own, not after a guessed while.
        w.wait_for("a tick run by this start", Duration::from_secs(10), |r| r.iter().filter(|r| r.status == "succeeded").count() > before);
        w.signal("TERM");
        assert_eq!(w.wait_exit(Duration::from_secs(15)), Some(0));
    }
    let runs = w.runs();
    let ticks: Vec<i64> = runs.iter().filter(|r| r.trigger != "retry").filter_map(|r| r.scheduled_at).collect();
    let unique: HashSet<i64> = ticks.iter().copied().collect();
    assert!(ticks.len() >= 3, "expected runs from each start: {runs:#?}");
    assert_eq!(ticks.len(), unique.len(), "a tick fired twice: {runs:#?}");
}

#[test]
fn sighup_adds_and_removes_jobs() {
    let mut w = Worker::new(EVERY_SECOND);
    w.start();
    w.wait_for("first job runs", Duration::from_secs(10), |r| r.iter().any(|r| r.job == "tick"));
    w.write_jobs("tock:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  every: 1s\n  parameters: {command: \"echo tock\"}\n");
    w.signal("HUP");
    w.wait_for("the added job runs", Duration::from_secs(10), |r| r.iter().any(|r| r.job == "tock" && r.status == "succeeded"));
    let runs = w.runs();
    let ticks_then = runs.iter().filter(|r| r.job == "tick").count();
    let tocks_then = runs.iter().filter(|r| r.job == "tock" && r.status == "succeeded").count();
    // Three more seconds of the kept job: a removed per-second job would have fired meanwhile.
    let runs = w.wait_for("three more runs of the kept job", Duration::from_secs(10), |r| {
        r.iter().filter(|r| r.job == "tock" && r.status == "succeeded").count() >= tocks_then + 3
    });
    let ticks_now = runs.iter().filter(|r| r.job == "tick").count();
    assert!(ticks_now <= ticks_then + 1, "the removed job kept firing: {ticks_then} → {ticks_now}");

    // An invalid config is rejected and the running one is kept.
    std::fs::write(w.config_path(), "scheduling:\n  jobs:\n    bad:\n      cron: \"every day\"\n").unwrap();
    w.signal("HUP");
    let before = w.runs().iter().filter(|r| r.job == "tock").count();
    w.wait_for("the kept job keeps running", Duration::from_secs(10), |r| r.iter().filter(|r| r.job == "tock").count() >= before + 2);
    assert!(w.log().contains("config reload rejected"), "{}", w.log());
}

#[test]
fn sigterm_drains_running_work() {
    let mut w = Worker::new(
        "slow:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  every: 1h\n  parameters: {command: \"sleep 1; echo done\"}\n",
    );
    // Fire it by hand: a one-shot `at` a moment from now.
    // Built (or found fresh) before the clock starts: a first build takes longer than the lead.
    crate::support::bin();
    let at = (chrono_now_ms() + 1500) / 1000 * 1000 + 1000;
    w.write_jobs(&format!(
        "slow:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  at: \"{}\"\n  parameters: {{command: \"sleep 1; echo done\"}}\n",
        rfc3339(at)
    ));
    w.start();
    w.wait_for("the slow run to start", Duration::from_secs(10), |r| r.iter().any(|r| r.status == "running"));
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(15)), Some(0));
    let runs = w.runs();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0].status, "succeeded", "the running run was drained to completion: {runs:#?}");
}

#[test]
fn runs_past_the_grace_period_are_interrupted_and_picked_up_at_next_start() {
    // Built (or found fresh) before the clock starts: a first build takes longer than the lead.
    crate::support::bin();
    let at = (chrono_now_ms() + 1500) / 1000 * 1000 + 1000;
    let job = |cmd: &str| {
        format!(
            "slow:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  at: \"{}\"\n  parameters: {{command: \"{cmd}\"}}\n",
            rfc3339(at)
        )
    };
    // Slow until the file `quick` exists in the working directory (the data dir).
    let mut w = Worker::new(&job("test -f quick || sleep 30; echo done"));
    w.start();
    w.wait_for("the slow run to start", Duration::from_secs(10), |r| r.iter().any(|r| r.status == "running"));
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
    let runs = w.runs();
    assert_eq!(runs[0].status, "interrupted", "{runs:#?}");
    // Next start: a follow-up attempt with the same parameters runs (quick this time).
    std::fs::write(w.dir.path().join("data/quick"), "").unwrap();
    w.start();
    let runs = w.wait_for("the interrupted run to be retried", Duration::from_secs(10), |r| {
        r.iter().any(|r| r.trigger == "retry" && r.status == "succeeded")
    });
    let retry = runs.iter().find(|r| r.trigger == "retry").unwrap();
    assert_eq!(retry.retry_of.as_deref(), Some(runs[0].id.as_str()));
}

#[test]
fn kill_9_during_a_run_is_recovered_after_restart() {
    // Built (or found fresh) before the clock starts: a first build takes longer than the lead.
    crate::support::bin();
    let at = (chrono_now_ms() + 1500) / 1000 * 1000 + 1000;
    let mut w = Worker::new(&format!(
        "crashy:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  at: \"{}\"\n  parameters: {{command: \"sleep 2\"}}\n",
        rfc3339(at)
    ));
    w.start();
    w.wait_for("the run to start", Duration::from_secs(10), |r| r.iter().any(|r| r.status == "running"));
    w.signal("KILL");
    w.wait_exit(Duration::from_secs(5));
    assert_eq!(w.runs()[0].status, "running", "a killed worker cannot record anything");
    w.start();
    let runs = w.wait_for("the orphaned run to be recovered and retried", Duration::from_secs(15), |r| {
        r.first().is_some_and(|f| f.status == "interrupted") && r.iter().any(|r| r.trigger == "retry" && r.status == "succeeded")
    });
    assert!(runs[0].error.as_deref().unwrap_or_default().contains("stopped while the run was going"), "{runs:#?}");
    assert!(!runs.iter().any(|r| r.status == "running"), "no run stays running: {runs:#?}");
}

#[test]
fn a_second_worker_on_the_same_database_is_refused() {
    let mut a = Worker::new(EVERY_SECOND);
    a.start();
    a.wait_for("the first worker runs", Duration::from_secs(10), |r| !r.is_empty());
    // The same database, but a port of its own: only the database lock can refuse it (it
    // used to pass on "cannot listen", with the lock never reached).
    let text = std::fs::read_to_string(a.config_path()).unwrap();
    let second_port = crate::support::free_port();
    let second = a.dir.path().join("second.yaml");
    std::fs::write(&second, text.replace(&format!("port: {}", a.port), &format!("port: {second_port}"))).unwrap();
    let out = std::process::Command::new(crate::support::bin()).args(["run", "--config"]).arg(&second).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another lamplighter worker is using"), "{err}");
    assert!(!err.contains("cannot listen"), "{err}");
    // The first worker is untouched and keeps firing.
    let n = a.runs().len();
    a.wait_for("the first worker keeps running", Duration::from_secs(10), |r| r.len() >= n + 2);
}

#[test]
fn a_job_whose_plugin_does_not_load_is_disabled_and_the_rest_runs() {
    let mut w = Worker::new(&format!("{EVERY_SECOND}broken:\n  type: plugin\n  plugin: broken-plugin\n  action: run\n  every: 1s\n"));
    let folder = w.dir.path().join("plugins/broken-plugin");
    std::fs::create_dir_all(&folder).unwrap();
    let manifest = r#"{"name": "broken-plugin", "version": "0.1.0", "type": "wasm", "entry": "plugin.wasm",
        "exports": {"actions": [{"name": "run", "parameters": {"type": "object"}}]}}"#;
    std::fs::write(folder.join("manifest.json"), manifest).unwrap();
    std::fs::write(folder.join("plugin.wasm"), b"this is not a wasm module").unwrap();
    let mut text = std::fs::read_to_string(w.config_path()).unwrap();
    text.push_str(&format!("plugins:\n  dirs: [\"{}\"]\n", w.dir.path().join("plugins").display()));
    std::fs::write(w.config_path(), text).unwrap();

    // `config validate` still calls it an error.
    let out =
        std::process::Command::new(crate::support::bin()).args(["config", "validate", "--config"]).arg(w.config_path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("job \"broken\"") && err.contains("could not be loaded"), "{err}");

    // The worker starts, runs the other job, and shows why this one does not run.
    w.start();
    let runs = w.wait_for("the healthy job runs three times", Duration::from_secs(10), |r| {
        r.iter().filter(|r| r.job == "tick" && r.status == "succeeded").count() >= 3
    });
    assert!(!runs.iter().any(|r| r.job == "broken"), "the disabled job ran: {runs:#?}");
    let (code, out, _) = w.ctl(&["-o", "json", "jobs", "show", "broken"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"disabled\"") && out.contains("could not be loaded"), "{out}");
    let (code, out, _) = w.ctl(&["jobs", "list"]);
    assert_eq!(code, 0);
    assert!(out.lines().any(|l| l.contains("broken") && l.contains("unavailable")), "{out}");
    let (code, _, err) = w.ctl(&["jobs", "trigger", "broken"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("job \"broken\" is disabled: plugin \"broken-plugin\" could not be loaded"), "{err}");
    assert!(w.log().contains("job \"broken\" is disabled"), "{}", w.log());
}

fn chrono_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn rfc3339(ms: i64) -> String {
    let secs = ms / 1000;
    let out = std::process::Command::new("date").args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%SZ"]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `lamplighter backup FILE` copies the live database while runs are being recorded; a new
/// worker started on the copy opens it, keeps its history, and fires no tick twice.
#[test]
fn a_backup_taken_during_runs_restores_into_a_worker_that_keeps_its_history() {
    let mut w = Worker::new(
        "tick:\n  type: plugin\n  plugin: file-save\n  action: save\n  cron: \"* * * * * *\"\n  parameters: {path: t.txt, content: t}",
    );
    w.start();
    w.wait_for("a few ticks", Duration::from_secs(15), |r| r.iter().filter(|r| r.status == "succeeded").count() >= 3);
    let copy = w.dir.path().join("backup.db");
    let (code, out, err) = run_cli(&["backup", copy.to_str().unwrap(), "--config", w.config_path().to_str().unwrap()], w.dir.path());
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with(&format!("backed up to {}", copy.display())), "{out}");
    let (code, _, err) = run_cli(&["backup", copy.to_str().unwrap(), "--config", w.config_path().to_str().unwrap()], w.dir.path());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("exists; back up into a new file"), "{err}");
    let backed_up = query_runs(&copy).expect("the copy reads");
    assert!(backed_up.len() >= 3, "{backed_up:#?}");
    w.signal("TERM");
    w.wait_exit(Duration::from_secs(10));

    // Restored: a new worker on the copy.
    let mut restored = Worker::new("");
    let text = format!(
        "framework:\n  data_dir: {}\nworker:\n  mcp:\n    port: {}\nscheduling:\n  storage:\n    provider: sqlite\n    connection_string: {}\n  jobs:\n    tick:\n      type: plugin\n      plugin: file-save\n      action: save\n      cron: \"* * * * * *\"\n      parameters: {{path: t.txt, content: t}}\n",
        restored.dir.path().join("data").display(),
        restored.port,
        copy.display()
    );
    std::fs::write(restored.config_path(), text).unwrap();
    restored.start();
    let runs = poll(
        "the restored worker to fire",
        Duration::from_secs(15),
        || query_runs(&copy).ok().filter(|r| r.len() >= backed_up.len() + 2),
        || restored.log(),
    );
    for old in &backed_up {
        assert!(runs.iter().any(|r| r.id == old.id), "run {} kept", old.id);
    }
    let mut ticks: Vec<i64> = runs.iter().filter(|r| r.retry_of.is_none()).filter_map(|r| r.scheduled_at).collect();
    let all = ticks.len();
    ticks.sort_unstable();
    ticks.dedup();
    assert_eq!(ticks.len(), all, "no tick twice: {runs:#?}");
}

/// `jobs trigger --wait` follows a run through its retries to the final outcome: the first
/// attempt fails with a retry scheduled, which is printed and followed; the exit code is the
/// last attempt's.
#[test]
fn trigger_wait_follows_the_retries_to_the_final_outcome() {
    let mut w = Worker::new(
        "flaky:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {command: \"test -f tried || { touch tried; exit 3; }\"}\n  retries: {max: 2, backoff: fixed, initial: 1s}",
    );
    w.start();
    let (code, out, err) = w.ctl(&["jobs", "trigger", "flaky", "--wait"]);
    assert_eq!(code, 0, "the retry succeeded: {out}\n{err}\n{}", w.log());
    assert!(err.contains("attempt 1 failed; a retry is scheduled: following run "), "{err}");
    assert!(err.contains("(attempt 2)") && err.contains("succeeded after"), "{err}");
    // Every attempt failing: the last one's end is the exit code (4, failed).
    let mut w2 = Worker::new(
        "broken:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {command: \"exit 3\"}\n  retries: {max: 1, backoff: fixed, initial: 1s}",
    );
    w2.start();
    let (code, _, err) = w2.ctl(&["jobs", "trigger", "broken", "--wait"]);
    assert_eq!(code, 4, "{err}");
    assert_eq!(err.matches("a retry is scheduled").count(), 1, "{err}");
}
