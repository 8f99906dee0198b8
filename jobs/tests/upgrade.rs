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
    let old = engine.service().get_run("0190a000-0000-7000-8000-000000000001").await.expect("old run is kept");
    assert_eq!((old.status, old.attempt), (RunStatus::Succeeded, 1));
    assert_eq!(old.root_id, old.id, "an old run is its own root");
    assert_eq!(old.output, Some(serde_json::json!({"saved": true})));
    let job = engine.service().get_job("j", 1).await.expect("job");
    assert!(job.summary.paused, "the pause survives the upgrade");
    assert_eq!(job.summary.pause_reason.as_deref(), Some("upgrade window"));
    // The run the old version queued runs now, with the config in force (it has no snapshot).
    let r = until(&engine, "the old queued run to run", |r| r.len() == 2 && finished(r)).await;
    let queued = r.iter().find(|x| x.id.ends_with("0002")).expect("old queued run");
    assert_eq!(queued.status, RunStatus::Succeeded, "{r:#?}");
    assert_eq!(queued.root_id, queued.id);
    // The listing reads the migrated history through the newer (job, id) index and its
    // one-row reads: the pause, and the newest run as the job's last.
    let page = engine.service().list_jobs_page(None, 100, None).await.expect("listing");
    let listed = page.jobs.iter().find(|j| j.name == "j").expect("job j listed");
    assert_eq!((listed.paused, listed.pause_reason.as_deref()), (true, Some("upgrade window")));
    assert_eq!(listed.last_run.as_ref().map(|r| (r.id.as_str(), r.status)), Some((queued.id.as_str(), RunStatus::Succeeded)));
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Our migrations whose file names sort at or before `upto`, applied as the release that had
/// only those left them (apalis's tables come with today's start).
async fn migrate_up_to<DB: sqlx::Database>(pool: &sqlx::Pool<DB>, backend: &str, upto: &str)
where
    <DB as sqlx::Database>::Connection: sqlx::migrate::Migrate,
{
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations").join(backend);
    let old = tempfile::tempdir().expect("tempdir");
    let mut n = 0;
    for entry in std::fs::read_dir(&src).expect("migrations") {
        let name = entry.expect("entry").file_name().into_string().expect("utf-8");
        if name.ends_with(".sql") && name.as_str() <= upto {
            std::fs::copy(src.join(&name), old.path().join(&name)).expect("copy");
            n += 1;
        }
    }
    assert!(n > 0, "no migrations up to {upto}");
    let mut ours = sqlx::migrate::Migrator::new(old.path()).await.expect("migrator");
    ours.set_ignore_missing(true);
    ours.run(pool).await.expect("the previous release's migrations");
}

/// A run and a pause as the previous release wrote them.
const OLD_RUN: &str = "INSERT INTO ll_runs (id, job, trigger, status, scheduled_at, due_at, enqueued_at, started_at, finished_at, attempt, output, worker)
                       VALUES ('0190a000-0000-7000-8000-00000000000a', 'j', 'cron', 'succeeded', $1, $1, $1, $1, $1, 1, '{\"saved\":true}', 'old-worker')";
/// A run (id `$2`) its caller gave an idempotency key, as the previous release wrote it.
const OLD_KEYED_RUN: &str = "INSERT INTO ll_runs (id, job, trigger, status, due_at, enqueued_at, finished_at, idempotency_key)
                             VALUES ($2, 'j', 'manual', 'skipped', $1, $1, $1, 'nightly-2026-11-27')";
const OLD_PAUSE: &str = "INSERT INTO ll_job_state (job, paused, pause_reason, paused_at, last_tick) VALUES ('j', true, 'kept', $1, $1)";

/// What the previous release's database must still show, and that runtime jobs work on it.
async fn the_previous_release_is_kept(cfg: &lamplighter_config::Config) {
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(cfg, &clock).await;
    let old = engine.service().get_run("0190a000-0000-7000-8000-00000000000a").await.expect("the old run is kept");
    assert_eq!((old.status, old.output.clone()), (RunStatus::Succeeded, Some(serde_json::json!({"saved": true}))));
    let job = engine.service().get_job("j", 1).await.expect("job");
    assert_eq!((job.summary.paused, job.summary.pause_reason.as_deref()), (true, Some("kept")));
    assert!(job.history.is_empty() && job.definition.is_none(), "a file job has no runtime history");
    let request = lamplighter_jobs::JobRequest {
        name: "added".into(),
        definition: serde_json::json!({"every": "1h", "plugin": "file-save", "action": "save"}),
        expected_version: None,
        dry_run: false,
        actor: "upgrade test".into(),
    };
    assert_eq!(engine.service().create_job(request).await.expect("runtime jobs work on the upgraded database").version, 1);
    assert_eq!(engine.service().get_job("added", 1).await.expect("added").history.len(), 1);
    engine.shutdown(Duration::from_secs(5)).await;
}

const MANAGED: &str = "worker:\n  mcp:\n    manage_jobs: {enabled: true}\n";

#[tokio::test]
async fn a_sqlite_database_of_the_previous_release_keeps_its_history_and_takes_runtime_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = support::config_with(dir.path(), MANAGED, &format!("cron: \"0 * * * *\"\n{QUICK}"));
    let lamplighter_config::StorageConfig::Sqlite { path } = &cfg.storage else { panic!("sqlite by default") };
    std::fs::create_dir_all(path.parent().expect("data dir")).expect("mkdir");
    let opts = SqliteConnectOptions::new().filename(path).create_if_missing(true);
    let pool = SqlitePoolOptions::new().max_connections(1).connect_with(opts).await.expect("open");
    migrate_up_to(&pool, "sqlite", "0010_listing_changes.sql").await;
    let t = ms(t0() - chrono::Duration::hours(1));
    sqlx::query(OLD_RUN).bind(t).execute(&pool).await.expect("old run");
    sqlx::query(OLD_PAUSE).bind(t).execute(&pool).await.expect("old pause");
    pool.close().await;
    the_previous_release_is_kept(&cfg).await;
}

#[tokio::test]
async fn a_postgres_database_of_the_previous_release_keeps_its_history_and_takes_runtime_jobs() {
    let cluster = lamplighter_tests::pg::Cluster::start();
    let pool = sqlx::PgPool::connect(&cluster.url()).await.expect("connect");
    migrate_up_to(&pool, "postgres", "0003_runs_by_job_and_id.sql").await;
    let t = ms(t0() - chrono::Duration::hours(1));
    sqlx::query(OLD_RUN).bind(t).execute(&pool).await.expect("old run");
    sqlx::query(OLD_PAUSE).bind(t).execute(&pool).await.expect("old pause");
    sqlx::query(OLD_KEYED_RUN).bind(t).bind("0190a000-0000-7000-8000-00000000000b").execute(&pool).await.expect("old keyed run");
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "framework:\n  data_dir: {}\n{MANAGED}scheduling:\n  storage:\n    provider: postgres\n    connection_string: \"{}\"\n  jobs:\n    j:\n      cron: \"0 * * * *\"\n      type: plugin\n      plugin: file-save\n      action: save\n",
        dir.path().join("data").display(),
        cluster.url()
    );
    std::fs::write(dir.path().join("lamplighter.yaml"), text).expect("write");
    let opts = lamplighter_config::LoadOptions {
        path: Some(dir.path().join("lamplighter.yaml")),
        cwd: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let cfg = lamplighter_config::load(&opts).unwrap_or_else(|e| panic!("{e}")).config;
    the_previous_release_is_kept(&cfg).await;
    // 0010 moved the idempotency keys to an index of the keyed runs only: a key recorded
    // before the upgrade still refuses a second run, and runs without one do not conflict.
    let full: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_constraint WHERE conname = 'll_runs_job_idempotency_key_key'")
        .fetch_one(&pool)
        .await
        .expect("constraints");
    assert_eq!(full, 0, "the unique constraint of every run is gone");
    let again = sqlx::query(OLD_KEYED_RUN).bind(t).bind("0190a000-0000-7000-8000-00000000000c").execute(&pool).await;
    assert!(again.is_err_and(|e| e.as_database_error().is_some_and(|d| d.is_unique_violation())), "the old key still holds");
    let unkeyed = "INSERT INTO ll_runs (id, job, trigger, status, due_at, enqueued_at) VALUES ($1, 'j', 'manual', 'skipped', 0, 0)";
    for id in ["0190a000-0000-7000-8000-00000000000d", "0190a000-0000-7000-8000-00000000000e"] {
        sqlx::query(unkeyed).bind(id).execute(&pool).await.expect("runs without a key never conflict");
    }
    pool.close().await;
}
