//! apalis-postgres, used inside the store's transactions. Its tables live in the `apalis`
//! schema (migrated by [`apalis_postgres::PostgresStorage::setup`]'s migrations). Tasks are
//! pushed with apalis's own `push_tasks`; they are taken and consumed in one statement that
//! skips rows another worker holds, so workers sharing the queue never wait for each other
//! and never take the same task.

use apalis::prelude::{TaskBuilder, TaskId};

use crate::store::StoreError;
use crate::store::{QUEUE, RunTask};

/// Pushes one task per run id (apalis's `push_tasks`), one attempt each: retries are
/// Lamplighter's. `run_at` is a second in the past: apalis compares it with the server's
/// `now()` (the transaction's start), and a task "due later" would be skipped by apalis's
/// own fetch and its notification left out.
pub(crate) async fn push(c: &mut sqlx::PgConnection, ids: &[String]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let run_at =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs().saturating_sub(1)).unwrap_or_default();
    let mut tasks: Vec<apalis_postgres::PgTask> = Vec::with_capacity(ids.len());
    for id in ids {
        tasks.push(
            TaskBuilder::new(RunTask::encode(id)?)
                .task_id(TaskId::from_ulid(ulid::Ulid::generate()))
                .max_attempts(1)
                .run_at_timestamp(run_at)
                .build(),
        );
    }
    apalis_postgres::queries::push_tasks(&mut *c, QUEUE, tasks).await.map_err(|e| {
        StoreError::new(
            "pushing to the queue",
            match e {
                apalis_postgres::Error::Database(e) => e,
                other => sqlx::Error::Protocol(other.to_string()),
            },
        )
    })
}

/// Takes and consumes up to `n` pending tasks in apalis's order (priority, then due time),
/// skipping those another transaction holds; returns how many it took and their run ids.
pub(crate) async fn take(c: &mut sqlx::PgConnection, n: usize) -> Result<(usize, Vec<String>), StoreError> {
    static TAKE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH picked AS MATERIALIZED ({}) DELETE FROM apalis.jobs j USING picked WHERE j.id = picked.id RETURNING j.job",
            pick("$1", "$2", "")
        )
    });
    let payloads: Vec<Vec<u8>> = sqlx::query_scalar(TAKE.as_str())
        .bind(QUEUE)
        .bind(n.max(1) as i64)
        .fetch_all(&mut *c)
        .await
        .map_err(|e| StoreError::new("taking tasks from the queue", e))?;
    let ids = RunTask::run_ids(payloads.iter().map(Vec::as_slice));
    Ok((payloads.len(), ids))
}

/// The tasks a take consumes, to be a materialized CTE: run once (as a subquery joined to the
/// `DELETE`, the planner may run it again per row, and each run skips what the last one locked,
/// so more than `n` tasks were taken; seen with three workers). `queue` and `limit` are
/// placeholders; `and` a further condition (`AND …`) or empty.
pub(crate) fn pick(queue: &str, limit: &str, and: &str) -> String {
    format!(
        "SELECT id FROM apalis.jobs WHERE job_type = {queue} AND status = 'Pending' {and}
         ORDER BY priority DESC, run_at ASC LIMIT {limit} FOR UPDATE SKIP LOCKED"
    )
}

/// A taken task's run id in SQL, from its payload `j.job` (the JSON [`RunTask::encode`]
/// writes: `{"run_id":"<uuid>"}`); NULL for any other payload. Such a task names no run: it is
/// consumed and counted, as [`RunTask::run_ids`] drops a payload that does not decode. The
/// pattern is an escape string (`E'…'`), so it reads the same whatever
/// `standard_conforming_strings` says.
pub(crate) const RUN_ID_OF_PAYLOAD: &str = r#"substring(encode(j.job, 'escape') FROM E'^\\{"run_id":"([^"\\\\]+)"\\}$')"#;

/// Drops every task of our queue.
pub(crate) async fn forget_all(c: &mut sqlx::PgConnection) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM apalis.jobs WHERE job_type = $1")
        .bind(QUEUE)
        .execute(&mut *c)
        .await
        .map_err(|e| StoreError::new("clearing the queue", e))?;
    Ok(())
}

/// Deletes finished tasks of our queue (none, unless something outside Lamplighter marks
/// them: tasks are deleted when taken).
pub(crate) async fn prune(pool: &sqlx::PgPool) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM apalis.jobs WHERE job_type = $1 AND status IN ('Done','Killed','Failed')")
        .bind(QUEUE)
        .execute(pool)
        .await
        .map_err(|e| StoreError::new("pruning the queue", e))?;
    Ok(())
}
