//! Jobs created, changed and deleted at runtime, on a manual clock: they fire like the files'
//! jobs (once per tick, across a restart), a stale change is refused, the files' jobs stay the
//! files', a bad definition is answered with every field named, and a backfill runs each
//! missing tick once, in order.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use lamplighter_jobs::{
    Engine, JobOrigin, JobRequest, ManualClock, Outcome, RunContext, RunFilter, RunStatus, ServiceError, Targets, Trigger,
};
use serde_json::{Value, json};

use support::{config_with, minutes, start, start_with, t0};

const MANAGED: &str = "worker:\n  mcp:\n    manage_jobs:\n      enabled: true\n";

fn request(name: &str, definition: Value) -> JobRequest {
    JobRequest { name: name.into(), definition, expected_version: None, dry_run: false, actor: "mcp client ana".into() }
}

fn save_every(period: &str) -> Value {
    json!({"every": period, "plugin": "file-save", "action": "save", "parameters": {"path": "r.txt", "content": "x"}})
}

async fn runs_of(engine: &Engine, job: &str) -> Vec<lamplighter_contract::Run> {
    let mut runs =
        engine.service().list_runs(RunFilter { job: Some(job.into()), limit: Some(500), ..Default::default() }).await.expect("list").runs;
    runs.sort_by_key(|r| (r.scheduled_at, r.enqueued_at));
    runs
}

/// Waits (10 s of real time at most) until the job's runs satisfy `pred`, reading them at each
/// change the engine announces.
async fn until_runs(
    engine: &Engine,
    job: &str,
    what: &str,
    pred: impl Fn(&[lamplighter_contract::Run]) -> bool,
) -> Vec<lamplighter_contract::Run> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut changes = engine.service().watch(lamplighter_jobs::Interest::Anything);
    loop {
        let r = runs_of(engine, job).await;
        if pred(&r) {
            return r;
        }
        if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
            panic!("timed out waiting for {what}; runs: {r:#?}");
        }
    }
}

fn at(m: i64) -> DateTime<Utc> {
    t0() + minutes(m)
}

#[tokio::test]
async fn a_runtime_job_fires_once_per_tick_across_a_restart_and_stops_when_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg =
        config_with(dir.path(), MANAGED, "every: 1h\ntype: plugin\nplugin: file-save\naction: save\nparameters: {path: j.txt, content: j}");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    assert!(engine.service().manages_jobs());

    let saved = engine.service().create_job(request("r", save_every("1m"))).await.expect("create");
    assert_eq!((saved.saved, saved.version, saved.job.name.as_str()), (true, 1, "r"));
    let fires: Vec<DateTime<Utc>> = saved.preview.as_ref().expect("a preview").next_fires.iter().map(|f| f.utc).collect();
    assert_eq!(fires.len(), 10);
    assert_eq!(fires[0], at(1), "fires from its creation on, nothing before");
    let listed = engine.service().list_jobs().await.expect("list");
    let r = listed.iter().find(|j| j.name == "r").expect("listed with the files' jobs");
    assert!(
        matches!(&r.origin, JobOrigin::Runtime { version: 1, created_by, created_at, .. } if created_by == "mcp client ana" && *created_at == t0()),
        "{:?}",
        r.origin
    );
    let j = listed.iter().find(|j| j.name == "j").expect("file job");
    assert!(matches!(&j.origin, JobOrigin::File { location: Some(l) } if l.contains("lamplighter.yaml:")), "{:?}", j.origin);

    clock.set(at(1));
    let r1 = until_runs(&engine, "r", "the first tick", |r| r.len() == 1 && r[0].status.is_final()).await;
    assert_eq!((r1[0].trigger, r1[0].scheduled_at, r1[0].status), (Trigger::Cron, Some(at(1)), RunStatus::Succeeded), "{r1:#?}");
    engine.shutdown(Duration::from_secs(5)).await;
    drop(engine);

    // Stored: a restart schedules it with no reload, from its last tick.
    let engine = start(&cfg, &clock).await;
    clock.set(at(2));
    let r2 = until_runs(&engine, "r", "the tick after the restart", |r| r.len() == 2 && r.iter().all(|r| r.status.is_final())).await;
    assert_eq!(r2.iter().map(|r| r.scheduled_at).collect::<Vec<_>>(), [Some(at(1)), Some(at(2))], "once per tick");

    // A stale version is refused, naming the current one; the right one reschedules at once.
    let mut change = request("r", save_every("5m"));
    change.expected_version = Some(7);
    let stale = engine.service().update_job(change.clone()).await.expect_err("stale");
    assert!(matches!(stale, ServiceError::Conflict(_)), "{stale:?}");
    assert!(stale.to_string().contains("is at version 1, not 7"), "{stale}");
    change.expected_version = Some(1);
    change.actor = "mcp client bo".into();
    let v2 = engine.service().update_job(change).await.expect("update");
    assert_eq!(v2.version, 2);
    clock.set(at(4));
    engine.scheduled_through_now().await;
    assert_eq!(runs_of(&engine, "r").await.len(), 2, "no longer every minute");
    clock.set(at(7));
    until_runs(&engine, "r", "the 5-minute tick", |r| r.len() == 3 && r.iter().all(|r| r.status.is_final())).await;
    let detail = engine.service().get_job("r", 3).await.expect("get");
    let history: Vec<(u64, &str, &str)> = detail.history.iter().map(|h| (h.version, h.action.as_str(), h.actor.as_str())).collect();
    assert_eq!(history, [(2, "update", "mcp client bo"), (1, "create", "mcp client ana")]);
    assert_eq!(detail.definition, Some(save_every("5m")));

    // Deleted: it stops firing; its runs stay; asking for it says who deleted it.
    let deleted = engine.service().delete_job("r", Some(2), false, "mcp client cy").await.expect("delete");
    assert_eq!(deleted.version, 3);
    clock.set(at(20));
    engine.scheduled_through_now().await;
    assert_eq!(runs_of(&engine, "r").await.len(), 3, "a deleted job does not fire");
    // Still shown, as deleted: its last definition, its history and its runs.
    let gone = engine.service().get_job("r", 1).await.expect("a deleted job is shown");
    assert!(matches!(&gone.summary.origin, JobOrigin::Deleted { version: 3, deleted_by, .. } if deleted_by == "mcp client cy"), "{gone:?}");
    assert!(gone.summary.disabled.as_deref().is_some_and(|d| d.starts_with("deleted by mcp client cy at ")), "{gone:?}");
    assert_eq!((gone.history.len(), gone.summary.next_fire, gone.definition.clone()), (3, None, Some(save_every("5m"))));
    assert_eq!(gone.counts.values().sum::<u64>(), 3, "its runs stay");
    // Its last schedule is shown as it was, not as "manual"; it still does not fire.
    assert_eq!(gone.summary.schedule.as_deref(), Some("every: 5m"), "{gone:?}");
    assert!(gone.next_fires.is_empty());
    assert!(engine.service().trigger_job("r", Default::default()).await.is_err(), "a deleted job cannot be triggered");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn the_files_jobs_stay_the_files_and_a_reload_may_not_take_a_runtime_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = "every: 1h\ntype: plugin\nplugin: file-save\naction: save\nparameters: {path: j.txt, content: j}";
    let cfg = config_with(dir.path(), MANAGED, job);
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    for e in [
        engine.service().create_job(request("j", save_every("1m"))).await.expect_err("create over a file job"),
        engine.service().update_job(request("j", save_every("1m"))).await.expect_err("update a file job"),
        engine.service().delete_job("j", None, false, "x").await.expect_err("delete a file job"),
    ] {
        assert!(matches!(e, ServiceError::ReadOnly { .. }), "{e:?}");
        assert!(e.to_string().contains("lamplighter.yaml:"), "names the file and line: {e}");
    }
    engine.service().create_job(request("r", save_every("1m"))).await.expect("create");
    // The files now define `r` too: refused, and the running config stays.
    let text = std::fs::read_to_string(dir.path().join("lamplighter.yaml")).expect("read");
    let taken = format!("{text}    r:\n      every: 1h\n      type: plugin\n      plugin: file-save\n      action: save\n");
    std::fs::write(dir.path().join("lamplighter.yaml"), taken).expect("write");
    let loaded = lamplighter_config::load(&lamplighter_config::LoadOptions {
        path: Some(dir.path().join("lamplighter.yaml")),
        cwd: None,
        ..Default::default()
    })
    .expect("loads");
    let refused = engine.reload(&loaded.config).expect_err("refused");
    assert!(refused.contains("job \"r\"") && refused.contains("takes the name of a runtime job"), "{refused}");
    assert!(matches!(engine.service().get_job("r", 1).await.expect("still there").summary.origin, JobOrigin::Runtime { .. }));
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_bad_definition_is_answered_with_every_field_named_and_nothing_saved() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config_with(dir.path(), MANAGED, "every: 1h\ntype: plugin\nplugin: file-save\naction: save");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    let errors = |e: ServiceError| match e {
        ServiceError::InvalidDefinition { errors, .. } => errors,
        other => panic!("not a definition error: {other:?}"),
    };
    let bad = engine
        .service()
        .create_job(request("r", json!({"cron": "61 * * * *", "timezone": "Mars/Olympus", "workflow": "nope"})))
        .await
        .expect_err("bad");
    let e = errors(bad);
    assert!(e.iter().any(|m| m.starts_with("cron: ")), "{e:#?}");
    assert!(e.iter().any(|m| m.starts_with("timezone: ")), "{e:#?}");
    assert!(e.iter().any(|m| m.starts_with("workflow: ")), "{e:#?}");
    let e = errors(
        engine
            .service()
            .create_job(request("r", json!({"every": "1m", "plugin": "file-save", "action": "shred"})))
            .await
            .expect_err("action"),
    );
    assert!(e[0].starts_with("action: plugin action \"file-save.shred\" does not exist; known actions: "), "{e:#?}");
    // shell-exec is not a runtime job's target unless the operator says so.
    let shell = json!({"every": "1m", "plugin": "shell-exec", "action": "run", "parameters": {"command": "rm -rf /"}});
    let e = errors(engine.service().create_job(request("r", shell)).await.expect_err("shell"));
    assert!(e[0].starts_with("action: runtime jobs may not run plugin shell-exec.run"), "{e:#?}");
    assert!(e[0].contains("worker.mcp.manage_jobs.targets allows: workflow:*, agent:*, and plugin:* but shell-exec"), "{e:#?}");
    let outside = json!({"every": "1m", "plugin": "file-save", "action": "save", "working_directory": "/etc"});
    let e = errors(engine.service().create_job(request("r", outside)).await.expect_err("outside"));
    assert!(e[0].starts_with("working_directory: \"/etc\" is not inside a folder"), "{e:#?}");
    let big = json!({"every": "1m", "plugin": "file-save", "action": "save", "parameters": {"content": "x".repeat(70_000)}});
    let e = errors(engine.service().create_job(request("r", big)).await.expect_err("big"));
    assert!(e[0].starts_with("definition: is 700") && e[0].contains("max_definition_bytes"), "{e:#?}");
    let e = errors(engine.service().create_job(request("a b", save_every("1m"))).await.expect_err("name"));
    assert!(e[0].starts_with("name: "), "{e:#?}");
    let e = errors(engine.service().create_job(request("r", json!("cron: [unclosed"))).await.expect_err("yaml"));
    assert!(e[0].starts_with("definition: the YAML text does not parse"), "{e:#?}");
    // YAML text is a definition too.
    let yaml = "every: 1m\nplugin: file-save\naction: save\nparameters: {path: y.txt, content: y}\n";
    let dry = JobRequest { dry_run: true, ..request("y", json!(yaml)) };
    let preview = engine.service().create_job(dry).await.expect("yaml compiles");
    assert!(!preview.saved);
    assert_eq!(preview.definition["parameters"]["path"], json!("y.txt"));
    assert!(engine.service().list_jobs().await.expect("list").iter().all(|j| j.name == "j"), "nothing was saved");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn management_is_off_unless_the_operator_turns_it_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config_with(dir.path(), "", "every: 1h\ntype: plugin\nplugin: file-save\naction: save");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    assert!(!engine.service().manages_jobs());
    let off = engine.service().create_job(request("r", save_every("1m"))).await.expect_err("off");
    assert_eq!(
        off.to_string(),
        "managing jobs at runtime is off on this worker; its operator can turn it on with worker.mcp.manage_jobs.enabled: true"
    );
    let off = engine.service().backfill_job("j", t0() - minutes(60), t0(), true).await.expect_err("off");
    assert!(matches!(off, ServiceError::ManagementOff));
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_runtime_job_whose_workflow_leaves_the_files_is_shown_disabled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workflows = "workflows:\n  w:\n    steps:\n      - {id: s, type: plugin, plugin: file-save, action: save, parameters: {path: w.txt, content: w}}\n";
    let cfg = config_with(dir.path(), &format!("{MANAGED}{workflows}"), "every: 1h\ntype: plugin\nplugin: file-save\naction: save");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    engine.service().create_job(request("r", json!({"every": "1m", "workflow": "w"}))).await.expect("create");
    let without = config_with(dir.path(), MANAGED, "every: 1h\ntype: plugin\nplugin: file-save\naction: save");
    engine.reload(&without).expect("a reload may drop a workflow");
    let r = engine.service().get_job("r", 1).await.expect("still listed");
    let why = r.summary.disabled.expect("disabled");
    assert!(why.starts_with("its definition does not compile against the config in force: workflow: "), "{why}");
    assert_eq!(r.summary.next_fire, None);
    let e = engine.service().trigger_job("r", Default::default()).await.expect_err("not triggerable");
    assert!(matches!(e, ServiceError::JobDisabled { .. }), "{e:?}");
    clock.set(at(3));
    engine.scheduled_through_now().await;
    assert!(runs_of(&engine, "r").await.is_empty(), "not scheduled");
    // Put back, it runs again.
    engine.reload(&cfg).expect("reload");
    assert_eq!(engine.service().get_job("r", 1).await.expect("get").summary.disabled, None);
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_delete_lets_runs_in_flight_finish_unless_asked_to_cancel_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allow_shell = "worker:\n  mcp:\n    manage_jobs:\n      enabled: true\n      targets: [\"plugin:shell-exec.*\"]\n      allowed_commands: [\"sleep *\"]\n";
    let cfg = config_with(dir.path(), allow_shell, "every: 1h\ntype: plugin\nplugin: file-save\naction: save");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    let sleeper = json!({"every": "1h", "plugin": "shell-exec", "action": "run", "parameters": {"command": "sleep 30"}});
    let saved = engine.service().create_job(request("s", sleeper.clone())).await.expect("create");
    let e = engine
        .service()
        .create_job(request("t", json!({"every": "1h", "plugin": "shell-exec", "action": "run", "allowed_commands": ["rm *"]})));
    let e = e.await.expect_err("a wider command list");
    assert!(e.to_string().contains("allowed_commands: \"rm *\" is not among the commands"), "{e}");
    assert_eq!(saved.version, 1);
    let run = engine.service().trigger_job("s", Default::default()).await.expect("trigger").run_id;
    support::until_run(&engine, &run, "the run to start", |r| r.status == RunStatus::Running).await;
    let deleted = engine.service().delete_job("s", Some(1), true, "mcp client ana").await.expect("delete");
    assert_eq!(deleted.cancelled_runs, vec![run.clone()]);
    let ended = support::ended(&engine, &run).await;
    assert_eq!(ended.status, RunStatus::Cancelled, "{ended:#?}");
    assert!(ended.error.as_deref().is_some_and(|e| e.contains("its job \"s\" was deleted by mcp client ana")), "{ended:#?}");
    // Without `cancel_runs`, a run in flight finishes as it would have.
    let short = json!({"every": "1h", "plugin": "shell-exec", "action": "run", "parameters": {"command": "sleep 1"}});
    engine.service().create_job(request("short", short)).await.expect("create");
    let run = engine.service().trigger_job("short", Default::default()).await.expect("trigger").run_id;
    support::until_run(&engine, &run, "the run to start", |r| r.status == RunStatus::Running).await;
    assert!(engine.service().delete_job("short", None, false, "mcp client ana").await.expect("delete").cancelled_runs.is_empty());
    assert_eq!(support::ended(&engine, &run).await.status, RunStatus::Succeeded);
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Records the ticks it runs, and how many ran at once.
#[derive(Default)]
struct Recording {
    ticks: Mutex<Vec<Option<DateTime<Utc>>>>,
    running: AtomicUsize,
    most: AtomicUsize,
}

struct Recorder(Arc<Recording>);

impl Targets for Recorder {
    fn run(&self, ctx: RunContext) -> BoxFuture<'static, Outcome> {
        let me = self.0.clone();
        let now = me.running.fetch_add(1, Ordering::SeqCst) + 1;
        me.most.fetch_max(now, Ordering::SeqCst);
        me.ticks.lock().expect("lock").push(ctx.run().scheduled_at);
        Box::pin(async move {
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
            me.running.fetch_sub(1, Ordering::SeqCst);
            Outcome::Succeeded { output: json!({}) }
        })
    }
}

#[tokio::test]
async fn a_backfill_runs_each_missing_tick_once_in_order_one_at_a_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config_with(dir.path(), MANAGED, "cron: \"*/10 * * * *\"\ntype: plugin\nplugin: test\naction: record\noverlap: allow");
    let clock = Arc::new(ManualClock::new(t0()));
    let rec = Arc::new(Recording::default());
    let engine = start_with(&cfg, &clock, Arc::new(Recorder(rec.clone()))).await;
    for m in [10, 20, 30] {
        clock.set(at(m));
        until_runs(&engine, "j", "a tick", |r| r.len() == (m / 10) as usize && r.iter().all(|r| r.status.is_final())).await;
    }
    // 09:00–10:30: ten ticks, three of which ran.
    let dry = engine.service().backfill_job("j", at(-60), at(30), true).await.expect("dry run");
    assert_eq!((dry.ticks.len(), dry.created, dry.ticks.iter().filter(|t| t.existing).count()), (10, 7, 3));
    assert_eq!(runs_of(&engine, "j").await.len(), 3, "a dry run creates nothing");
    let future = engine.service().backfill_job("j", at(-60), at(90), true).await.expect_err("future");
    assert!(future.to_string().contains("is in the future"), "{future}");

    let before = rec.ticks.lock().expect("lock").len();
    let done = engine.service().backfill_job("j", at(-60), at(30), false).await.expect("backfill");
    assert_eq!(done.created, 7);
    let runs = until_runs(&engine, "j", "the backfill", |r| r.len() == 10 && r.iter().all(|r| r.status == RunStatus::Succeeded)).await;
    let backfilled: Vec<Option<DateTime<Utc>>> = runs.iter().filter(|r| r.trigger == Trigger::Backfill).map(|r| r.scheduled_at).collect();
    assert_eq!(backfilled, (0..7).map(|i| Some(at(-60 + 10 * i))).collect::<Vec<_>>());
    let ran: Vec<Option<DateTime<Utc>>> = rec.ticks.lock().expect("lock")[before..].to_vec();
    assert_eq!(ran, backfilled, "in tick order");
    assert_eq!(rec.most.load(Ordering::SeqCst), 1, "one at a time");
    // Again: every tick has its run.
    let again = engine.service().backfill_job("j", at(-60), at(30), false).await.expect("again");
    assert_eq!((again.created, again.ticks.iter().all(|t| t.existing)), (0, true));
    // Within the bound.
    let wide = engine.service().backfill_job("j", at(-60 * 24 * 3), at(30), true).await.expect_err("too many");
    assert!(wide.to_string().contains("more than the 100 worker.mcp.manage_jobs.max_backfill allows"), "{wide}");
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Holds every backfill run until released; live runs pass at once.
struct Gate(Arc<tokio::sync::Semaphore>);

impl Targets for Gate {
    fn run(&self, ctx: RunContext) -> BoxFuture<'static, Outcome> {
        let gate = self.0.clone();
        let backfill = ctx.run().trigger == Trigger::Backfill;
        Box::pin(async move {
            if backfill {
                let _permit = gate.acquire().await.expect("gate");
            }
            Outcome::Succeeded { output: json!({}) }
        })
    }
}

#[tokio::test]
async fn a_backfill_leaves_live_ticks_alone_and_stops_where_retention_or_a_pause_would_lose_ticks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg =
        config_with(dir.path(), MANAGED, "cron: \"*/10 * * * *\"\ntype: plugin\nplugin: test\naction: gate\nretention: {max_runs: 6}");
    let clock = Arc::new(ManualClock::new(t0()));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let engine = start_with(&cfg, &clock, Arc::new(Gate(gate.clone()))).await;
    // A paused job's backfilled ticks would be recorded skipped, and then count as ran.
    engine.service().pause_job("j", None).await.expect("pause");
    let paused = engine.service().backfill_job("j", at(-30), at(-1), false).await.expect_err("paused");
    assert!(paused.to_string().contains("is paused"), "{paused}");
    engine.service().resume_job("j").await.expect("resume");

    let done = engine.service().backfill_job("j", at(-30), at(-1), false).await.expect("backfill");
    assert_eq!(done.created, 3);
    until_runs(&engine, "j", "the first backfill run to hold", |r| r.iter().any(|r| r.status == RunStatus::Running)).await;
    // The live tick fires while the backfill holds (overlap: forbid counts only live runs).
    clock.set(at(10));
    let runs = until_runs(&engine, "j", "the live tick", |r| r.iter().any(|r| r.trigger == Trigger::Cron && r.status.is_final())).await;
    let live = runs.iter().find(|r| r.trigger == Trigger::Cron).expect("live run");
    assert_eq!(live.status, RunStatus::Succeeded, "not skipped for the backfill: {runs:#?}");
    gate.add_permits(10);
    until_runs(&engine, "j", "the backfill to finish", |r| {
        r.iter().filter(|r| r.trigger == Trigger::Backfill && r.status == RunStatus::Succeeded).count() == 3
    })
    .await;
    // Six runs reach `max_runs: 6`: older than the oldest kept, a tick's run may be gone.
    clock.set(at(20));
    until_runs(&engine, "j", "another tick", |r| r.len() >= 5 && r.iter().all(|r| r.status.is_final())).await;
    clock.set(at(30));
    until_runs(&engine, "j", "a sixth run", |r| r.len() >= 6 && r.iter().all(|r| r.status.is_final())).await;
    let wide = engine.service().backfill_job("j", at(-120), at(-31), true).await.expect_err("before retention");
    assert!(wide.to_string().contains("retention keeps"), "{wide}");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn bounds_tightened_by_a_reload_disable_the_runtime_jobs_outside_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = "every: 1h\ntype: plugin\nplugin: file-save\naction: save";
    let cfg = config_with(dir.path(), MANAGED, job);
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    engine.service().create_job(request("r", save_every("1m"))).await.expect("create");
    let tight = config_with(dir.path(), "worker:\n  mcp:\n    manage_jobs:\n      enabled: true\n      targets: [\"workflow:*\"]\n", job);
    engine.reload(&tight).expect("reload");
    let why = engine.service().get_job("r", 1).await.expect("listed").summary.disabled.expect("disabled");
    assert!(why.contains("runtime jobs may not run plugin file-save.save"), "{why}");
    clock.set(at(2));
    engine.scheduled_through_now().await;
    assert!(runs_of(&engine, "r").await.is_empty(), "outside the bounds, it does not fire");
    engine.shutdown(Duration::from_secs(5)).await;
}
