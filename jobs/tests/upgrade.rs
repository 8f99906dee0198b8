//! Data outlives versions: a database written by the schema before run identity (migration
//! 0001 only, as the earlier commits of main left it) opens with today's engine and keeps its
//! runs, pauses and history; a run queued by the old version still runs.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lamplighter_jobs::{ManualClock, RunStatus};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use support::{config, finished, start, t0, until};

const QUICK: &str = "type: plugin\nplugin: file-save\naction: save\nparameters: { path: out.txt, content: x }";

fn ms(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_millis()
}

/// The database as the commit before migration 0002 left it: apalis's tables, Lamplighter's
/// first migration recorded in sqlx's table, and rows written with that version's columns.
async fn write_old_database(path: &std::path::Path) {
    std::fs::create_dir_all(path.parent().expect("data dir")).expect("mkdir");
    let opts = SqliteConnectOptions::new().filename(path).create_if_missing(true);
    let pool = SqlitePoolOptions::new().max_connections(1).connect_with(opts).await.expect("open");
    let mut apalis = apalis_sqlite::SqliteStorage::<()>::migrations();
    apalis.set_ignore_missing(true);
    apalis.run(&pool).await.expect("apalis migrations");
    let old = tempfile::tempdir().expect("tempdir");
    let first = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/sqlite/0001_lamplighter.sql");
    std::fs::copy(&first, old.path().join("0001_lamplighter.sql")).expect("copy migration");
    let mut ours = sqlx::migrate::Migrator::new(old.path()).await.expect("migrator");
    ours.set_ignore_missing(true);
    ours.run(&pool).await.expect("first migration");
    let insert = "INSERT INTO ll_runs (id, job, trigger, status, scheduled_at, due_at, enqueued_at, started_at, finished_at, attempt, parameters, output, worker)
                  VALUES (?1, 'j', ?2, ?3, ?4, ?5, ?5, ?6, ?7, 1, '{\"path\":\"out.txt\",\"content\":\"x\"}', ?8, 'old-worker')";
    let t = t0() - chrono::Duration::hours(2);
    sqlx::query(insert)
        .bind("0190a000-0000-7000-8000-000000000001")
        .bind("cron")
        .bind("succeeded")
        .bind(ms(t))
        .bind(ms(t))
        .bind(ms(t))
        .bind(ms(t + chrono::Duration::seconds(1)))
        .bind("{\"saved\":true}")
        .execute(&pool)
        .await
        .expect("old succeeded run");
    // Queued by the old version and never handed over: no snapshot, no root id.
    sqlx::query(insert)
        .bind("0190a000-0000-7000-8000-000000000002")
        .bind("manual")
        .bind("queued")
        .bind(None::<i64>)
        .bind(ms(t0() - chrono::Duration::minutes(1)))
        .bind(None::<i64>)
        .bind(None::<i64>)
        .bind(None::<String>)
        .execute(&pool)
        .await
        .expect("old queued run");
    sqlx::query("INSERT INTO ll_ticks (job, scheduled_at, run_id) VALUES ('j', ?1, '0190a000-0000-7000-8000-000000000001')")
        .bind(ms(t))
        .execute(&pool)
        .await
        .expect("old tick");
    sqlx::query("INSERT INTO ll_job_state (job, paused, pause_reason, paused_at, last_tick) VALUES ('j', 1, 'upgrade window', ?1, ?1)")
        .bind(ms(t))
        .execute(&pool)
        .await
        .expect("old pause");
    pool.close().await;
}

#[tokio::test]
async fn a_database_from_before_run_identity_keeps_its_runs_pauses_and_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &format!("cron: \"0 * * * *\"\n{QUICK}"));
    let lamplighter_config::StorageConfig::Sqlite { path } = &cfg.storage else { panic!("sqlite by default") };
    write_old_database(path).await;

    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&cfg, &clock).await;
    let old = engine.get_run("0190a000-0000-7000-8000-000000000001").await.expect("old run is kept");
    assert_eq!((old.status, old.attempt), (RunStatus::Succeeded, 1));
    assert_eq!(old.root_id, old.id, "an old run is its own root");
    assert_eq!(old.output, Some(serde_json::json!({"saved": true})));
    let job = engine.get_job("j", 1).await.expect("job");
    assert!(job.summary.paused, "the pause survives the upgrade");
    assert_eq!(job.summary.pause_reason.as_deref(), Some("upgrade window"));
    // The run the old version queued runs now, with the config in force (it has no snapshot).
    let r = until(&engine, "the old queued run to run", |r| r.len() == 2 && finished(r)).await;
    let queued = r.iter().find(|x| x.id.ends_with("0002")).expect("old queued run");
    assert_eq!(queued.status, RunStatus::Succeeded, "{r:#?}");
    assert_eq!(queued.root_id, queued.id);
    // The listing reads the migrated history through the newer (job, id) index and its
    // one-row reads: the pause, and the newest run as the job's last.
    let page = engine.list_jobs_page(None, 100).await.expect("listing");
    let listed = page.jobs.iter().find(|j| j.name == "j").expect("job j listed");
    assert_eq!((listed.paused, listed.pause_reason.as_deref()), (true, Some("upgrade window")));
    assert_eq!(listed.last_run.as_ref().map(|r| (r.id.as_str(), r.status)), Some((queued.id.as_str(), RunStatus::Succeeded)));
    engine.shutdown(Duration::from_secs(5)).await;
}
