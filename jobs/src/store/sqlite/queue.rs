//! apalis-sqlite, used inside the store's transactions.

use apalis::prelude::{TaskBuilder, TaskId, WorkerContext};
use sqlx::SqlitePool;

use crate::store::StoreError;
use crate::store::{QUEUE, RunTask};

fn queue_error(what: &str, e: apalis_sqlite::Error) -> StoreError {
    StoreError::new(
        what,
        match e {
            apalis_sqlite::Error::Database(e) => e,
            other => sqlx::Error::Protocol(other.to_string()),
        },
    )
}

/// Pushes one task per run id (apalis's `push_tasks`). A new task id per hand-over, one
/// attempt each: retries are Lamplighter's. A task is due at once: its run's due time was
/// checked before the push. Its `run_at` is the epoch, not apalis's default of the wall clock
/// at the push, which the claim compares with the wall clock again: a task pushed while the
/// clock ran ahead and stepped back would stay unclaimable until the clock caught up, with
/// nothing to wake the intake then (seen in the chaos test).
pub(crate) async fn push(c: &mut sqlx::SqliteConnection, ids: &[String]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut tasks: Vec<apalis_sqlite::SqliteTask> = Vec::with_capacity(ids.len());
    for id in ids {
        tasks.push(
            TaskBuilder::new(RunTask::encode(id)?)
                .task_id(TaskId::from_ulid(ulid::Ulid::generate()))
                .max_attempts(1)
                .run_at_timestamp(0)
                .build(),
        );
    }
    apalis_sqlite::queries::push_tasks(&mut *c, QUEUE, &tasks).await.map_err(|e| queue_error("pushing to the queue", e))
}

/// Takes up to `n` due tasks with apalis's fetch query (its order: priority, due time, id)
/// and consumes them; returns how many it took and their run ids.
pub(crate) async fn take(c: &mut sqlx::SqliteConnection, n: usize, worker: &str) -> Result<(usize, Vec<String>), StoreError> {
    let config = apalis_sqlite::Config::default().queue(QUEUE).batch_size(n.max(1));
    let tasks = apalis_sqlite::queries::fetch_next(&mut *c, &config, &WorkerContext::new(worker))
        .await
        .map_err(|e| queue_error("fetching from the queue", e))?;
    if tasks.is_empty() {
        return Ok((0, Vec::new()));
    }
    let task_ids: Vec<String> = tasks.iter().filter_map(|t| t.task_id().map(|id| id.to_string())).collect();
    sqlx::query("DELETE FROM Jobs WHERE id IN (SELECT value FROM json_each(?1))")
        .bind(serde_json::to_string(&task_ids).unwrap_or_default())
        .execute(&mut *c)
        .await
        .map_err(|e| StoreError::new("consuming queue tasks", e))?;
    let ids = RunTask::run_ids(tasks.iter().map(|t| t.args.as_slice()));
    Ok((tasks.len(), ids))
}

/// Records `worker` in apalis's workers table (a task's lock names its taker). Idempotent;
/// a restart under the same name takes its row over.
pub(crate) async fn register(c: &mut sqlx::SqliteConnection, worker: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO Workers (id, worker_type, storage_name, layers, last_seen, started_at)
         VALUES (?1, ?2, 'SqliteStorage', 'lamplighter', strftime('%s', 'now'), strftime('%s', 'now'))
         ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, started_at = excluded.started_at",
    )
    .bind(worker)
    .bind(QUEUE)
    .execute(&mut *c)
    .await
    .map_err(|e| StoreError::new("registering with the queue", e))?;
    Ok(())
}

/// Drops every task of our queue (at start, when every queued run is handed over again).
pub(crate) async fn forget_all(c: &mut sqlx::SqliteConnection) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM Jobs WHERE job_type = ?1")
        .bind(QUEUE)
        .execute(&mut *c)
        .await
        .map_err(|e| StoreError::new("clearing the queue", e))?;
    Ok(())
}

/// Deletes finished tasks (apalis keeps them forever; the runs table is the history).
pub(crate) async fn prune(pool: &SqlitePool) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM Jobs WHERE job_type = ?1 AND status IN ('Done','Killed','Failed')")
        .bind(QUEUE)
        .execute(pool)
        .await
        .map_err(|e| StoreError::new("pruning the queue", e))?;
    Ok(())
}
