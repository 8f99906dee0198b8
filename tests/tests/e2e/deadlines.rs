//! Deadlines (SPEC §4a), with real workers on both backends: a tick waiting for a limit past
//! its `start_within` is told while it still waits; a run past its `finish_within` is told while
//! it still runs, and stopped where `on_miss: cancel`; a deadline met is silent; each miss is
//! told once (recorded, counted, notified), also across a kill -9 and the retry it causes.

use std::time::Duration;

use serde_json::Value;

use crate::support::{Worker, http_get, poll};

fn runs_of(w: &Worker, job: &str) -> Vec<Value> {
    w.ctl_json(&["runs", "list", "--job", job])["runs"].as_array().unwrap().clone()
}

fn trigger(w: &Worker, job: &str) -> String {
    w.ctl_json(&["jobs", "trigger", job])["run_id"].as_str().unwrap().to_owned()
}

/// Polls `runs show id` until `pred` holds of it; returns it.
fn show_until(w: &Worker, what: &str, id: &str, within: Duration, pred: impl Fn(&Value) -> bool) -> Value {
    poll(
        what,
        within,
        || Some(w.ctl_json(&["runs", "show", id])).filter(|r| pred(r)),
        || format!("{:#}\n{}", w.ctl_json(&["runs", "show", id]), w.log()),
    )
}

fn missed(run: &Value) -> Vec<(String, String)> {
    run["deadlines_missed"]
        .as_array()
        .map(|a| a.iter().map(|d| (d["deadline"].as_str().unwrap().to_owned(), d["action"].as_str().unwrap().to_owned())).collect())
        .unwrap_or_default()
}

fn deadline_notifications(run: &Value) -> usize {
    run["notifications"].as_array().map_or(0, |a| a.iter().filter(|n| n["event"] == "deadline_missed").count())
}

fn deadlines_are_told_once_while_runs_wait_or_run(storage: &str) {
    // Notifications go to a port nobody listens on: they are recorded (and retried), which is
    // what is checked; sending is the notifier's, tested elsewhere.
    let dead = crate::support::free_port();
    let jobs = "hog:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  limits: [wh]\n  parameters: {command: \"sleep 6\"}\n\
         slow:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  retries: {max: 1, backoff: fixed, initial: 1s}\n  deadline: {finish_within: 2s}\n  parameters: {command: \"sleep 8\"}\n\
         stopped:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  deadline: {finish_within: 2s, on_miss: cancel}\n  parameters: {command: \"sleep 60\"}\n\
         quick:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  deadline: {finish_within: 30s, finish_by: \"23:59\"}\n  parameters: {command: \"echo quick\"}\n";
    let mut w = Worker::new("");
    w.write_scheduling(
        "",
        &format!("{storage}limits: {{wh: 1}}\nnotify: [{{on: deadline_missed, to: {{webhook: \"http://127.0.0.1:{dead}/hook\"}}}}]\n"),
        jobs,
        "manage_jobs:\n  enabled: true\n",
    );
    w.start();

    // A tick that waits for the limit the hog holds: told while it still waits.
    let hog = trigger(&w, "hog");
    show_until(&w, "the hog to hold the limit", &hog, Duration::from_secs(20), |r| r["status"] == "running");
    let at = (chrono::Utc::now() + chrono::Duration::seconds(2)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let file = w.dir.path().join("waiter.yaml");
    std::fs::write(
        &file,
        format!("at: \"{at}\"\nlimits: [wh]\ndeadline: {{start_within: 1s}}\nplugin: file-save\naction: save\nparameters: {{path: w.txt, content: w}}\n"),
    )
    .unwrap();
    let (code, out, err) = w.ctl(&["jobs", "create", "waiter", "-f", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    let slow = trigger(&w, "slow");
    let stopped = trigger(&w, "stopped");
    let quick = trigger(&w, "quick");
    show_until(&w, "the quick run to succeed", &quick, Duration::from_secs(20), |r| r["status"] == "succeeded");

    let waiter = poll("the waiter's tick", Duration::from_secs(20), || runs_of(&w, "waiter").first().cloned(), || w.log());
    let waiter = waiter["id"].as_str().unwrap().to_owned();
    let seen = show_until(&w, "the waiter's start deadline told", &waiter, Duration::from_secs(20), |r| !missed(r).is_empty());
    assert_eq!(missed(&seen), [("start_within".to_string(), "notify".to_string())], "{seen:#}");
    assert_eq!(seen["status"], "queued", "told while it still waits for the limit: {seen:#}");
    assert_eq!(seen["deadlines_missed"][0]["tick"], at.as_str());
    let due = chrono::DateTime::parse_from_rfc3339(&at).unwrap() + chrono::Duration::seconds(1);
    assert_eq!(seen["deadlines_missed"][0]["due_at"], due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), "{seen:#}");

    let seen = show_until(&w, "the slow run's finish deadline told", &slow, Duration::from_secs(20), |r| !missed(r).is_empty());
    assert_eq!(missed(&seen), [("finish_within".to_string(), "notify".to_string())]);
    assert_eq!(seen["status"], "running", "told while it still runs: {seen:#}");
    let (code, text, _) = w.ctl(&["runs", "show", &slow]);
    assert_eq!(code, 0);
    assert!(text.contains("deadlines missed:") && text.contains("finish_within"), "{text}");

    let seen = show_until(&w, "the run past its deadline stopped", &stopped, Duration::from_secs(20), |r| r["status"] == "cancelled");
    assert_eq!(missed(&seen), [("finish_within".to_string(), "cancel".to_string())]);
    assert!(seen["error"].as_str().unwrap_or_default().contains("missed its deadline finish_within"), "{seen:#}");

    let body = poll(
        "the misses counted in /metrics",
        Duration::from_secs(10),
        || {
            http_get(w.port, "/metrics")
                .map(|(_, b)| b)
                .filter(|b| b.contains("lamplighter_deadline_missed_total{deadline=\"finish_within\",job=\"slow\"} 1"))
        },
        || http_get(w.port, "/metrics").map(|(_, b)| b).unwrap_or_default(),
    );
    assert!(body.contains("lamplighter_deadline_missed_total{deadline=\"start_within\",job=\"waiter\"} 1"), "{body}");

    // Killed while the slow run runs: its retry (the same identity) is past the deadline too,
    // and nothing is told again, by the worker started anew.
    assert_eq!(w.ctl_json(&["runs", "show", &slow])["status"], "running");
    w.signal("KILL");
    w.wait_exit(Duration::from_secs(10));
    w.start();
    poll(
        "the slow job's retry to end",
        Duration::from_secs(60),
        || {
            let runs = runs_of(&w, "slow");
            (runs.len() >= 2 && runs.iter().all(|r| !["queued", "running"].contains(&r["status"].as_str().unwrap()))).then_some(())
        },
        || format!("{:#?}\n{}", runs_of(&w, "slow"), w.log()),
    );
    // The retry ran for seconds under the new process's watcher (a pass a second), past the
    // deadline all along: had it told the miss again, it would show now.
    for id in [&slow, &stopped, &waiter] {
        let run = w.ctl_json(&["runs", "show", id]);
        assert_eq!(missed(&run).len(), 1, "told once: {run:#}");
        assert_eq!(deadline_notifications(&run), 1, "notified once: {run:#}");
    }
    let retry = runs_of(&w, "slow").into_iter().find(|r| r["id"] != slow.as_str()).expect("a retry");
    let retry = w.ctl_json(&["runs", "show", retry["id"].as_str().unwrap()]);
    assert_eq!(missed(&retry).len(), 1, "the retry shows its identity's miss, told once: {retry:#}");
    let quick = w.ctl_json(&["runs", "show", &quick]);
    assert_eq!((quick["status"].as_str(), missed(&quick).len()), (Some("succeeded"), 0), "a deadline met is silent: {quick:#}");
    let body = http_get(w.port, "/metrics").map(|(_, b)| b).unwrap_or_default();
    assert!(
        !body.contains("lamplighter_deadline_missed_total{deadline=\"finish_within\",job=\"slow\"}"),
        "the new process told nothing again: {body}"
    );
}

#[test]
fn deadlines_are_told_once_while_runs_wait_or_run_on_sqlite() {
    deadlines_are_told_once_while_runs_wait_or_run("");
}

#[test]
fn deadlines_are_told_once_while_runs_wait_or_run_on_postgres() {
    let cluster = lamplighter_tests::pg::Cluster::start();
    deadlines_are_told_once_while_runs_wait_or_run(&format!(
        "storage:\n  provider: postgres\n  connection_string: \"{}\"\n",
        cluster.url()
    ));
}

/// Ticks no worker fired on time: a worker down for ten minutes (its wall clock stepped past
/// them, libfaketime) tells them once when it starts again — how many, and what `catch_up`
/// did with them (the newest on time fires, those in the window are skipped by `latest`, the
/// older ones are outside it) — in `jobs show`, the metric and a notification; started once
/// more, it tells nothing again.
#[test]
fn ticks_missed_while_no_worker_was_up_are_told_once() {
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "+0\n").unwrap();
    let dead = crate::support::free_port();
    let mut w = Worker::new("");
    w.write_scheduling(
        "",
        &format!("notify: [{{on: missed, to: {{webhook: \"http://127.0.0.1:{dead}/hook\"}}}}]\n"),
        "sec:\n  cron: \"* * * * * *\"\n  catch_up: latest\n  catch_up_window: 3m\n  retention: {max_runs: 100}\n  type: plugin\n  plugin: file-save\n  action: save\n  parameters: {path: s.txt, content: s}\n",
        "",
    );
    w.env = vec![
        ("LD_PRELOAD".into(), crate::support::libfaketime().into()),
        ("FAKETIME_TIMESTAMP_FILE".into(), offset.display().to_string()),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
        ("DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    w.start();
    poll("a few ticks", Duration::from_secs(10), || (runs_of(&w, "sec").len() >= 2).then_some(()), || w.log());
    assert!(w.ctl_json(&["jobs", "show", "sec"])["last_missed"].is_null(), "nothing missed yet");
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
    std::fs::write(&offset, "+10m\n").unwrap();
    w.start();
    let job = poll(
        "the missed ticks told",
        Duration::from_secs(20),
        || Some(w.ctl_json(&["jobs", "show", "sec"])).filter(|j| !j["last_missed"].is_null()),
        || w.log(),
    );
    let m = &job["last_missed"];
    let n = |k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{k} in {m}"));
    // Ten minutes of a per-second job less the minute of grace: about 540, in two kinds.
    assert!((500..=600).contains(&n("count")), "{m}");
    assert_eq!(n("count"), n("caught_up") + n("skipped") + n("outside_window"), "{m}");
    assert_eq!(n("caught_up"), 0, "latest fired the newest tick, which was on time: {m}");
    assert!((100..=140).contains(&n("skipped")), "the two minutes of the window past the grace: {m}");
    assert!(n("outside_window") > 350, "{m}");
    let (code, text, _) = w.ctl(&["jobs", "show", "sec"]);
    assert_eq!(code, 0);
    assert!(text.contains("last missed:") && text.contains("no worker fired them on time"), "{text}");
    let body = http_get(w.port, "/metrics").map(|(_, b)| b).unwrap_or_default();
    assert!(body.contains(&format!("lamplighter_ticks_missed_total{{job=\"sec\"}} {}", n("count"))), "{body}");
    assert!(w.log().contains("ticks missed: no worker fired them on time"), "{}", w.log());

    // Started again (a second or two away: on time): nothing told again.
    let told_at = m["told_at"].clone();
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
    w.start();
    poll("ticks again", Duration::from_secs(10), || (runs_of(&w, "sec").len() >= 3).then_some(()), || w.log());
    assert_eq!(w.ctl_json(&["jobs", "show", "sec"])["last_missed"]["told_at"], told_at);
    let body = http_get(w.port, "/metrics").map(|(_, b)| b).unwrap_or_default();
    assert!(!body.contains("lamplighter_ticks_missed_total{job=\"sec\"}"), "told nothing again: {body}");
}
