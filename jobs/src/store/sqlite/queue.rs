//! apalis-sqlite, used inside the store's transactions.

use apalis::prelude::{TaskBuilder, TaskId};

use crate::store::StoreError;
use crate::store::{QUEUE, RunTask};

/// Pushes one task per run id, as apalis's `push_tasks` writes them (its columns and
/// defaults), in one statement: apalis inserts task by task, and a thousand runs handed over
/// at once made a thousand round trips to the writer's thread (10 % of a drain's CPU,
/// measured in `cargo bench … runcore -- queue`). A new task id per hand-over, one attempt
/// each: retries are Lamplighter's.
///
/// A task is due at once: its run's due time was checked before the push. Its `run_at` is the
/// epoch, not apalis's default of the wall clock at the push, which a claim would compare with
/// the wall clock again: a task pushed while the clock ran ahead and stepped back would stay
/// unclaimable until the clock caught up, with nothing to wake the intake then (seen in the
/// chaos test).
pub(crate) async fn push(c: &mut sqlx::SqliteConnection, ids: &[String]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut rows: Vec<serde_json::Value> = Vec::with_capacity(ids.len());
    for id in ids {
        let task: apalis_sqlite::SqliteTask = TaskBuilder::new(RunTask::encode(id)?)
            .task_id(TaskId::from_ulid(ulid::Ulid::generate()))
            .max_attempts(1)
            .run_at_timestamp(0)
            .build();
        rows.push(serde_json::json!([
            hex(&task.args),
            task.task_id().map(ToString::to_string),
            task.max_attempts().unwrap_or(1),
            task.run_at().unwrap_or(0),
            task.priority().unwrap_or_default(),
            serde_json::to_string(task.metadata()).unwrap_or_default(),
            task.idempotency_key(),
        ]));
    }
    // `WHERE true`: SQLite's grammar needs it between a SELECT and an upsert clause.
    sqlx::query(
        "INSERT INTO Jobs (job, id, job_type, status, attempts, max_attempts, run_at, last_result, lock_at, lock_by, done_at,
                           priority, metadata, idempotency_key)
         SELECT unhex(value ->> 0), value ->> 1, ?1, 'Pending', 0, value ->> 2, value ->> 3, NULL, NULL, NULL, NULL,
                value ->> 4, value ->> 5, value ->> 6
         FROM json_each(?2) WHERE true
         ON CONFLICT (job_type, idempotency_key) DO NOTHING",
    )
    .bind(QUEUE)
    .bind(serde_json::Value::from(rows).to_string())
    .execute(&mut *c)
    .await
    .map_err(|e| StoreError::new("pushing to the queue", e))?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Takes and consumes up to `n` pending tasks in apalis's order (priority, due time, id), in
/// one statement (apalis's fetch marks them taken, and a second statement deleted them);
/// returns how many it took and their run ids. One connection writes: no other taker can
/// hold them. (`LIMIT +?2`: see [`crate::store::dialect::numbered`].)
pub(crate) async fn take(c: &mut sqlx::SqliteConnection, n: usize) -> Result<(usize, Vec<String>), StoreError> {
    static TAKE: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("DELETE FROM Jobs WHERE ROWID IN ({}) RETURNING job", pick("?1", "?2")));
    let payloads: Vec<Vec<u8>> = sqlx::query_scalar(TAKE.as_str())
        .bind(QUEUE)
        .bind(n.max(1) as i64)
        .fetch_all(&mut *c)
        .await
        .map_err(|e| StoreError::new("taking tasks from the queue", e))?;
    let ids = RunTask::run_ids(payloads.iter().map(Vec::as_slice));
    Ok((payloads.len(), ids))
}

/// The rowids of the first `n` pending tasks of queue `queue` (both placeholders), in
/// apalis's order: priority, due time, then the task id, which is unique, so the same
/// selection twice in one transaction picks the same tasks.
pub(crate) fn pick(queue: &str, n: &str) -> String {
    format!(
        "SELECT ROWID FROM Jobs WHERE job_type = {queue} AND status = 'Pending' AND lock_by IS NULL
         ORDER BY priority DESC, run_at ASC, id ASC LIMIT +{n}"
    )
}

/// The run id a task's payload (`job`, a `RunTask` as JSON bytes) names, in SQL; NULL for a
/// payload that is not JSON.
pub(crate) const RUN_ID_OF_PAYLOAD: &str = "CASE WHEN json_valid(CAST(job AS TEXT)) THEN CAST(job AS TEXT) ->> 'run_id' END";

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
pub(crate) async fn prune(c: &mut sqlx::SqliteConnection) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM Jobs WHERE job_type = ?1 AND status IN ('Done','Killed','Failed')")
        .bind(QUEUE)
        .execute(c)
        .await
        .map_err(|e| StoreError::new("pruning the queue", e))?;
    Ok(())
}
