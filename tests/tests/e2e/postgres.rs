//! Several workers on one PostgreSQL database (a throwaway cluster), as real processes: every
//! tick of a per-second job fires once in total over two minutes; pause, cancel, approval and
//! `trigger --wait` go through one worker and take effect on another; a worker killed with
//! SIGKILL has its runs finished by the others; a database restart under load loses nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use lamplighter_tests::pg::Cluster;
use serde_json::Value;
use sqlx::Row;

use crate::support::{Worker, http_get, internal_events, now_ms, poll};

/// A blocking view of the shared database, for checks.
struct Db {
    rt: tokio::runtime::Runtime,
    pool: sqlx::PgPool,
}

#[derive(Debug, Clone)]
struct Run {
    id: String,
    job: String,
    trigger: String,
    status: String,
    scheduled_at: Option<i64>,
    worker: Option<String>,
    retry_of: Option<String>,
}

impl Db {
    fn new(cluster: &Cluster, db: &str) -> Db {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let admin = rt.block_on(sqlx::PgPool::connect(&cluster.url())).unwrap();
        rt.block_on(sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}"))).execute(&admin)).unwrap();
        rt.block_on(admin.close());
        let pool = {
            let _in = rt.enter();
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(2))
                .connect_lazy(&cluster.url_of(db))
                .unwrap()
        };
        Db { rt, pool }
    }

    /// Every run, or why they could not be read (the server is down, the tables are not there yet).
    fn try_runs(&self) -> Result<Vec<Run>, sqlx::Error> {
        let rows = self.rt.block_on(
            sqlx::query("SELECT id, job, trigger, status, scheduled_at, worker, retry_of FROM ll_runs ORDER BY id").fetch_all(&self.pool),
        )?;
        rows.iter()
            .map(|r| {
                Ok(Run {
                    id: r.try_get("id")?,
                    job: r.try_get("job")?,
                    trigger: r.try_get("trigger")?,
                    status: r.try_get("status")?,
                    scheduled_at: r.try_get("scheduled_at")?,
                    worker: r.try_get("worker")?,
                    retry_of: r.try_get("retry_of")?,
                })
            })
            .collect()
    }

    /// Every run; a failed read fails the test ("no runs" never stands for "could not look").
    fn runs(&self) -> Vec<Run> {
        self.try_runs().unwrap_or_else(|e| panic!("cannot read the runs: {e}"))
    }

    /// The first column of `sql`, as text, a row an item; a failed read fails the test.
    fn texts(&self, sql: &str) -> Vec<String> {
        let rows = self.rt.block_on(sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).fetch_all(&self.pool));
        rows.unwrap_or_else(|e| panic!("cannot read {sql}: {e}")).iter().map(|r| r.try_get::<String, _>(0).expect("text")).collect()
    }

    fn run(&self, id: &str) -> Option<Run> {
        self.runs().into_iter().find(|r| r.id == id)
    }

    /// Polls until `pred` holds over the runs (the workers' clocks are real; this only waits).
    fn wait_for(&self, what: &str, within: Duration, workers: &[&Worker], pred: impl Fn(&[Run]) -> bool) -> Vec<Run> {
        poll(
            what,
            within,
            // While the server is down a read fails, and the wait goes on; it never counts as
            // "no runs".
            || self.try_runs().ok().filter(|r| pred(r)),
            || {
                let logs: String = workers.iter().map(|w| format!("--- {}\n{}", w.port, w.log())).collect();
                match self.try_runs() {
                    Ok(runs) => format!("runs: {:#?}\n{logs}", &runs[runs.len().saturating_sub(30)..]),
                    Err(e) => format!("runs: cannot read them: {e}\n{logs}"),
                }
            },
        )
    }
}

/// Waits until every worker's `/readyz` answers `ready` (200) or not.
fn wait_ready(workers: &[&Worker], ready: bool, within: Duration) {
    for w in workers {
        let what = if ready { "the worker to be ready" } else { "the worker to say it is not ready" };
        poll(what, within, || ((http_get(w.port, "/readyz").map(|(c, _)| c) == Some(200)) == ready).then_some(()), || w.log());
    }
}

const JOBS: &str = r#"
    tick:
      type: plugin
      plugin: shell-exec
      action: run
      cron: "* * * * * *"
      retention: {max_runs: 1000}
      parameters: {command: "echo tick"}
    beat:
      type: plugin
      plugin: shell-exec
      action: run
      cron: "* * * * * *"
      parameters: {command: "echo beat"}
      tags: [pulse]
    echo:
      type: plugin
      plugin: file-save
      action: save
      after: [tick]
      retention: {max_runs: 1000}
      parameters: {path: echo.txt, content: e}
    hold:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      parameters: {command: "sleep 600"}
    quick:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      parameters: {command: "echo quick"}
    slow:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      retries: {max: 2, initial: 1s}
      parameters: {command: "sleep 6; echo slow"}
workflows:
  post:
    steps:
      - id: gate
        type: approval
        input: "Publish?"
      - id: publish
        type: plugin
        plugin: shell-exec
        action: run
        parameters: {command: "echo published"}
"#;

/// The lease of [`worker`]'s workers, in ms.
const LEASE_MS: i64 = 3_000;

/// A worker named `name` on database `url`.
fn worker(name: &str, url: &str, concurrency: u32) -> Worker {
    worker_with(name, url, concurrency, &format!("{LEASE_MS}ms"), JOBS)
}

/// A worker named `name` on database `url`, with its lease and jobs.
fn worker_with(name: &str, url: &str, concurrency: u32, lease: &str, jobs: &str) -> Worker {
    let w = Worker::new("");
    let text = format!(
        "framework:\n  data_dir: {data}\nworker:\n  name: {name}\n  concurrency: {concurrency}\n  lease: {lease}\n  shutdown_grace: 3s\n  mcp:\n    port: {port}\n\
         scheduling:\n  storage:\n    provider: postgres\n    connection_string: \"{url}\"\n    pool_size: 6\n  jobs:{jobs}",
        data = w.dir.path().join("data").display(),
        port = w.port,
    );
    std::fs::write(w.config_path(), text).unwrap();
    w
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// `lampctl jobs trigger JOB` through `w`: the new run's id.
fn trigger(w: &Worker, job: &str) -> String {
    let (code, out, err) = w.ctl(&["jobs", "trigger", job, "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    json_of(&out)["run_id"].as_str().unwrap().to_owned()
}

#[test]
fn three_workers_share_one_schedule_and_take_over_from_a_killed_one() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "shared");
    let url = cluster.url_of("shared");
    let (mut a, mut b, mut c) = (worker("w-a", &url, 4), worker("w-b", &url, 4), worker("w-c", &url, 1));
    a.start();
    b.start();
    c.start();
    // Every worker lists the three.
    for w in [&a, &b, &c] {
        let (code, out, err) = w.ctl(&["status", "-o", "json"]);
        assert_eq!(code, 0, "{err}");
        let status = json_of(&out);
        assert_eq!(status["storage"], "postgres");
        let names: Vec<&str> = status["workers"].as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["w-a", "w-b", "w-c"], "{out}");
    }

    // C's one slot is taken by a long run, so what is triggered through C runs elsewhere.
    let mut held = None;
    for _ in 0..20 {
        let id = trigger(&c, "hold");
        let run =
            db.wait_for("the hold run to start", Duration::from_secs(10), &[&c], |r| r.iter().any(|r| r.id == id && r.status == "running"));
        let on = run.iter().find(|r| r.id == id).and_then(|r| r.worker.clone());
        if on.as_deref() == Some("w-c") {
            held = Some(id);
            break;
        }
        assert_eq!(c.ctl(&["runs", "cancel", &id]).0, 0);
    }
    let held = held.expect("C ran one of its own hold runs");
    let (code, out, err) = c.ctl(&["jobs", "trigger", "quick", "--wait", "--timeout", "30", "-o", "json"]);
    assert_eq!(code, 0, "trigger --wait through C: {out}{err}");
    let quick = json_of(&out);
    let quick_id = quick["run_id"].as_str().unwrap().to_owned();
    assert_eq!((&quick["finished"], &quick["run"]["status"]), (&Value::Bool(true), &Value::from("succeeded")), "{out}");
    let ran_on = db.run(&quick_id).unwrap().worker.unwrap();
    assert_ne!(ran_on, "w-c", "C had no free slot: another worker ran it and C's wait saw the end");

    // Pause through A holds on B and C (every worker fires every tick it can).
    assert_eq!(a.ctl(&["jobs", "pause", "beat", "--reason", "maintenance"]).0, 0);
    let paused_at = now_ms();
    for (_, w) in [("w-b", &b), ("w-c", &c)] {
        let (code, out, _) = w.ctl(&["jobs", "show", "beat", "-o", "json"]);
        assert_eq!(code, 0);
        assert_eq!(json_of(&out)["paused"], true, "the pause shows on every worker: {out}");
    }
    // Four seconds of ticks while paused.
    let _ = db.wait_for("four more ticks of tick", Duration::from_secs(10), &[&a], |r| {
        r.iter().filter(|r| r.job == "tick" && r.scheduled_at.unwrap_or(0) > paused_at + 1000).count() >= 4
    });
    assert_eq!(c.ctl(&["jobs", "resume", "beat"]).0, 0);
    let resumed_at = now_ms();
    let runs = db.wait_for("beat to fire again", Duration::from_secs(5), &[&a, &b, &c], |r| {
        r.iter().any(|r| r.job == "beat" && r.status == "succeeded" && r.scheduled_at.unwrap_or(0) > resumed_at)
    });
    let while_paused: Vec<&Run> = runs
        .iter()
        .filter(|r| r.job == "beat" && r.status != "skipped")
        .filter(|r| r.scheduled_at.is_some_and(|t| t > paused_at + 1000 && t < resumed_at - 1000))
        .collect();
    assert!(while_paused.is_empty(), "no worker ran beat while it was paused: {while_paused:#?}");

    // A tag's pause through B, one change with one reason, shows on C; C resumes the tag.
    let (code, out, err) = b.ctl(&["jobs", "pause", "--tag", "pulse", "--reason", "audit", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json_of(&out)["changed"], serde_json::json!(["beat"]), "{out}");
    let (code, out, err) = c.ctl(&["jobs", "list", "--tag", "pulse", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let listed = json_of(&out);
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(1), "only the tag's jobs: {out}");
    assert_eq!((&listed["jobs"][0]["paused"], &listed["jobs"][0]["pause_reason"]), (&Value::Bool(true), &Value::from("audit")), "{out}");
    let (code, out, err) = c.ctl(&["jobs", "resume", "--tag", "pulse", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json_of(&out)["changed"], serde_json::json!(["beat"]), "{out}");
    assert_eq!(json_of(&out)["jobs"][0]["paused"], Value::Bool(false), "{out}");

    // Cancel through another worker than the one running the run.
    let slow = trigger(&a, "hold");
    let runs = db.wait_for("the run to cancel to start", Duration::from_secs(10), &[&a], |r| {
        r.iter().any(|r| r.id == slow && r.status == "running")
    });
    let runner = runs.iter().find(|r| r.id == slow).unwrap().worker.clone().unwrap();
    let other = if runner == "w-b" { &a } else { &b };
    let (code, out, err) = other.ctl(&["runs", "cancel", &slow]);
    assert_eq!(code, 0, "{out}{err}");
    db.wait_for("the cancel to reach the runner", Duration::from_secs(3), &[&a, &b], |r| {
        r.iter().any(|r| r.id == slow && r.status == "cancelled")
    });

    // An approval through another worker than the one the run waits on.
    let (code, out, err) = a.ctl(&["workflows", "run", "post", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let post = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    let runs = db.wait_for("the workflow to wait", Duration::from_secs(10), &[&a], |r| {
        r.iter().any(|r| r.id == post && r.status == "waiting_approval")
    });
    let waited_on = runs.iter().find(|r| r.id == post).unwrap().worker.clone().unwrap();
    let approver = [("w-a", &a), ("w-b", &b), ("w-c", &c)].into_iter().find(|(n, _)| *n != waited_on).unwrap().1;
    let (code, out, err) = approver.ctl(&["approvals", "approve", &post, "--by", "ana"]);
    assert_eq!(code, 0, "{out}{err}");
    db.wait_for("the approved workflow to finish", Duration::from_secs(10), &[&a, &b, &c], |r| {
        r.iter().any(|r| r.id == post && r.status == "succeeded")
    });

    // SIGKILL the worker running a slow run: after its lease the others interrupt the run and
    // retry it to the end.
    let slow = trigger(&b, "slow");
    let runs =
        db.wait_for("the slow run to start", Duration::from_secs(10), &[&b], |r| r.iter().any(|r| r.id == slow && r.status == "running"));
    let victim = runs.iter().find(|r| r.id == slow).unwrap().worker.clone().unwrap();
    let (victim_w, survivors): (&mut Worker, Vec<&Worker>) = match victim.as_str() {
        "w-a" => (&mut a, vec![&b, &c]),
        "w-b" => (&mut b, vec![&a, &c]),
        other => panic!("C has no free slot, yet {other} ran it"),
    };
    victim_w.signal("KILL");
    let killed_at = now_ms();
    victim_w.wait_exit(Duration::from_secs(5));
    let runs = db.wait_for("the killed worker's run to be retried to its end", Duration::from_secs(30), &survivors, |r| {
        r.iter().any(|r| r.retry_of.as_deref() == Some(&slow) && r.status == "succeeded")
    });
    assert_eq!(runs.iter().find(|r| r.id == slow).unwrap().status, "interrupted");
    let left: Vec<&Run> = runs.iter().filter(|r| r.worker.as_deref() == Some(&victim) && r.status == "running").collect();
    assert!(left.is_empty(), "nothing of the killed worker is left running: {left:#?}");
    let (_, out, _) = survivors[0].ctl(&["status", "-o", "json"]);
    let names: Vec<String> = json_of(&out)["workers"].as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap().to_owned()).collect();
    assert!(!names.contains(&victim), "a dead worker is not listed: {names:?}");
    // The survivors say that the killed worker no longer renews its lease: a note on /readyz
    // (still ready) and a gauge.
    for w in &survivors {
        // Sampled with the gauges, every few seconds.
        let (code, body) = poll(
            "the lapsed lease on /readyz",
            Duration::from_secs(15),
            || http_get(w.port, "/readyz").filter(|(_, b)| b.contains(&format!("note: worker \"{victim}\""))),
            || http_get(w.port, "/readyz").map(|(_, b)| b).unwrap_or_default(),
        );
        assert_eq!(code, 200, "still ready: {body}");
        assert!(body.starts_with("ready\n") && body.contains("has not renewed its lease since"), "{body}");
        poll(
            "the lapsed-lease gauge",
            Duration::from_secs(15),
            || http_get(w.port, "/metrics").map(|(_, b)| b).filter(|b| b.contains("lamplighter_workers_lapsed 1")),
            || http_get(w.port, "/metrics").map(|(_, b)| b).unwrap_or_default(),
        );
    }

    // Two minutes of ticks in all, then a clean stop of the rest.
    let survivors_now: Vec<&Worker> = [&a, &b, &c].into_iter().filter(|w| w.is_running()).collect();
    db.wait_for("two minutes of ticks", Duration::from_secs(150), &survivors_now, |r| {
        r.iter().filter(|r| r.job == "tick" && r.trigger != "retry").count() >= 122
    });
    drop(survivors_now);
    let _ = c.ctl(&["runs", "cancel", &held]);
    let mut alive: Vec<&mut Worker> = vec![&mut a, &mut b, &mut c].into_iter().filter(|w| w.is_running()).collect();
    for w in &alive {
        w.signal("TERM");
    }
    for w in &mut alive {
        assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
    }

    let runs = db.runs();
    let running: Vec<&Run> = runs.iter().filter(|r| r.status == "running").collect();
    assert!(running.is_empty(), "no run left running: {running:#?}");
    // Every second from the first tick to the last fired once, whichever worker fired it.
    let mut ticks: BTreeMap<i64, usize> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.job == "tick" && r.trigger != "retry") {
        *ticks.entry(r.scheduled_at.unwrap()).or_default() += 1;
    }
    let doubled: Vec<(&i64, &usize)> = ticks.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "ticks fired more than once: {doubled:?}");
    let (first, last) = (*ticks.keys().next().unwrap(), *ticks.keys().last().unwrap());
    let missed: Vec<i64> = (0..=(last - first) / 1000).map(|i| first + i * 1000).filter(|t| !ticks.contains_key(t)).collect();
    assert!(missed.is_empty(), "ticks missed: {missed:?}");
    assert!(ticks.len() >= 120, "two minutes of per-second ticks: {}", ticks.len());
    // Each tick's run succeeded, but one the killed worker was running when it died (then
    // interrupted, as the takeover says).
    let not_ok: Vec<&Run> = runs
        .iter()
        .filter(|r| r.job == "tick" && r.status != "succeeded")
        .filter(|r| !(r.status == "interrupted" && r.worker.as_deref() == Some(victim.as_str())))
        .collect();
    assert!(not_ok.is_empty(), "every tick's run succeeded: {not_ok:#?}");
    // Ticks went on after the kill, on the workers still alive. (Which live worker runs a tick is
    // not promised: a worker with a free slot that fires a tick may well run it itself.)
    let after_kill: Vec<&Run> = runs.iter().filter(|r| r.job == "tick" && r.scheduled_at.is_some_and(|t| t > killed_at + 1000)).collect();
    assert!(after_kill.len() >= 10, "ticks went on after the kill: {}", after_kill.len());
    let on_the_dead: Vec<&&Run> = after_kill.iter().filter(|r| r.worker.as_deref() == Some(victim.as_str())).collect();
    assert!(on_the_dead.is_empty(), "no tick ran on the killed worker: {on_the_dead:#?}");
    // `echo` runs after each tick: once per success noticed, whichever worker noticed it,
    // across the kill and the takeover.
    let followed =
        db.texts("SELECT (input::jsonb)->'upstream'->'tick'->>'run_id' FROM ll_runs WHERE job = 'echo' AND trigger = 'after' ORDER BY 1");
    let noticed = db.texts("SELECT id FROM ll_runs WHERE job = 'tick' AND status = 'succeeded' AND outcome_seen IS NOT NULL ORDER BY 1");
    assert!(noticed.len() >= 100, "two minutes of tick outcomes noticed: {}", noticed.len());
    assert_eq!(followed, noticed, "one echo run per tick success, none twice");
}

#[test]
fn a_database_restart_under_load_loses_nothing() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "restart");
    let url = cluster.url_of("restart");
    let (mut a, mut b) = (worker("r-a", &url, 4), worker("r-b", &url, 4));
    a.start();
    b.start();
    db.wait_for("ticks", Duration::from_secs(10), &[&a, &b], |r| r.iter().filter(|r| r.job == "tick").count() >= 3);
    let slow = trigger(&a, "slow");
    db.wait_for("the slow run to start", Duration::from_secs(10), &[&a], |r| r.iter().any(|r| r.id == slow && r.status == "running"));

    cluster.stop();
    // The outage starts when the server says it was asked to stop (`stop` reaches it later
    // than it is called on a busy machine, and ticks go on firing until then).
    let stopped_at = cluster.stop_asked_at_ms();
    wait_ready(&[&a, &b], false, Duration::from_secs(10));
    // The slow run ends while the server is down: its end waits to be recorded (the log says so).
    poll(
        "the slow run to end during the outage",
        Duration::from_secs(15),
        || [&a, &b].iter().any(|w| w.log().contains("cannot record the end of runs")).then_some(()),
        || a.log(),
    );
    cluster.restart();
    // The server is back from when it says it was ready (`restart` may return seconds later on a
    // busy machine); the workers notice it a moment later (`back`).
    let restarted = cluster.ready_at_ms();
    wait_ready(&[&a, &b], true, Duration::from_secs(20));
    let back = now_ms();
    db.wait_for("the slow run's end, recorded after the restart", Duration::from_secs(20), &[&a, &b], |r| {
        r.iter().any(|r| (r.id == slow || r.retry_of.as_deref() == Some(&slow)) && r.status == "succeeded")
    });
    db.wait_for("ticks after the restart", Duration::from_secs(10), &[&a, &b], |r| {
        r.iter().filter(|r| r.job == "tick" && r.status == "succeeded" && r.scheduled_at.unwrap_or(0) > back).count() >= 3
    });
    // What the workers said before they were stopped (one stopping moves its share as well).
    let logs_before_stop = [a.log(), b.log()];
    for w in [&a, &b] {
        w.signal("TERM");
    }
    assert_eq!(a.wait_exit(Duration::from_secs(20)), Some(0));
    assert_eq!(b.wait_exit(Duration::from_secs(20)), Some(0));
    let runs = db.runs();
    let running: Vec<&Run> = runs.iter().filter(|r| r.status == "running").collect();
    assert!(running.is_empty(), "no run left running: {running:#?}");
    let mut ticks: BTreeMap<i64, usize> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.job == "tick" && r.trigger != "retry") {
        *ticks.entry(r.scheduled_at.unwrap()).or_default() += 1;
    }
    assert!(ticks.values().all(|n| *n == 1), "no tick doubled across the restart: {ticks:?}");
    // None lost either: every second before the outage and after it has its tick; the outage
    // itself is one catch-up run at most (`catch_up: latest`).
    let (first, last) = (*ticks.keys().next().unwrap(), *ticks.keys().last().unwrap());
    let missed: Vec<i64> = (0..=(last - first) / 1000)
        .map(|i| first + i * 1000)
        .filter(|t| !ticks.contains_key(t) && (*t < stopped_at - 1000 || *t > back + 1000))
        .collect();
    assert!(missed.is_empty(), "ticks lost outside the outage ({stopped_at}..{back}): {missed:?}");
    // Ticks due while the server was down are one catch-up run. Those at its edges are not:
    // the ticks in the second before the stop, and the ordinary ticks once the server was back
    // (`restarted` is when the server said it was ready).
    // (A retry is its tick's second attempt, not a tick: see below.)
    let tick_runs = |from: i64, to: i64| -> Vec<&Run> {
        runs.iter().filter(|r| r.job == "tick" && r.trigger != "retry" && r.scheduled_at.is_some_and(|t| t >= from && t <= to)).collect()
    };
    // An outage longer than the 3 s lease may end in a takeover: the worker that reads the group
    // first when the server is back finds the other's lease run out, takes its share, and fires
    // each tick of the takeover's window (1.5 × the lease before it, the scheduler's
    // `takeover_within`, owed as the dead owner's: the tick's key drops any it did fire). Only
    // what is older is the outage's one catch-up run.
    let inside = tick_runs(stopped_at + 1000, restarted - 1000);
    let window = restarted - LEASE_MS * 3 / 2 - 1000;
    let older: Vec<&Run> = inside.iter().copied().filter(|r| r.scheduled_at.is_some_and(|t| t < window)).collect();
    assert!(older.len() <= 1, "the outage ({stopped_at}..{restarted}) before a takeover's window is one catch-up run: {older:#?}");
    // The share moved: a worker that planned one of two planned every job after.
    let took_over = logs_before_stop.iter().any(|log| log.find("one of 2").is_some_and(|i| log[i..].contains("one of 1")));
    if inside.len() > 1 {
        assert!(took_over, "ticks inside the outage beyond one catch-up run come only from a takeover: {inside:#?}");
    }
    // Without a takeover, the outage is its one run (at most, above) and the ticks at its
    // edges. A takeover owes each tick of its window, which may begin in the second before the
    // stop and end after the restart (each once: no tick doubled, above); what bounds the
    // outage then is the one run older than the window (above).
    if !took_over {
        let caught = tick_runs(stopped_at - 1000, restarted + 1000);
        assert!(caught.len() <= 4, "the outage ({stopped_at}..{restarted}) is one catch-up run and the ticks at its edges: {caught:#?}");
    }
    // A tick due while an end waits for the database is skipped (the run it would overlap is
    // still running as far as the database knows): the overlap policy, not a loss. A tick run
    // whose end could not reach the database within its worker's lease (the outage is longer
    // than the 3 s lease) is refused by the fence, interrupted and retried: its retry succeeded.
    let around = |r: &Run| r.scheduled_at.is_some_and(|t| t >= stopped_at - 1000 && t <= back + 1000);
    let retried = |r: &Run| runs.iter().any(|x| x.retry_of.as_deref() == Some(r.id.as_str()) && x.status == "succeeded");
    let failed: Vec<&Run> = runs
        .iter()
        .filter(|r| r.job == "tick" && r.status != "succeeded")
        .filter(|r| !(around(r) && (r.status == "skipped" || (r.status == "interrupted" && retried(r)))))
        .collect();
    assert!(
        failed.is_empty(),
        "every tick's run succeeded but those skipped or interrupted and retried around the outage ({stopped_at}..{back}): {failed:#?}"
    );
}

/// Runs still queued when the last worker stopped (on PostgreSQL the queue outlives the
/// workers) are taken by the next worker to start, with nothing else due to wake it.
#[test]
fn runs_queued_when_the_last_worker_stopped_are_taken_by_the_next_to_start() {
    const QUIET: &str = r#"
    busy:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      parameters: {command: "sleep 1; echo busy"}
    quick:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      parameters: {command: "echo quick"}
"#;
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "queued");
    let url = cluster.url_of("queued");
    let mut a = worker_with("q-a", &url, 1, "3s", QUIET);
    a.start();
    let busy = trigger(&a, "busy");
    db.wait_for("the busy run to start", Duration::from_secs(10), &[&a], |r| r.iter().any(|r| r.id == busy && r.status == "running"));
    // One slot, taken: these wait in the queue.
    let queued = [trigger(&a, "quick"), trigger(&a, "quick")];
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(20)), Some(0), "{}", a.log());
    for id in &queued {
        let run = db.run(id).unwrap_or_else(|| panic!("run {id} is not in the database"));
        assert_eq!(run.status, "queued", "a stopping worker takes nothing more from the queue: {run:?}");
    }

    // No tick is due and nothing is triggered: only the start's own look at the queue finds them.
    let mut b = worker_with("q-b", &url, 2, "3s", QUIET);
    b.start();
    let runs = db.wait_for("the queued runs to be taken and succeed", Duration::from_secs(15), &[&b], |r| {
        queued.iter().all(|id| r.iter().any(|r| &r.id == id && r.status == "succeeded"))
    });
    for id in &queued {
        let run = runs.iter().find(|r| &r.id == id).unwrap();
        assert_eq!(run.worker.as_deref(), Some("q-b"), "taken by the worker that started: {run:?}");
    }
}

/// A job created at runtime through one worker is heard of by the others (NOTIFY) and fires
/// once per tick across the three; a delete through another stops it everywhere.
#[test]
fn a_runtime_job_created_through_one_worker_fires_once_per_tick_and_a_delete_through_another_stops_it() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "managed");
    let url = cluster.url_of("managed");
    let managed = |name: &str| {
        let w = Worker::new("");
        let text = format!(
            "framework:\n  data_dir: {data}\nworker:\n  name: {name}\n  lease: 3s\n  shutdown_grace: 3s\n  mcp:\n    port: {port}\n    manage_jobs: {{enabled: true}}\n\
             scheduling:\n  storage:\n    provider: postgres\n    connection_string: \"{url}\"\n    pool_size: 4\n  jobs:\n    beat: {{cron: \"* * * * * *\", type: plugin, plugin: file-save, action: save, parameters: {{path: b.txt, content: b}}}}\n",
            data = w.dir.path().join("data").display(),
            port = w.port,
        );
        std::fs::write(w.config_path(), text).unwrap();
        w
    };
    let (mut a, mut b, mut c) = (managed("m-a"), managed("m-b"), managed("m-c"));
    a.start();
    b.start();
    c.start();
    let file = a.dir.path().join("pulse.yaml");
    std::fs::write(&file, "cron: \"* * * * * *\"\nplugin: file-save\naction: save\nparameters: {path: p.txt, content: p}\n").unwrap();
    let (code, out, err) = a.ctl(&["jobs", "create", "pulse", "-f", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    // The others have it, without a reload.
    for w in [&b, &c] {
        poll(
            "the other workers to hear of the job",
            Duration::from_secs(10),
            || w.ctl(&["jobs", "show", "pulse"]).1.contains("defined:      at runtime, version 1").then_some(()),
            || w.log(),
        );
    }
    let runs = db.wait_for("ten ticks of the runtime job", Duration::from_secs(30), &[&a, &b, &c], |r| {
        r.iter().filter(|r| r.job == "pulse" && r.status == "succeeded").count() >= 10
    });
    let mut ticks: Vec<i64> = runs.iter().filter(|r| r.job == "pulse").filter_map(|r| r.scheduled_at).collect();
    let all = ticks.len();
    ticks.sort();
    ticks.dedup();
    assert_eq!(ticks.len(), all, "a tick fired twice: {runs:#?}");

    let (code, out, err) = b.ctl(&["jobs", "delete", "pulse", "--expected-version", "1"]);
    assert_eq!(code, 0, "{out}{err}");
    let deleted_at = now_ms();
    // The file job `beat` ticks every second on every worker: three of its ticks after the
    // delete show the schedulers went on, without the deleted job.
    db.wait_for("three beats after the delete", Duration::from_secs(30), &[&a, &b, &c], |r| {
        r.iter().filter(|r| r.job == "beat" && r.scheduled_at.is_some_and(|t| t > deleted_at + 2_000)).count() >= 3
    });
    let late: Vec<Run> =
        db.runs().into_iter().filter(|r| r.job == "pulse" && r.scheduled_at.is_some_and(|t| t > deleted_at + 1_000)).collect();
    assert!(late.is_empty(), "ticks after the delete: {late:#?}");
    let (code, out, err) = c.ctl(&["jobs", "show", "pulse"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("deleted by mcp client lampctl"), "{out}");
}

/// Each execution of the side-effect job writes `<its shell's pid> <ms>` every 100 ms; the
/// executions, as (pid, first, last, lines), in the order they began.
fn executions(log: &std::path::Path) -> Vec<(String, i64, i64, usize)> {
    let text = match std::fs::read_to_string(log) {
        Ok(text) => text,
        // Not written yet: the first execution has not begun.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => panic!("cannot read the side-effect log: {e}"),
    };
    let mut by_pid: BTreeMap<String, (i64, i64, usize)> = BTreeMap::new();
    for line in text.lines() {
        let (pid, at) = line.split_once(' ').unwrap_or_else(|| panic!("not a side-effect line: {line:?}"));
        let at: i64 = at.trim().parse().unwrap_or_else(|e| panic!("{line:?}: {e}"));
        let e = by_pid.entry(pid.to_owned()).or_insert((at, at, 0));
        e.0 = e.0.min(at);
        e.1 = e.1.max(at);
        e.2 += 1;
    }
    let mut out: Vec<(String, i64, i64, usize)> = by_pid.into_iter().map(|(pid, (a, b, n))| (pid, a, b, n)).collect();
    out.sort_by_key(|e| e.1);
    out
}

/// Three workers, each behind a proxy; the one running a long shell run is cut off from the
/// database for twice its lease. It stops the command before its lease can run out (fenced,
/// not ready, saying why), another worker retries the run only after that, and the two
/// executions' side effects never overlap in time. Healed, the cut-off worker renews (a new
/// epoch), says it is ready and takes work again.
#[test]
fn a_worker_cut_off_from_the_database_stops_its_runs_before_another_takes_them_over() {
    use lamplighter_tests::proxy::Proxy;
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "fence");
    let effects_dir = tempfile::tempdir().unwrap();
    let effects = effects_dir.path().join("effects.log");
    let jobs = format!(
        r#"
    effect:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      retries: {{max: 3, initial: 1s}}
      parameters: {{command: "for i in $(seq 120); do echo \"$$ $(date +%s%3N)\" >> {log}; sleep 0.1; done", timeout_seconds: 60}}
    quick:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      parameters: {{command: "echo quick"}}
"#,
        log = effects.display()
    );
    let target: std::net::SocketAddr = format!("127.0.0.1:{}", cluster.port()).parse().unwrap();
    let proxies = [Proxy::start(target), Proxy::start(target), Proxy::start(target)];
    let names = ["f-a", "f-b", "f-c"];
    let lease_ms = 4000;
    let mut workers: Vec<Worker> = names
        .iter()
        .zip(&proxies)
        .map(|(name, p)| worker_with(name, &format!("postgres://postgres@127.0.0.1:{}/fence", p.port()), 2, "4s", &jobs))
        .collect();
    for w in &mut workers {
        w.start();
    }
    let id = trigger(&workers[0], "effect");
    let runs = db.wait_for("the side-effect run to start", Duration::from_secs(10), &[&workers[0]], |r| {
        r.iter().any(|r| r.id == id && r.status == "running")
    });
    let runner = runs.iter().find(|r| r.id == id).unwrap().worker.clone().unwrap();
    let v = names.iter().position(|n| *n == runner).unwrap();
    poll(
        "side effects",
        Duration::from_secs(10),
        || (executions(&effects).first().map(|e| e.3).unwrap_or(0) >= 5).then_some(()),
        || workers[v].log(),
    );

    proxies[v].cut();
    let cut_at = now_ms();
    // Fenced within 2/3 of its lease: not ready, and it says why.
    let (_, body) = poll(
        "the cut-off worker to fence itself",
        Duration::from_secs(6),
        || http_get(workers[v].port, "/readyz").filter(|(code, body)| *code == 503 && body.contains("fenced")),
        || workers[v].log(),
    );
    assert!(body.contains("could not renew its lease"), "{body}");
    // Another worker takes the run over once the lease and its margin have passed, and retries it.
    let others: Vec<&Worker> = workers.iter().enumerate().filter(|(i, _)| *i != v).map(|(_, w)| w).collect();
    let runs = db.wait_for("another worker to run the retry", Duration::from_secs(20), &others, |r| {
        r.iter().any(|r| r.retry_of.as_deref() == Some(&id) && r.status == "running")
    });
    let retry = runs.iter().find(|r| r.retry_of.as_deref() == Some(&id)).unwrap().clone();
    assert_ne!(retry.worker.as_deref(), Some(runner.as_str()), "the retry runs elsewhere");
    // The link stays cut for twice the lease: the retry's side effects go on meanwhile.
    poll(
        "twice the lease to pass with the retry's side effects going",
        Duration::from_secs(20),
        || (now_ms() >= cut_at + 2 * lease_ms && executions(&effects).len() >= 2).then_some(()),
        || workers[v].log(),
    );
    assert_eq!(proxies[v].cuts(), 1, "the partition happened");
    proxies[v].heal();
    wait_ready(&[&workers[v]], true, Duration::from_secs(15));
    assert!(workers[v].log().contains("takes work again"), "{}", workers[v].log());
    db.wait_for("the retry to finish", Duration::from_secs(30), &others, |r| r.iter().any(|r| r.id == retry.id && r.status == "succeeded"));

    let runs = db.runs();
    let first = runs.iter().find(|r| r.id == id).unwrap();
    assert_eq!(first.status, "interrupted", "{first:?}");
    let ran = executions(&effects);
    assert_eq!(ran.len(), 2, "one execution cut short, one retry: {ran:?}");
    let (killed, retried) = (&ran[0], &ran[1]);
    assert!(killed.3 < 120, "the first execution was stopped: {killed:?}");
    assert!(killed.2 < cut_at + lease_ms, "stopped before its lease could run out: last effect {} ms after the cut", killed.2 - cut_at);
    assert!(killed.2 < retried.1, "no overlap: the first ended at {}, the retry began at {}", killed.2, retried.1);
    assert_eq!(retried.3, 120, "the retry ran to its end");

    // The cut-off worker takes work again: alone, it runs what it is asked to.
    for (i, w) in workers.iter().enumerate() {
        if i != v {
            w.signal("TERM");
        }
    }
    for (i, w) in workers.iter_mut().enumerate() {
        if i != v {
            assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
        }
    }
    let (code, out, err) = workers[v].ctl(&["jobs", "trigger", "quick", "--wait", "--timeout", "30", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let quick = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    assert_eq!(db.run(&quick).unwrap().worker.as_deref(), Some(runner.as_str()));
    workers[v].signal("TERM");
    assert_eq!(workers[v].wait_exit(Duration::from_secs(20)), Some(0));
}

/// The fence alone, end to end: a run ends while its worker's link to the database stalls for
/// longer than the lease. Its end, sent in time, reaches the database late, while the row is
/// still `running` (a guard on the status alone would record it), and is refused because the
/// worker no longer holds a live lease of the run's epoch. The worker says so, the run is
/// recovered as interrupted, and its retry runs.
#[test]
fn an_end_that_reaches_the_database_after_the_lease_ran_out_is_refused_by_the_fence() {
    use lamplighter_tests::proxy::Proxy;
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "late");
    let effects_dir = tempfile::tempdir().unwrap();
    let effects = effects_dir.path().join("effects.log");
    let jobs = format!(
        r#"
    late:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      retries: {{max: 1, initial: 1s}}
      parameters: {{command: "sleep 1; echo $$ >> {log}"}}
"#,
        log = effects.display()
    );
    let lines = || std::fs::read_to_string(&effects).map(|t| t.lines().count()).unwrap_or(0);
    let proxy = Proxy::start(format!("127.0.0.1:{}", cluster.port()).parse().unwrap());
    let mut w = worker_with("late-a", &format!("postgres://postgres@127.0.0.1:{}/late", proxy.port()), 2, "3s", &jobs);
    w.start();
    let id = trigger(&w, "late");
    db.wait_for("the run to start", Duration::from_secs(10), &[&w], |r| r.iter().any(|r| r.id == id && r.status == "running"));
    proxy.stall();
    // The command ends during the stall: its end goes into the stalled link.
    poll("the command to end", Duration::from_secs(10), || (lines() == 1).then_some(()), || w.log());
    // Held past the lease, as the database measures it (read directly, not through the proxy).
    let lease_gone = || {
        let sql = "SELECT lease_until < (extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM ll_workers WHERE name = 'late-a'";
        db.rt.block_on(sqlx::query_scalar::<_, bool>(sql).fetch_one(&db.pool)).unwrap_or(false)
    };
    poll("the lease to run out", Duration::from_secs(15), || lease_gone().then_some(()), || w.log());
    assert_eq!(db.run(&id).expect("the run").status, "running", "its end has not arrived: a status guard alone would take it");
    assert_eq!(proxy.cuts(), 1, "the stall happened");
    proxy.resume();

    // The fence refuses it, and the worker says so.
    poll(
        "the worker to report the refused end",
        Duration::from_secs(20),
        || {
            http_get(w.port, "/metrics")
                .filter(|(_, page)| page.lines().any(|l| l.starts_with("lamplighter_worker_fenced_writes_total") && l.ends_with(" 1")))
        },
        || w.log(),
    );
    assert!(w.log().contains("the fence refused the end of runs"), "{}", w.log());
    // Recovered as interrupted (the end was never recorded), then retried here.
    let runs = db.wait_for("the retry to succeed", Duration::from_secs(30), &[&w], |r| {
        r.iter().any(|r| r.retry_of.as_deref() == Some(id.as_str()) && r.status == "succeeded")
    });
    let first = runs.iter().find(|r| r.id == id).expect("the run");
    assert_eq!(first.status, "interrupted", "{first:?}");
    assert_eq!(lines(), 2, "the first execution and its retry");
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
}

/// The fence stops what is still running, not what has ended: a run whose command ended while
/// its worker's link to the database stalled, and whose last line and end were still waiting for
/// that link when the worker fenced itself, is recorded as it ended once the link is back within
/// the lease — not interrupted and run again.
#[test]
fn a_run_that_ended_before_its_worker_fenced_itself_keeps_its_outcome() {
    use lamplighter_tests::proxy::Proxy;
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "ended");
    let dir = tempfile::tempdir().unwrap();
    let (effects, go) = (dir.path().join("effects.log"), dir.path().join("go"));
    // The command ends when the test says so, and prints a line (which waits for the link).
    let jobs = format!(
        r#"
    short:
      type: plugin
      plugin: shell-exec
      action: run
      every: 24h
      retries: {{max: 1, initial: 1s}}
      parameters: {{command: "while [ ! -f {go} ]; do sleep 0.05; done; echo $$ >> {log}; echo done", timeout_seconds: 120}}
"#,
        go = go.display(),
        log = effects.display()
    );
    let lines = || std::fs::read_to_string(&effects).map(|t| t.lines().count()).unwrap_or(0);
    let proxy = Proxy::start(format!("127.0.0.1:{}", cluster.port()).parse().unwrap());
    // An 18 s lease, renewed every 4.5 s: the first renewal sent into the stall gives up 9 s
    // after the last that went through, the fence comes at 12 s, the lease lasts until 18 s —
    // time enough for the link to come back and the end to arrive.
    let mut w = worker_with("ended-a", &format!("postgres://postgres@127.0.0.1:{}/ended", proxy.port()), 2, "18s", &jobs);
    w.start();
    let id = trigger(&w, "short");
    db.wait_for("the run to start", Duration::from_secs(10), &[&w], |r| r.iter().any(|r| r.id == id && r.status == "running"));
    proxy.stall();
    assert_eq!(proxy.cuts(), 1, "the stall happened");
    // The command ends once the worker says a renewal failed, 3 s before the fence; its line
    // waits for the link for up to 5 s, so the fence comes while the run is ending.
    poll("a renewal to fail", Duration::from_secs(20), || w.log().contains("cannot renew the worker's lease").then_some(()), || w.log());
    std::fs::write(&go, "").unwrap();
    poll("the command to end during the stall", Duration::from_secs(5), || (lines() == 1).then_some(()), || w.log());
    poll(
        "the worker to fence itself",
        Duration::from_secs(10),
        || http_get(w.port, "/readyz").filter(|(code, body)| *code == 503 && body.contains("fenced")),
        || w.log(),
    );
    assert_eq!(db.run(&id).expect("the run").status, "running", "its end had not arrived when the worker fenced itself");
    // The lease still holds, as the database measures it (read directly, not through the proxy).
    let sql = "SELECT lease_until > (extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM ll_workers WHERE name = 'ended-a'";
    assert!(db.rt.block_on(sqlx::query_scalar::<_, bool>(sql).fetch_one(&db.pool)).expect("the worker's lease"), "the lease still holds");
    proxy.resume();
    wait_ready(&[&w], true, Duration::from_secs(10));
    let runs = db.wait_for("the run's end", Duration::from_secs(10), &[&w], |r| r.iter().any(|r| r.id == id && r.status != "running"));
    let run = runs.iter().find(|r| r.id == id).unwrap();
    assert_eq!(run.status, "succeeded", "recorded as it ended: {run:?}\n{}", w.log());
    assert!(!runs.iter().any(|r| r.retry_of.as_deref() == Some(id.as_str())), "no retry: {runs:#?}");
    assert_eq!(lines(), 1, "the command ran once");
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
}

/// A cancel asked through one worker while the runner's notification connection is cut (the
/// NOTIFY is lost with it) takes effect once the runner reconnects: it reads the requests
/// kept with its runs.
#[test]
fn a_cancel_sent_while_the_runners_listener_is_cut_off_takes_effect_on_reconnect() {
    use lamplighter_tests::proxy::Proxy;
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "reconnect");
    let target: std::net::SocketAddr = format!("127.0.0.1:{}", cluster.port()).parse().unwrap();
    let proxy = Proxy::start(target);
    // A long lease: the cut is far too short to fence the runner.
    let mut runner = worker_with("x", &format!("postgres://postgres@127.0.0.1:{}/reconnect", proxy.port()), 2, "60s", JOBS);
    runner.start();
    let hold = trigger(&runner, "hold");
    db.wait_for("the run to start on x", Duration::from_secs(10), &[&runner], |r| {
        r.iter().any(|r| r.id == hold && r.status == "running" && r.worker.as_deref() == Some("x"))
    });
    let mut other = worker_with("y", &cluster.url_of("reconnect"), 2, "60s", JOBS);
    other.start();

    proxy.cut();
    let (code, out, err) = other.ctl(&["runs", "cancel", &hold]);
    assert_eq!(code, 0, "the cancel is accepted: {out}{err}");
    assert_eq!(db.run(&hold).unwrap().status, "running", "x has not heard of it");
    proxy.heal();
    let runs = db.wait_for("the cancel to take effect on x", Duration::from_secs(15), &[&runner, &other], |r| {
        r.iter().any(|r| r.id == hold && r.status == "cancelled")
    });
    assert_eq!(runs.iter().find(|r| r.id == hold).unwrap().worker.as_deref(), Some("x"));
    assert_eq!(proxy.cuts(), 1, "the partition happened");
    let log = runner.log();
    assert!(log.contains("lost the notification connection"), "the listener reconnected: {log}");
    assert!(log.contains("a cancel missed while the signals were behind is applied"), "{log}");
    for w in [&runner, &other] {
        w.signal("TERM");
    }
    assert_eq!(runner.wait_exit(Duration::from_secs(20)), Some(0));
    assert_eq!(other.wait_exit(Duration::from_secs(20)), Some(0));
}

/// A database that accepts connections and never answers (its server frozen): SIGTERM while
/// the worker is starting (storage open, recovery, the first scheduler pass) ends it cleanly
/// within its grace, and so does SIGTERM while it runs with the database hung.
#[test]
fn sigterm_while_the_database_hangs_exits_within_the_grace() {
    let cluster = Cluster::start();
    let _db = Db::new(&cluster, "hung");
    let url = cluster.url_of("hung");
    cluster.freeze();
    let mut starting = worker("h-a", &url, 2);
    starting.start_until("opening storage");
    let asked = std::time::Instant::now();
    starting.signal("TERM");
    assert_eq!(starting.wait_exit(Duration::from_secs(5)), Some(0), "a clean exit");
    assert!(asked.elapsed() < Duration::from_secs(3), "within the grace (3s): {:?}", asked.elapsed());
    assert!(starting.log().contains("stopped while starting"), "{}", starting.log());
    assert!(!starting.log().contains("lamplighter ready"), "it never was ready: {}", starting.log());
    cluster.thaw();

    let mut running = worker("h-b", &url, 2);
    running.start();
    trigger(&running, "hold");
    cluster.freeze();
    let asked = std::time::Instant::now();
    running.signal("TERM");
    // Each wait of the drain is bounded, whatever the database does: 2s for the scheduler (it
    // may be inside a call to the hung database), the grace (3s), 10s for the interrupted run
    // to record its end (given up on: it is recovered later), 2s for the run tasks, 2s for the
    // pool to close, then at most 1s for the runtime to let go of its threads. With the
    // database hung each wait runs to its end (19 s here, alone); a machine busy with the rest
    // of the suite was seen at 24 s, so the bound allows 6 s of it. A wait that is not bounded
    // holds the exit until the run's `sleep 600` (or the 30 s below).
    assert_eq!(running.wait_exit(Duration::from_secs(30)), Some(0), "a clean exit");
    assert!(asked.elapsed() < Duration::from_secs(2 + 3 + 10 + 2 + 2 + 1 + 6), "bounded: {:?}\n{}", asked.elapsed(), running.log());
    assert!(running.log().contains("runs did not record their end"), "{}", running.log());
    cluster.thaw();
}

/// Three workers started at the same instant against an empty database: each migration is
/// applied once (PostgreSQL's advisory lock orders them) and all three start.
#[test]
fn workers_started_together_on_an_empty_database_apply_each_migration_once() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "fresh");
    let url = cluster.url_of("fresh");
    let mut workers = [worker("m-a", &url, 1), worker("m-b", &url, 1), worker("m-c", &url, 1)];
    std::thread::scope(|s| {
        for w in &mut workers {
            s.spawn(move || w.start());
        }
    });
    let count = |sql: &str| -> Vec<(i64, i64)> {
        let rows =
            db.rt.block_on(sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).fetch_all(&db.pool)).unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter().map(|r| (r.get::<i64, _>(0), r.get::<i64, _>(1))).collect()
    };
    let ours = count("SELECT version, count(*) FROM public._sqlx_migrations GROUP BY version ORDER BY version");
    let files = std::fs::read_dir(crate::support::repo_root().join("migrations/postgres"))
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql")))
        .count();
    assert_eq!(ours.len(), files, "every migration applied: {ours:?}");
    assert!(ours.iter().all(|(_, n)| *n == 1), "each once: {ours:?}");
    let queue = count("SELECT version, count(*) FROM apalis._sqlx_migrations GROUP BY version ORDER BY version");
    assert!(!queue.is_empty() && queue.iter().all(|(_, n)| *n == 1), "the queue's, each once: {queue:?}");
    for w in &workers {
        assert!(!w.log().contains("cannot start"), "{}", w.log());
        w.signal("TERM");
    }
    for w in &mut workers {
        assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
    }
}

/// One worker's clock three minutes ahead of the others' and the database's (libfaketime): it
/// keeps the server's time, so over half a minute of per-second ticks no run is ever for a tick
/// still in the server's future, and no tick is doubled or lost.
#[test]
fn a_worker_whose_clock_is_minutes_ahead_keeps_the_servers_time() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "skew");
    let url = cluster.url_of("skew");
    let (mut a, mut b, mut ahead) = (worker("s-a", &url, 2), worker("s-b", &url, 2), worker("s-ahead", &url, 2));
    ahead.env = vec![
        ("LD_PRELOAD".into(), crate::support::libfaketime().into()),
        ("FAKETIME".into(), "+3m".into()),
        ("DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    ahead.start();
    a.start();
    b.start();
    assert!(ahead.log().contains("off the database server's"), "the skew is seen and said: {}", ahead.log());
    let started = now_ms();
    let server_now = || -> i64 {
        db.rt
            .block_on(sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetch_one(&db.pool))
            .unwrap_or_else(|e| panic!("cannot read the server's clock: {e}"))
    };
    let mut looks = 0;
    poll(
        "half a minute of ticks, none early",
        Duration::from_secs(60),
        || {
            let runs = db.runs();
            let now = server_now();
            looks += 1;
            let early: Vec<&Run> = runs.iter().filter(|r| r.scheduled_at.is_some_and(|t| t > now + 1000)).collect();
            assert!(early.is_empty(), "runs for ticks still in the server's future (now {now}): {early:#?}");
            let ticks = runs.iter().filter(|r| r.job == "tick" && r.scheduled_at.is_some_and(|t| t > started)).count();
            // The skewed worker fired its share of the schedule (of these three, `beat` falls to
            // it) and ran it: what is checked held over its work too.
            let by_ahead =
                runs.iter().filter(|r| r.scheduled_at.is_some_and(|t| t > started) && r.worker.as_deref() == Some("s-ahead")).count();
            (ticks >= 30 && by_ahead >= 3).then_some(())
        },
        || format!("{:#?}\n{}", db.runs().iter().rev().take(20).collect::<Vec<_>>(), ahead.log()),
    );
    assert!(looks > 5, "looked while it ran: {looks}");
    for w in [&a, &b, &ahead] {
        w.signal("TERM");
    }
    for w in [&mut a, &mut b, &mut ahead] {
        assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
    }
    let runs = db.runs();
    let mut ticks: BTreeMap<i64, usize> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.job == "tick" && r.scheduled_at.is_some_and(|t| t > started)) {
        *ticks.entry(r.scheduled_at.unwrap()).or_default() += 1;
    }
    assert!(ticks.values().all(|n| *n == 1), "no tick doubled: {ticks:?}");
    let (first, last) = (*ticks.keys().next().unwrap(), *ticks.keys().last().unwrap());
    let missed: Vec<i64> = (0..=(last - first) / 1000).map(|i| first + i * 1000).filter(|t| !ticks.contains_key(t)).collect();
    assert!(missed.is_empty(), "no tick lost: {missed:?}");
}

/// `SELECT <col>::text` of run `id`, as a number (ms).
fn ms_of(db: &Db, id: &str, col: &str) -> i64 {
    let v = db.texts(&format!("SELECT coalesce({col}::text, '') FROM ll_runs WHERE id = '{id}'"));
    v.first().and_then(|t| t.parse().ok()).unwrap_or_else(|| panic!("run {id} has no {col}: {v:?}"))
}

/// Limits across three PostgreSQL workers: two jobs sharing a limit of 1, triggered through all
/// three, never run at once (from their side effects' timestamps) and both finish; a holder
/// whose worker is killed -9 keeps its slot until the takeover, and the run waiting for it
/// starts only then.
#[test]
fn three_workers_share_a_limit_and_a_killed_holders_slot_is_freed_only_at_takeover() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "limits");
    let url = cluster.url_of("limits");
    let traces = tempfile::tempdir().unwrap();
    let trace = traces.path().join("warehouse");
    let cmd = |label: &str, hold: &str| {
        format!(
            "echo \\\"$$ S $(date +%s%N) {label}\\\" >> {t}; sleep {hold}; echo \\\"$$ E $(date +%s%N) {label}\\\" >> {t}",
            t = trace.display()
        )
    };
    let job = |name: &str, command: String| {
        format!(
            "\n    {name}: {{type: plugin, plugin: shell-exec, action: run, limits: [warehouse], overlap: allow, retries: {{max: 0}}, parameters: {{command: \"{command}\"}}}}"
        )
    };
    let jobs = format!(
        "{}{}{}\n  limits:\n    warehouse: 1\n",
        job("ja", cmd("ja", "0.3")),
        job("jb", cmd("jb", "0.3")),
        job("hold", cmd("hold", "60"))
    );
    let mut ws: Vec<Worker> = ["w-a", "w-b", "w-c"].iter().map(|n| worker_with(n, &url, 4, "3s", &jobs)).collect();
    for w in &mut ws {
        w.start();
    }
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(trigger(&ws[i % 3], if i % 2 == 0 { "ja" } else { "jb" }));
    }
    let all: Vec<&Worker> = ws.iter().collect();
    db.wait_for("the eight runs to end", Duration::from_secs(60), &all, |r| {
        ids.iter().all(|id| r.iter().any(|r| &r.id == id && r.status == "succeeded"))
    });
    let runs = crate::together::intervals(&trace);
    assert_eq!(runs.len(), 8, "{runs:?}");
    crate::together::one_at_a_time(&runs);
    assert_eq!(runs.iter().filter(|r| r.2 == "jb").count(), 4, "both jobs made progress");

    // A holder killed -9: the run behind it waits until the takeover.
    let hold = trigger(&ws[0], "hold");
    let running = db.wait_for("hold to start", Duration::from_secs(10), &all, |r| r.iter().any(|r| r.id == hold && r.status == "running"));
    let victim = running.iter().find(|r| r.id == hold).unwrap().worker.clone().unwrap();
    let victim_at = ["w-a", "w-b", "w-c"].iter().position(|n| *n == victim).unwrap();
    let other = (victim_at + 1) % 3;
    let behind = trigger(&ws[other], "ja");
    let (_, out) = poll(
        "the run behind the holder to wait",
        Duration::from_secs(10),
        || {
            let (_, out, _) = ws[other].ctl(&["runs", "show", &behind, "-o", "json"]);
            let run = serde_json::from_str::<Value>(&out).ok()?;
            run["waiting_for"].as_str().map(|w| (w.to_owned(), out.clone()))
        },
        || ws[other].log(),
    );
    let shown = json_of(&out);
    assert_eq!(shown["waiting_for"], format!("waiting for limit \"warehouse\": 1 of 1 held by {hold}"), "{out}");
    ws[victim_at].signal("KILL");
    let killed_at = now_ms();
    ws[victim_at].wait_exit(Duration::from_secs(5));
    let survivors: Vec<&Worker> = ws.iter().enumerate().filter(|(i, _)| *i != victim_at).map(|(_, w)| w).collect();
    db.wait_for("the run behind the holder to end", Duration::from_secs(30), &survivors, |r| {
        r.iter().any(|r| r.id == behind && r.status == "succeeded")
    });
    assert_eq!(db.run(&hold).unwrap().status, "interrupted");
    let (taken_over, started) = (ms_of(&db, &hold, "finished_at"), ms_of(&db, &behind, "started_at"));
    assert!(taken_over >= killed_at + 2000, "the takeover came after the lease ({} ms after the kill)", taken_over - killed_at);
    assert!(started >= taken_over, "the waiting run started {} ms before the takeover freed the slot", taken_over - started);
    for (i, w) in ws.iter_mut().enumerate() {
        if i != victim_at {
            w.signal("TERM");
            assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
        }
    }
}

/// Deadlines are watched from the database by every live worker: a run whose worker is killed
/// (SIGKILL) before its `finish_within` passes has its miss told by the survivor, once.
#[test]
fn a_deadline_missed_by_a_killed_workers_run_is_told_by_the_survivor() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "deadline");
    let url = cluster.url_of("deadline");
    let jobs = "\n    late:\n      type: plugin\n      plugin: shell-exec\n      action: run\n      retries: {max: 1, backoff: fixed, initial: 60s}\n      deadline: {finish_within: 2s}\n      parameters: {command: \"sleep 30\"}\n";
    let (mut a, mut b) = (worker_with("d-a", &url, 2, "3s", jobs), worker_with("d-b", &url, 2, "3s", jobs));
    a.start();
    b.start();
    let id = trigger(&a, "late");
    let runs =
        db.wait_for("the run to start", Duration::from_secs(10), &[&a, &b], |r| r.iter().any(|r| r.id == id && r.status == "running"));
    let runner = runs.iter().find(|r| r.id == id).unwrap().worker.clone().unwrap();
    let (killed, survivor) = if runner == "d-a" { (&mut a, &b) } else { (&mut b, &a) };
    killed.signal("KILL");
    killed.wait_exit(Duration::from_secs(5));
    let shown = poll(
        "the survivor to tell the miss",
        Duration::from_secs(20),
        || {
            let (code, out, _) = survivor.ctl(&["runs", "show", &id, "-o", "json"]);
            (code == 0).then(|| json_of(&out)).filter(|r| r["deadlines_missed"].as_array().is_some_and(|d| !d.is_empty()))
        },
        || survivor.log(),
    );
    assert_eq!(shown["deadlines_missed"].as_array().unwrap().len(), 1, "{shown:#}");
    assert_eq!(shown["deadlines_missed"][0]["deadline"], "finish_within");
    let body = http_get(survivor.port, "/metrics").map(|(_, b)| b).unwrap_or_default();
    assert!(body.contains("lamplighter_deadline_missed_total{deadline=\"finish_within\",job=\"late\"} 1"), "the survivor told it: {body}");
}

/// Ticks no worker fired on time, on PostgreSQL: every worker stopped, and the job's last
/// processed tick put ten minutes back (what ten minutes with no worker up leave behind, without
/// the test waiting them out); the workers started again tell the missed ticks once between
/// them — how many, what `catch_up` did — and the one that told them counts them.
#[test]
fn ticks_missed_while_no_worker_was_up_are_told_once_between_the_workers() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "missed");
    let url = cluster.url_of("missed");
    let jobs = "\n    sec:\n      cron: \"* * * * * *\"\n      catch_up: latest\n      catch_up_window: 3m\n      type: plugin\n      plugin: file-save\n      action: save\n      parameters: {path: s.txt, content: s}\n";
    let (mut a, mut b) = (worker_with("m-a", &url, 2, "3s", jobs), worker_with("m-b", &url, 2, "3s", jobs));
    a.start();
    db.wait_for("a few ticks", Duration::from_secs(10), &[&a], |r| r.iter().filter(|r| r.job == "sec").count() >= 2);
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(20)), Some(0));
    db.rt
        .block_on(sqlx::query("UPDATE ll_job_state SET last_tick = last_tick - 600000 WHERE job = 'sec'").execute(&db.pool))
        .expect("move the last tick back");
    a.start();
    b.start();
    let shown = poll(
        "the missed ticks told",
        Duration::from_secs(20),
        || {
            let (code, out, _) = b.ctl(&["jobs", "show", "sec", "-o", "json"]);
            (code == 0).then(|| json_of(&out)).filter(|j| !j["last_missed"].is_null())
        },
        || format!("{}\n{}", a.log(), b.log()),
    );
    let m = &shown["last_missed"];
    let count = m["count"].as_u64().unwrap();
    assert!((500..=600).contains(&count), "{m}");
    assert_eq!(count, m["caught_up"].as_u64().unwrap() + m["skipped"].as_u64().unwrap() + m["outside_window"].as_u64().unwrap(), "{m}");
    assert!(m["outside_window"].as_u64().unwrap() > 350, "{m}");
    // Told once between the two: one counted it, the other did not.
    let counted: Vec<bool> = [&a, &b]
        .iter()
        .map(|w| {
            http_get(w.port, "/metrics")
                .map(|(_, body)| body)
                .unwrap_or_default()
                .contains(&format!("lamplighter_ticks_missed_total{{job=\"sec\"}} {count}"))
        })
        .collect();
    assert_eq!(counted.iter().filter(|c| **c).count(), 1, "one worker told them: {counted:?}");
    let rows = db.texts("SELECT count(*)::text FROM ll_missed_ticks WHERE job = 'sec'");
    assert_eq!(rows, ["1"]);
}

/// The jobs' share of a worker, as its `/metrics` says: (jobs it plans, workers dividing them).
fn share_of(w: &Worker) -> Option<(u64, u64)> {
    let (_, body) = http_get(w.port, "/metrics")?;
    let gauge = |name: &str| body.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok());
    Some((gauge("lamplighter_schedule_share ")?, gauge("lamplighter_schedule_workers ")?))
}

#[test]
fn workers_divide_the_schedule_and_no_tick_is_lost_or_doubled_as_they_join_and_leave() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "shares");
    let url = cluster.url_of("shares");
    const JOBS_N: usize = 24;
    let jobs: String = (0..JOBS_N)
        .map(|i| {
            format!(
                "\n    p{i:02}:\n      type: plugin\n      plugin: file-save\n      action: save\n      cron: \"* * * * * *\"\n      overlap: allow\n      retention: {{max_runs: 1000}}\n      parameters: {{path: p{i:02}.txt, content: x}}\n"
            )
        })
        .collect::<String>()
        + "\n    linger:\n      type: plugin\n      plugin: shell-exec\n      action: run\n      every: 24h\n      parameters: {command: \"sleep 2.5; echo done\"}\n";
    let mut ws: Vec<Worker> = ["s-a", "s-b", "s-c", "s-d"].iter().map(|n| worker_with(n, &url, 32, "3s", &jobs)).collect();
    let shares = |ws: &[&Worker], n: u64| {
        for w in ws {
            poll(
                &format!("a share of one of {n}"),
                Duration::from_secs(15),
                || share_of(w).filter(|(_, of)| *of == n),
                || format!("{:?}\n{}", share_of(w), w.log()),
            );
        }
    };
    ws[0].start();
    shares(&[&ws[0]], 1);
    // The per-second jobs and `linger`.
    let scheduled = JOBS_N as u64 + 1;
    assert_eq!(share_of(&ws[0]), Some((scheduled, 1)), "alone, a worker plans every job");
    // Two join.
    ws[1].start();
    ws[2].start();
    shares(&[&ws[0], &ws[1], &ws[2]], 3);
    let planned: Vec<u64> = ws[..3].iter().map(|w| share_of(w).unwrap().0).collect();
    assert_eq!(planned.iter().sum::<u64>(), scheduled, "each job planned by one of the three: {planned:?}");
    assert!(planned.iter().all(|n| *n > 0), "every worker has a share: {planned:?}");
    // Five seconds of ticks divided: each job's runs are fired by its owner, which runs them
    // itself (a free slot), so a job's runs are on one worker.
    let divided_from = now_ms() + 1000;
    db.wait_for("five seconds of divided ticks", Duration::from_secs(20), &[&ws[0]], |r| {
        r.iter().any(|r| r.scheduled_at.is_some_and(|t| t > divided_from + 5000))
    });
    let runs = db.runs();
    let mut ran_on: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.scheduled_at.is_some_and(|t| t > divided_from && t <= divided_from + 5000)) {
        ran_on.entry(&r.job).or_default().insert(r.worker.as_deref().unwrap_or("-"));
    }
    assert_eq!(ran_on.len(), JOBS_N, "{ran_on:?}");
    assert!(ran_on.values().all(|w| w.len() == 1), "each job on its owner: {ran_on:?}");
    let owners: std::collections::BTreeSet<&str> = ran_on.values().flatten().copied().collect();
    assert_eq!(owners.len(), 3, "{ran_on:?}");
    // B stops cleanly while a run of its own drains (2.5 s, within the 3 s grace, past the 2 s
    // fence of a worker that stopped renewing): its share moves at once, and it keeps its lease
    // through the drain and finishes the run. Then C is killed
    // (its share moves once its lease ran out), and D joins.
    let mut lingering = None;
    for _ in 0..20 {
        let id = trigger(&ws[1], "linger");
        let runs = db.wait_for("the linger run to start", Duration::from_secs(10), &[&ws[1]], |r| {
            r.iter().any(|r| r.id == id && r.status == "running")
        });
        if runs.iter().any(|r| r.id == id && r.worker.as_deref() == Some("s-b")) {
            lingering = Some(id);
            break;
        }
        assert_eq!(ws[1].ctl(&["runs", "cancel", &id]).0, 0);
    }
    let lingering = lingering.expect("B ran one of the linger runs itself");
    ws[1].signal("TERM");
    shares(&[&ws[0], &ws[2]], 2);
    assert!(ws[1].is_running(), "B still drains while its share has moved");
    assert_eq!(ws[1].wait_exit(Duration::from_secs(20)), Some(0));
    assert!(!ws[1].log().contains("fenced"), "B renewed its lease through its drain:\n{}", ws[1].log());
    assert_eq!(db.run(&lingering).map(|r| r.status), Some("succeeded".to_string()), "B's drained run ended as it ran");
    ws[2].signal("KILL");
    ws[2].wait_exit(Duration::from_secs(5));
    shares(&[&ws[0]], 1);
    ws[3].start();
    shares(&[&ws[0], &ws[3]], 2);
    let end = now_ms() + 3000;
    db.wait_for("three more seconds of ticks", Duration::from_secs(20), &[&ws[0], &ws[3]], |r| {
        r.iter().any(|r| r.scheduled_at.is_some_and(|t| t > end))
    });
    for i in [0, 3] {
        ws[i].signal("TERM");
        assert_eq!(ws[i].wait_exit(Duration::from_secs(20)), Some(0));
    }
    // Every second of every job, from its first tick to the last tick all of them reached,
    // fired once: across the join, the clean stop, the kill and the takeover.
    let runs = db.runs();
    let last_common = (0..JOBS_N)
        .map(|i| runs.iter().filter(|r| r.job == format!("p{i:02}")).filter_map(|r| r.scheduled_at).max().expect("ticks of every job"))
        .min()
        .unwrap();
    for i in 0..JOBS_N {
        let job = format!("p{i:02}");
        let mut ticks: BTreeMap<i64, usize> = BTreeMap::new();
        for r in runs.iter().filter(|r| r.job == job && r.trigger != "retry") {
            *ticks.entry(r.scheduled_at.unwrap()).or_default() += 1;
        }
        let doubled: Vec<(&i64, &usize)> = ticks.iter().filter(|(_, n)| **n > 1).collect();
        assert!(doubled.is_empty(), "{job}: ticks fired more than once: {doubled:?}");
        let first = *ticks.keys().next().unwrap();
        let missed: Vec<i64> = (0..=(last_common - first) / 1000).map(|k| first + k * 1000).filter(|t| !ticks.contains_key(t)).collect();
        assert!(missed.is_empty(), "{job}: ticks missed: {missed:?}");
        let bad: Vec<&Run> = runs.iter().filter(|r| r.job == job && !["succeeded", "interrupted"].contains(&r.status.as_str())).collect();
        assert!(bad.is_empty(), "{job}: every tick's run ran: {bad:#?}");
    }
    let on_d = runs.iter().filter(|r| r.worker.as_deref() == Some("s-d")).count();
    assert!(on_d > 0, "the worker that joined last ran ticks of its share");
}

/// Whether `w` notices its group's run outcomes, as its `/metrics` says.
fn noticer(w: &Worker) -> Option<bool> {
    let (_, body) = http_get(w.port, "/metrics")?;
    body.lines().find_map(|l| l.strip_prefix("lamplighter_outcomes_noticer ")?.trim().parse::<u8>().ok()).map(|v| v == 1)
}

/// One worker of a group notices the outcomes of every member's runs (and starts their `after`
/// jobs); killed, that role passes to a survivor once its lease has run out, and a run that
/// ended after the kill is noticed all the same, once.
#[test]
fn one_worker_notices_the_groups_outcomes_and_a_survivor_takes_that_over_from_a_killed_one() {
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "noticer");
    let url = cluster.url_of("noticer");
    let jobs = "\n    up:\n      type: plugin\n      plugin: file-save\n      action: save\n      every: 24h\n      parameters: {path: u.txt, content: u}\n    down:\n      type: plugin\n      plugin: file-save\n      action: save\n      after: [up]\n      parameters: {path: d.txt, content: d}\n";
    let (mut a, mut b) = (worker_with("n-a", &url, 2, "3s", jobs), worker_with("n-b", &url, 2, "3s", jobs));
    a.start();
    b.start();
    wait_ready(&[&a, &b], true, Duration::from_secs(20));
    let roles = poll(
        "one of the two to notice outcomes",
        Duration::from_secs(15),
        || {
            let roles = (noticer(&a)?, noticer(&b)?);
            (roles.0 != roles.1).then_some(roles)
        },
        || format!("{:?} {:?}\n{}\n{}", noticer(&a), noticer(&b), a.log(), b.log()),
    );
    let (mut gone, survivor) = if roles.0 { (a, b) } else { (b, a) };
    let succeeded = |runs: &[Run], job: &str| runs.iter().filter(|r| r.job == job && r.status == "succeeded").count();
    // Runs of `up` through both workers: each starts one of `down`, and only the noticer
    // starts them, wherever `up` ran.
    let mut ups = 0;
    for round in 0..4 {
        trigger(if round % 2 == 0 { &survivor } else { &gone }, "up");
        ups += 1;
        db.wait_for(&format!("{ups} runs of `down` to succeed"), Duration::from_secs(30), &[&gone, &survivor], |r| {
            succeeded(r, "down") >= ups
        });
    }
    let started = "started after its upstream jobs";
    assert_eq!(gone.log().matches(started).count(), 4, "the noticer started each `down`:\n{}", gone.log());
    assert_eq!(survivor.log().matches(started).count(), 0, "the other worker noticed nothing:\n{}", survivor.log());
    let before_kill = survivor.log().len();
    gone.signal("KILL");
    gone.wait_exit(Duration::from_secs(5));
    let up = trigger(&survivor, "up");
    ups += 1;
    let runs = db.wait_for("a `down` after the run of `up` since the kill", Duration::from_secs(30), &[&survivor], |r| {
        r.iter().any(|r| r.id == up && r.status == "succeeded") && succeeded(r, "down") >= ups
    });
    // Noticed by the survivor once it took the role over (the killed worker's lease is 3 s).
    poll("the survivor to say it notices outcomes", Duration::from_secs(10), || noticer(&survivor).filter(|n| *n), || survivor.log());
    let since = survivor.log()[before_kill..].to_owned();
    assert!(since.contains("this worker notices the outcomes of runs now") && since.contains(started), "{since}");
    let count = |job: &str| runs.iter().filter(|r| r.job == job).count();
    assert_eq!((count("up"), count("down")), (ups, ups), "one `down` a run of `up`, none doubled: {runs:#?}");
    let unseen = || db.texts("SELECT id FROM ll_runs WHERE finished_at IS NOT NULL AND outcome_seen IS NULL");
    poll("every ended run noticed", Duration::from_secs(10), || unseen().is_empty().then_some(()), || format!("{:?}", unseen()));
}

/// A queue drained by one worker: while the queue holds runs, each write of ends is also the
/// claim of as many runs, and it waits for the run of every slot held, those the last write
/// claimed and that have not started yet included. So a drain's write carries the ends (and
/// the claims) of the whole concurrency, not of the part of it that had started.
#[test]
fn a_drains_write_of_ends_carries_every_slots_run() {
    use lamplighter_jobs::events::InternalEvent;
    const DRAINED: &str = r#"
    drained:
      type: plugin
      plugin: file-read
      action: read
      cron: "0 0 1 1 *"
      retention: {max_runs: 100000}
      parameters: {path: tiny.txt}
"#;
    const CONCURRENCY: usize = 8;
    const RUNS: usize = 800;
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "drain");
    let url = cluster.url_of("drain");
    let mut w = worker_with("d-a", &url, CONCURRENCY as u32, "3s", DRAINED);
    std::fs::create_dir_all(w.dir.path().join("data")).unwrap();
    std::fs::write(w.dir.path().join("data/tiny.txt"), "ok").unwrap();
    // The first start migrates; the runs are queued while no worker is up, as manual triggers
    // leave them (due, in the queue), and the next start's look at the queue takes them.
    w.start();
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0), "{}", w.log());
    let at = now_ms();
    let queued = db.texts(&format!(
        "INSERT INTO ll_runs (id, job, trigger, status, due_at, enqueued_at, attempt, parameters, dispatched_at)
         SELECT '0190b000-0000-7000-8000-' || lpad(i::text, 12, '0'), 'drained', 'manual', 'queued', {at}, {at}, 1,
                '{{\"path\":\"tiny.txt\"}}', {at}
         FROM generate_series(1, {RUNS}) i RETURNING id"
    ));
    assert_eq!(queued.len(), RUNS);
    let file = w.dir.path().join("events.jsonl");
    w.args = vec!["--internal-events".into(), file.display().to_string()];
    w.start();
    db.wait_for("every queued run to succeed", Duration::from_secs(60), &[&w], |r| {
        r.iter().filter(|r| r.status == "succeeded").count() == RUNS
    });
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0), "{}", w.log());
    let events = internal_events(&std::fs::read_to_string(&file).expect("the events file"));
    // The ends of each write that claimed: the queue still held runs.
    let writes: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            InternalEvent::EndsRecorded { runs, claimed, .. } if *claimed > 0 => Some(*runs),
            _ => None,
        })
        .collect();
    let ended: usize = writes.iter().sum();
    assert!(ended >= RUNS / 2, "most ends were written with claims: {ended} of {RUNS} in {writes:?}");
    // A write that waited its whole time for a run that had not ended yet may carry fewer (a
    // loaded machine); most carry all.
    let whole = writes.iter().filter(|&&runs| runs == CONCURRENCY).count();
    assert!(
        whole * 4 >= writes.len() * 3,
        "at least 3 in 4 writes of ends and claims carry the ends of all {CONCURRENCY} slots' runs: {whole} of {}: {writes:?}",
        writes.len()
    );
}

/// A tick's many quick runs end one after another and their ends are written together, a few
/// writes a tick: each run's `finished_at` is still when it ended, not when the write that
/// recorded it went (which would give every run of a write the same one).
#[test]
fn a_runs_finished_at_is_its_own_end_not_its_writes() {
    use lamplighter_jobs::events::InternalEvent;
    const JOBS: usize = 300;
    let jobs: String = (0..JOBS)
        .map(|i| {
            format!(
                "\n    quick-{i}:\n      type: plugin\n      plugin: file-read\n      action: read\n      cron: \"* * * * * *\"\n      parameters: {{path: tiny.txt}}"
            )
        })
        .collect();
    let cluster = Cluster::start();
    let db = Db::new(&cluster, "ended");
    let url = cluster.url_of("ended");
    let mut w = worker_with("e-a", &url, JOBS as u32, "3s", &jobs);
    std::fs::create_dir_all(w.dir.path().join("data")).unwrap();
    std::fs::write(w.dir.path().join("data/tiny.txt"), "ok").unwrap();
    let file = w.dir.path().join("events.jsonl");
    w.args = vec!["--internal-events".into(), file.display().to_string()];
    w.start();
    db.wait_for("three ticks' runs to succeed", Duration::from_secs(60), &[&w], |r| {
        r.iter().filter(|r| r.status == "succeeded").count() >= 3 * JOBS
    });
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0), "{}", w.log());
    let events = internal_events(&std::fs::read_to_string(&file).expect("the events file"));
    let writes = events.iter().filter(|e| matches!(e, InternalEvent::EndsRecorded { .. })).count();
    let times = db.texts("SELECT finished_at::text FROM ll_runs WHERE status = 'succeeded' AND finished_at >= started_at");
    let succeeded = db.texts("SELECT id FROM ll_runs WHERE status = 'succeeded'").len();
    assert_eq!(times.len(), succeeded, "no run finished before it started");
    let distinct: std::collections::BTreeSet<&String> = times.iter().collect();
    assert!(
        distinct.len() > writes,
        "{succeeded} runs ended at {} distinct instants, written in {writes} writes: at most one instant a write is the write's time",
        distinct.len()
    );
}
