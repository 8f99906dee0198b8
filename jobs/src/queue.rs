//! The queue: everything apalis. Runs that cannot start at once (no free slot when their tick
//! fired or their retry fell due) wait here as apalis tasks that carry only the run id; the
//! `ll_runs` row stays the truth about the run.
//!
//! - **Enqueue** happens inside the store transaction that makes the run due
//!   ([`sqlite::push`]: apalis-sqlite's own `push_tasks` on our transaction), so a run is never
//!   queued without its task, or the reverse.
//! - **The worker** ([`consume`]) takes as many tasks as there are free slots, with apalis's
//!   own fetch query, and claims their runs in the same transaction; the task is consumed there
//!   (the run row is the record from then on). One transaction per batch, not per run.
//! - **Pruning**: consumed tasks are deleted with the claim; [`sqlite::prune`] removes what
//!   other paths leave (tasks of cancelled runs, rows of older versions).
//!
//! apalis's own worker loop is not used: it acknowledges each task in a transaction of its own
//! (measured: ~380 runs/s at concurrency 32), while this loop needs one per batch.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::engine::Shared;
use crate::signals::{Receiver, Signal};

/// The apalis queue name (otherwise it would be the Rust type path).
pub(crate) const QUEUE: &str = "lamplighter-runs";

/// What travels through the queue: only the run id; the run row holds the rest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunTask {
    pub(crate) run_id: String,
}

/// Most tasks taken in one claim.
const BATCH: usize = 1024;

/// Takes queued runs into free slots until `stop`: woken when tasks are pushed; while tasks
/// remain it waits only for slots. No polling: a queue that came up short sleeps until the next
/// push wakes it.
pub(crate) async fn consume(shared: Arc<Shared>, mut signals: Receiver, stop: CancellationToken) {
    // Recovery dropped every task from before, and this receiver was subscribed before the
    // scheduler could push: the first push wakes it.
    let mut more = false;
    loop {
        if !more {
            let signal = tokio::select! {
                s = signals.recv() => match s { Some(s) => s, None => return },
                () = stop.cancelled() => return,
            };
            // One look covers every push so far.
            let pending = signals.drain();
            more = std::iter::once(signal).chain(pending).any(|s| matches!(s, Signal::TasksPushed | Signal::Lagged));
            if !more {
                continue;
            }
        }
        let tickets = tokio::select! {
            t = shared.executors().tickets_when_free(shared.gate(), BATCH) => t,
            () = stop.cancelled() => return,
        };
        // The gate is closed: nothing more is claimed; queued runs stay for the next start.
        if tickets.is_empty() {
            stop.cancelled().await;
            return;
        }
        let asked = tickets.len();
        let now = shared.clock().now();
        let began = std::time::Instant::now();
        match shared.store().claim_queued(asked, shared.worker_name(), now).await {
            Ok(taken) => {
                tracing::debug!(
                    asked,
                    tasks = taken.tasks,
                    runs = taken.runs.len(),
                    claim_us = began.elapsed().as_micros() as u64,
                    "claimed from the queue"
                );
                // A full batch: there may be more behind it.
                more = taken.tasks == asked;
                crate::executor::launch(&shared, taken.runs, tickets);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot take runs from the queue; retrying in 1 s");
                drop(tickets);
                more = true;
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

/// apalis-sqlite, used inside the store's transactions.
pub(crate) mod sqlite {
    use apalis::prelude::{TaskBuilder, TaskId, WorkerContext};
    use sqlx::{Sqlite, SqlitePool, Transaction};

    use super::{QUEUE, RunTask};
    use crate::store::StoreError;

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
    /// attempt each: retries are Lamplighter's.
    pub(crate) async fn push(tx: &mut Transaction<'_, Sqlite>, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut tasks: Vec<apalis_sqlite::SqliteTask> = Vec::with_capacity(ids.len());
        for id in ids {
            let args = serde_json::to_vec(&RunTask { run_id: id.clone() })
                .map_err(|e| StoreError::new("encoding a queue task", sqlx::Error::Protocol(e.to_string())))?;
            tasks.push(TaskBuilder::new(args).task_id(TaskId::from_ulid(ulid::Ulid::generate())).max_attempts(1).build());
        }
        apalis_sqlite::queries::push_tasks(&mut **tx, QUEUE, &tasks).await.map_err(|e| queue_error("pushing to the queue", e))
    }

    /// Takes up to `n` due tasks with apalis's fetch query (its order: priority, due time, id)
    /// and consumes them; returns how many it took and their run ids.
    pub(crate) async fn take(tx: &mut Transaction<'_, Sqlite>, n: usize, worker: &str) -> Result<(usize, Vec<String>), StoreError> {
        let config = apalis_sqlite::Config::default().queue(QUEUE).batch_size(n.max(1));
        let tasks = apalis_sqlite::queries::fetch_next(&mut **tx, &config, &WorkerContext::new(worker))
            .await
            .map_err(|e| queue_error("fetching from the queue", e))?;
        if tasks.is_empty() {
            return Ok((0, Vec::new()));
        }
        let task_ids: Vec<String> = tasks.iter().filter_map(|t| t.task_id().map(|id| id.to_string())).collect();
        sqlx::query("DELETE FROM Jobs WHERE id IN (SELECT value FROM json_each(?1))")
            .bind(serde_json::to_string(&task_ids).unwrap_or_default())
            .execute(&mut **tx)
            .await
            .map_err(|e| StoreError::new("consuming queue tasks", e))?;
        // A task that does not decode cannot name its run; it is consumed and the run, still
        // queued and dispatched, is handed over again at the next start.
        let ids = tasks
            .iter()
            .filter_map(|t| match serde_json::from_slice::<RunTask>(&t.args) {
                Ok(task) => Some(task.run_id),
                Err(e) => {
                    tracing::error!(error = %e, "a queue task does not decode; dropped");
                    None
                }
            })
            .collect();
        Ok((tasks.len(), ids))
    }

    /// Records `worker` in apalis's workers table (a task's lock names its taker). Idempotent;
    /// a restart under the same name takes its row over.
    pub(crate) async fn register(tx: &mut Transaction<'_, Sqlite>, worker: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO Workers (id, worker_type, storage_name, layers, last_seen, started_at)
             VALUES (?1, ?2, 'SqliteStorage', 'lamplighter', strftime('%s', 'now'), strftime('%s', 'now'))
             ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, started_at = excluded.started_at",
        )
        .bind(worker)
        .bind(QUEUE)
        .execute(&mut **tx)
        .await
        .map_err(|e| StoreError::new("registering with the queue", e))?;
        Ok(())
    }

    /// Drops every task of our queue (at start, when every queued run is handed over again).
    pub(crate) async fn forget_all(tx: &mut Transaction<'_, Sqlite>) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM Jobs WHERE job_type = ?1")
            .bind(QUEUE)
            .execute(&mut **tx)
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
}

/// apalis-postgres, used inside the store's transactions. Its tables live in the `apalis`
/// schema (migrated by [`apalis_postgres::PostgresStorage::setup`]'s migrations). Tasks are
/// pushed with apalis's own `push_tasks`; they are taken and consumed in one statement that
/// skips rows another worker holds, so workers sharing the queue never wait for each other
/// and never take the same task.
pub(crate) mod postgres {
    use apalis::prelude::{TaskBuilder, TaskId};
    use sqlx::{Postgres, Transaction};

    use super::{QUEUE, RunTask};
    use crate::store::StoreError;

    /// Pushes one task per run id (apalis's `push_tasks`), one attempt each: retries are
    /// Lamplighter's. `run_at` is a second in the past: apalis compares it with the server's
    /// `now()` (the transaction's start), and a task "due later" would be skipped by apalis's
    /// own fetch and its notification left out.
    pub(crate) async fn push(tx: &mut Transaction<'_, Postgres>, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let run_at =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs().saturating_sub(1)).unwrap_or_default();
        let mut tasks: Vec<apalis_postgres::PgTask> = Vec::with_capacity(ids.len());
        for id in ids {
            let args = serde_json::to_vec(&RunTask { run_id: id.clone() })
                .map_err(|e| StoreError::new("encoding a queue task", sqlx::Error::Protocol(e.to_string())))?;
            tasks.push(
                TaskBuilder::new(args).task_id(TaskId::from_ulid(ulid::Ulid::generate())).max_attempts(1).run_at_timestamp(run_at).build(),
            );
        }
        apalis_postgres::queries::push_tasks(&mut **tx, QUEUE, tasks).await.map_err(|e| {
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
    pub(crate) async fn take(tx: &mut Transaction<'_, Postgres>, n: usize) -> Result<(usize, Vec<String>), StoreError> {
        let payloads: Vec<Vec<u8>> = sqlx::query_scalar(
            // The pick is a materialized CTE, run once: as a subquery joined to the DELETE,
            // the planner may run it again per row, and each run skips what the last one
            // locked, so more than `n` tasks were taken (seen with three workers).
            "WITH picked AS MATERIALIZED (
                 SELECT id FROM apalis.jobs WHERE job_type = $1 AND status = 'Pending'
                 ORDER BY priority DESC, run_at ASC LIMIT $2 FOR UPDATE SKIP LOCKED)
             DELETE FROM apalis.jobs j USING picked WHERE j.id = picked.id RETURNING j.job",
        )
        .bind(QUEUE)
        .bind(n.max(1) as i64)
        .fetch_all(&mut **tx)
        .await
        .map_err(|e| StoreError::new("taking tasks from the queue", e))?;
        // A task that does not decode cannot name its run; it is consumed, and the run (still
        // queued and dispatched) is handed over again by recovery.
        let ids = payloads
            .iter()
            .filter_map(|p| match serde_json::from_slice::<RunTask>(p) {
                Ok(task) => Some(task.run_id),
                Err(e) => {
                    tracing::error!(error = %e, "a queue task does not decode; dropped");
                    None
                }
            })
            .collect();
        Ok((payloads.len(), ids))
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
}
