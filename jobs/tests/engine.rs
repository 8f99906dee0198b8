//! The engine on a manual clock and a real SQLite file: catch-up after downtime, overlap,
//! pause across restarts, retention, jitter. Time moves only when a test moves it; the tests
//! wait (bounded) for the engine to act on each move, they never sleep to let time pass.

mod support;

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use lamplighter_contract::Run;
use lamplighter_jobs::{Engine, ManualClock, RunStatus, Trigger, TriggerRequest};

use support::{config, config_jobs, finished, minutes, runs, start, t0, until, until_of};

const QUICK: &str = "type: plugin\nplugin: file-save\naction: save\nparameters: { path: out.txt, content: x }";
const SLOW: &str = "type: plugin\nplugin: shell-exec\naction: run\nparameters: { command: \"sleep 30\", timeout_seconds: 60 }";

/// Runs the job once at t0+1m, stops, and restarts at t0+10m30s: the ticks of minutes 2..9
/// are more than a minute late (missed), minute 10 is 30 s late (on time).
async fn downtime(job_yaml: &str) -> Vec<Run> {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), job_yaml);
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    clock.set(t0() + minutes(1));
    until(&engine, "the first tick", |r| r.len() == 1 && finished(r)).await;
    engine.shutdown(Duration::from_secs(5)).await;
    drop(engine);

    clock.set(t0() + minutes(10) + chrono::Duration::seconds(30));
    let engine = start(&cfg, &clock).await;
    // The tick of minute 10 (30 s ago, inside its grace) is the newest due: `latest` and `skip`
    // fire it alone; `all` queues the missed ones before it.
    let r = until(&engine, "the tick of minute 10", |r| r.iter().any(|r| r.scheduled_at == Some(t0() + minutes(10))) && finished(r)).await;
    engine.shutdown(Duration::from_secs(5)).await;
    r
}

fn ticks(runs: &[Run], trigger: Trigger) -> Vec<i64> {
    runs.iter().filter(|r| r.trigger == trigger).map(|r| (r.scheduled_at.expect("tick") - t0()).num_minutes()).collect()
}

#[tokio::test]
async fn catch_up_skip_fires_nothing_missed() {
    let r = downtime(&format!("cron: \"* * * * *\"\ncatch_up: skip\n{QUICK}")).await;
    assert_eq!(ticks(&r, Trigger::Cron), [1, 10]);
    assert_eq!(ticks(&r, Trigger::CatchUp), Vec::<i64>::new());
}

#[tokio::test]
async fn catch_up_latest_fires_one_run_for_the_newest_due_tick() {
    let r = downtime(&format!("cron: \"* * * * *\"\ncatch_up: latest\n{QUICK}")).await;
    // Exactly one run after the downtime: the newest due tick, not also the last missed one.
    assert_eq!(ticks(&r, Trigger::CatchUp), Vec::<i64>::new());
    assert_eq!(ticks(&r, Trigger::Cron), [1, 10]);
}

/// Down past the grace of the newest tick too: `latest` catches that one up, alone.
#[tokio::test]
async fn catch_up_latest_catches_up_the_newest_tick_when_even_it_is_late() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &format!("cron: \"*/10 * * * *\"\ncatch_up: latest\n{QUICK}"));
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    clock.set(t0() + minutes(10));
    until(&engine, "the first tick", |r| r.len() == 1 && finished(r)).await;
    engine.shutdown(Duration::from_secs(5)).await;
    drop(engine);
    // Down through 10:20, 10:30 and 10:40; back at 10:45.
    clock.set(t0() + minutes(45));
    let engine = start(&cfg, &clock).await;
    let r = until(&engine, "the catch-up", |r| r.len() == 2 && finished(r)).await;
    assert_eq!(ticks(&r, Trigger::CatchUp), [40]);
    engine.scheduled_through_now().await;
    assert_eq!(runs(&engine).await.len(), 2, "one run for three missed ticks");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn catch_up_all_fires_every_missed_tick_in_order() {
    let r = downtime(&format!("cron: \"* * * * *\"\ncatch_up: all\n{QUICK}")).await;
    assert_eq!(ticks(&r, Trigger::CatchUp), [2, 3, 4, 5, 6, 7, 8, 9]);
    // Under the default `overlap: forbid` they queue behind each other instead of skipping.
    assert!(r.iter().all(|r| r.status == RunStatus::Succeeded), "{r:#?}");
    let starts: Vec<_> = r.iter().map(|r| r.started_at.expect("started")).collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "caught-up runs start in tick order");
}

#[tokio::test]
async fn catch_up_window_bounds_how_far_back() {
    // now = 10:10:30, window 5m → ticks at or after 10:05:30 are caught up: 6, 7, 8, 9.
    let r = downtime(&format!("cron: \"* * * * *\"\ncatch_up: all\ncatch_up_window: 5m\n{QUICK}")).await;
    assert_eq!(ticks(&r, Trigger::CatchUp), [6, 7, 8, 9]);
}

/// Starts the slow job at minute 1 and lets minute 2 tick while it runs.
async fn overlap(policy: &str) -> (Engine, Arc<ManualClock>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &format!("cron: \"* * * * *\"\noverlap: {policy}\n{SLOW}"));
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    clock.set(t0() + minutes(1));
    until(&engine, "the first run to start", |r| r.len() == 1 && r[0].status == RunStatus::Running).await;
    clock.set(t0() + minutes(2));
    (engine, clock, dir)
}

#[tokio::test]
async fn overlap_forbid_skips_the_tick_and_says_why() {
    let (engine, _clock, _dir) = overlap("forbid").await;
    let r = until(&engine, "the second tick", |r| r.len() == 2).await;
    assert_eq!(r[0].status, RunStatus::Running);
    assert_eq!(r[1].status, RunStatus::Skipped);
    let why = r[1].error.as_deref().unwrap_or_default();
    assert!(why.contains(&r[0].id) && why.contains("overlap: forbid"), "{why}");
    engine.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn overlap_allow_runs_both() {
    let (engine, _clock, _dir) = overlap("allow").await;
    until(&engine, "two runs at once", |r| r.len() == 2 && r.iter().all(|r| r.status == RunStatus::Running)).await;
    engine.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn overlap_replace_cancels_the_old_run() {
    let (engine, _clock, _dir) = overlap("replace").await;
    let r = until(&engine, "the old run cancelled, the new one running", |r| {
        r.len() == 2 && r[0].status == RunStatus::Cancelled && r[1].status == RunStatus::Running
    })
    .await;
    let why = r[0].error.as_deref().unwrap_or_default();
    assert!(why.contains(&r[1].id) && why.contains("overlap: replace"), "{why}");
    engine.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn overlap_queue_holds_the_tick_until_the_run_ends() {
    let (engine, _clock, _dir) = overlap("queue").await;
    let r = until(&engine, "the second run queued", |r| r.len() == 2).await;
    assert_eq!((r[0].status, r[1].status), (RunStatus::Running, RunStatus::Queued));
    // Held, not merely slow: after a full scheduler pass and its claims it is still queued.
    engine.scheduled_through_now().await;
    assert_eq!(runs(&engine).await[1].status, RunStatus::Queued);
    engine.service().cancel_run(&r[0].id).await.expect("cancel");
    until(&engine, "the held run to start", |r| r[0].status == RunStatus::Cancelled && r[1].status == RunStatus::Running).await;
    engine.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn pause_survives_a_restart_and_paused_ticks_do_not_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &format!("cron: \"* * * * *\"\n{QUICK}"));
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    engine.service().pause_job("j", Some("maintenance")).await.expect("pause");
    engine.shutdown(Duration::from_secs(5)).await;
    drop(engine);

    let engine = start(&cfg, &clock).await;
    let job = engine.service().get_job("j", 3).await.expect("get");
    assert!(job.summary.paused);
    assert_eq!(job.summary.pause_reason.as_deref(), Some("maintenance"));
    assert_eq!(job.summary.next_fire, None);
    clock.set(t0() + minutes(3));
    engine.scheduled_through_now().await;
    assert!(runs(&engine).await.is_empty(), "a paused job must not run");

    engine.service().resume_job("j").await.expect("resume");
    clock.set(t0() + minutes(4));
    let r = until(&engine, "a run after resume", |r| !r.is_empty() && finished(r)).await;
    // Resuming does not replay the paused minutes.
    assert_eq!(ticks(&r, Trigger::Cron), [4]);
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn retention_keeps_the_newest_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &format!("cron: \"* * * * *\"\nretention: {{ max_runs: 3 }}\n{QUICK}"));
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    for m in 1..=6 {
        clock.set(t0() + minutes(m));
        until(&engine, "the tick", |r| r.iter().any(|r| r.scheduled_at == Some(t0() + minutes(m))) && finished(r)).await;
    }
    // The housekeeper batches for 5 s (of the engine's clock) after runs finish.
    engine.scheduled_through_now().await;
    clock.set(t0() + minutes(6) + chrono::Duration::seconds(5));
    let r = until(&engine, "pruning to 3 runs", |r| r.len() == 3).await;
    assert_eq!(ticks(&r, Trigger::Cron), [4, 5, 6]);
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_busy_jobs_history_is_pruned_in_tenths_and_comes_down_to_max_runs_within_a_minute() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No tick within the test: the runs are started by hand while the clock stands still. `k`
    // keeps one run, so each of its runs is enough for a batch to prune it: its pruning shows
    // that a batch ran.
    let never = "cron: \"0 0 1 1 *\"\n";
    let (j, k) = (format!("{never}retention: {{ max_runs: 20 }}\n{QUICK}"), format!("{never}retention: {{ max_runs: 1 }}\n{QUICK}"));
    let cfg = config_jobs(dir.path(), &[("j", &j), ("k", &k)]);
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    let trigger = |job: &'static str, n: usize| {
        let engine = &engine;
        async move {
            for _ in 0..n {
                engine.service().trigger_job(job, TriggerRequest::default()).await.expect("trigger");
            }
        }
    };
    trigger("j", 23).await;
    until(&engine, "23 runs ended", |r| r.len() == 23 && finished(r)).await;
    // 23 runs gathered, more than a tenth of 20: the batch 5 s on prunes to the newest 20.
    clock.set(t0() + chrono::Duration::seconds(5));
    let kept = until(&engine, "pruning to 20 runs", |r| r.len() == 20).await;
    // One more run of `j` is fewer than its tenth (2): the next batch leaves it, and prunes `k`.
    trigger("j", 1).await;
    trigger("k", 2).await;
    until(&engine, "the 21st run ended", |r| r.len() == 21 && finished(r)).await;
    until_of(&engine, "k", "k's 2 runs ended", |r| r.len() == 2 && finished(r)).await;
    clock.set(t0() + chrono::Duration::seconds(10));
    until_of(&engine, "k", "k pruned to 1 run by the batch", |r| r.len() == 1).await;
    assert_eq!(runs(&engine).await.len(), 21, "j's one run waits for a tenth of its max_runs");
    // A minute after it ended, it is pruned all the same: the history does not stay above
    // `max_runs` once the job goes quiet.
    clock.set(t0() + chrono::Duration::seconds(65));
    let r = until(&engine, "pruning to 20 runs a minute on", |r| r.len() == 20).await;
    let ids = |r: &[Run]| r.iter().map(|r| r.id.clone()).collect::<std::collections::BTreeSet<_>>();
    let (before, after) = (ids(&kept), ids(&r));
    let oldest = before.first().expect("20 runs");
    assert_eq!(before.difference(&after).collect::<Vec<_>>(), [oldest], "the oldest kept run went, and only it");
    assert!(r.iter().all(|r| r.trigger == Trigger::Manual), "{r:#?}");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn jitter_delays_each_tick_by_a_stable_amount_within_the_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &format!("cron: \"* * * * *\"\njitter: 30s\n{QUICK}"));
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    let tick = t0() + minutes(1);
    let delay = lamplighter_jobs::jitter_for("j", tick, Duration::from_secs(30));
    assert!(delay < Duration::from_secs(30));
    assert_eq!(delay, lamplighter_jobs::jitter_for("j", tick, Duration::from_secs(30)), "stable per tick");
    let due = tick + chrono::Duration::from_std(delay).expect("small");
    if delay > Duration::ZERO {
        clock.set(due - chrono::Duration::milliseconds(1));
        engine.scheduled_through_now().await;
        assert!(runs(&engine).await.is_empty(), "must not fire before tick + jitter");
    }
    clock.set(due);
    let r = until(&engine, "the jittered run", |r| r.len() == 1 && finished(r)).await;
    assert_eq!(r[0].scheduled_at, Some(tick));
    assert_eq!(r[0].due_at, due);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Starts an engine on one job every minute and brings the clock within the lead of the first
/// tick: the scheduler's pass does the tick's transaction and holds it for the instant.
async fn held_tick(dir: &std::path::Path) -> (Engine, Arc<ManualClock>, lamplighter_config::Config, chrono::DateTime<Utc>) {
    let cfg = config(dir, &format!("cron: \"* * * * *\"\n{QUICK}"));
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    let tick = t0() + minutes(1);
    let mut held = engine.tick_held();
    // The lead is at least 2 ms.
    clock.set(tick - chrono::Duration::milliseconds(1));
    tokio::time::timeout(Duration::from_secs(10), held.wait_for(|h| *h == Some(tick)))
        .await
        .expect("the tick's transaction held within 10 s")
        .expect("the scheduler runs");
    assert!(runs(&engine).await.is_empty(), "a held tick is not seen before its instant");
    (engine, clock, cfg, tick)
}

#[tokio::test]
async fn a_tick_done_ahead_is_committed_at_its_instant_and_not_before() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (engine, clock, _, tick) = held_tick(dir.path()).await;
    clock.set(tick);
    let r = until(&engine, "the held tick's run", |r| r.len() == 1 && finished(r)).await;
    assert_eq!(r[0].scheduled_at, Some(tick));
    assert!(r[0].started_at.is_some_and(|s| s >= tick), "started at its instant or after: {:?}", r[0].started_at);
    assert_eq!(*engine.tick_held().borrow(), None);
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_held_tick_let_go_when_the_clock_steps_back_fires_once_when_due() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (engine, clock, _, tick) = held_tick(dir.path()).await;
    // Stepped back: the instant does not come within the lead and its slack (real time), so
    // the transaction is rolled back.
    clock.set(tick - minutes(10));
    tokio::time::timeout(Duration::from_secs(10), engine.tick_held().wait_for(Option::is_none))
        .await
        .expect("let go within 10 s")
        .expect("the scheduler runs");
    engine.scheduled_through_now().await;
    assert!(runs(&engine).await.is_empty(), "a tick let go leaves nothing");
    clock.set(tick);
    let r = until(&engine, "the tick, fired when due", |r| r.len() == 1 && finished(r)).await;
    assert_eq!(r[0].scheduled_at, Some(tick));
    clock.set(tick + chrono::Duration::seconds(30));
    engine.scheduled_through_now().await;
    assert_eq!(runs(&engine).await.len(), 1, "once");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_worker_stopped_while_a_tick_is_held_records_nothing_and_fires_it_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (engine, clock, cfg, tick) = held_tick(dir.path()).await;
    engine.shutdown(Duration::from_secs(5)).await;
    drop(engine);
    let engine = start(&cfg, &clock).await;
    assert!(runs(&engine).await.is_empty(), "the stop rolled the held tick back");
    clock.set(tick);
    let r = until(&engine, "the tick after the restart", |r| r.len() == 1 && finished(r)).await;
    assert_eq!(r[0].scheduled_at, Some(tick));
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn skipped_ticks_are_pruned_while_a_long_run_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &format!("cron: \"* * * * *\"\noverlap: forbid\nretention: {{ max_runs: 2 }}\n{SLOW}"));
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    clock.set(t0() + minutes(1));
    until(&engine, "the long run to start", |r| r.len() == 1 && r[0].status == RunStatus::Running).await;
    for m in 2..=6 {
        clock.set(t0() + minutes(m));
        until(&engine, "the skipped tick", |r| r.iter().any(|r| r.scheduled_at == Some(t0() + minutes(m)))).await;
    }
    // No run finishes, yet the history stays bounded: the running run and the 2 newest skips
    // (pruned after the housekeeper's 5 s of the engine's clock).
    clock.set(t0() + minutes(6) + chrono::Duration::seconds(5));
    let r = until(&engine, "pruning of skipped ticks", |r| r.len() == 3).await;
    assert_eq!(r[0].status, RunStatus::Running);
    assert_eq!(ticks(&r[1..], Trigger::Cron), [5, 6]);
    engine.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn every_fifteen_minutes_runs_through_the_repeated_autumn_hour() {
    // Issue 8: on 2026-10-25 Berlin falls back from 03:00 CEST to 02:00 CET; a `*/15` job
    // listed 00:45 then 02:00 UTC and did not run for 75 real minutes.
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &format!("cron: \"*/15 * * * *\"\ntimezone: Europe/Berlin\n{QUICK}"));
    let start_at = Utc.with_ymd_and_hms(2026, 10, 24, 23, 50, 0).single().expect("valid instant");
    let clock = Arc::new(ManualClock::new(start_at));
    let engine = start(&cfg, &clock).await;
    let job = engine.service().get_job("j", 10).await.expect("get");
    let shown: Vec<String> = job.next_fires.iter().map(|f| f.utc.format("%H:%M").to_string()).collect();
    assert_eq!(shown, ["00:00", "00:15", "00:30", "00:45", "01:00", "01:15", "01:30", "01:45", "02:00", "02:15"]);
    // The local times name both passes of 02:xx.
    assert_eq!(job.next_fires[3].local, "2026-10-25T02:45:00+02:00");
    assert_eq!(job.next_fires[4].local, "2026-10-25T02:00:00+01:00");

    // And the scheduler fires them: one run per quarter hour of real time, 01:00 and 01:15 UTC included.
    for q in 1..=6 {
        clock.set(start_at + minutes(10 + 15 * (q - 1)));
        until(&engine, "the quarter-hour run", |r| r.len() == q as usize && finished(r)).await;
    }
    let r = runs(&engine).await;
    let fired: Vec<String> = r.iter().filter_map(|r| r.scheduled_at).map(|t| t.format("%H:%M").to_string()).collect();
    assert_eq!(fired, ["00:00", "00:15", "00:30", "00:45", "01:00", "01:15"]);
    engine.shutdown(Duration::from_secs(5)).await;
}
