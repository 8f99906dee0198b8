//! The PostgreSQL queue is the runs' own rows. A run handed to the queue (queued, with its
//! `dispatched_at` set, as the hand-over and the tick transaction mark it) is taken by a claim
//! straight from `ll_runs`, in hand-over order, skipping rows another transaction holds (`FOR
//! UPDATE SKIP LOCKED`), so workers sharing the database never wait for each other and never
//! take the same run. An apalis-postgres task per run repeated what the row already says, at
//! the cost of an insert at the hand-over and a delete at the claim, each with its indexes:
//! apalis-postgres's schema is still migrated, no task is written to it, and the tasks an
//! earlier version left there (whose runs are such rows already) are dropped.

use super::PgStore;
use crate::store::dialect::sql;
use crate::store::{QUEUE, StoreError};

/// Nothing to write: the caller marked the runs of `ids` handed over, in its transaction, and
/// that mark is their place in the queue.
pub(crate) async fn push(_c: &mut sqlx::PgConnection, _ids: &[String]) -> Result<(), StoreError> {
    Ok(())
}

/// Picks up to `n` runs handed to the queue, first handed over first, skipping those another
/// transaction holds; locks them for the caller's claim in the same transaction. Returns how
/// many it picked and their ids.
pub(crate) async fn take(c: &mut sqlx::PgConnection, n: usize) -> Result<(usize, Vec<String>), StoreError> {
    let ids: Vec<String> = sqlx::query_scalar(sql!(PgStore, pick("$1", "")))
        .bind(n.max(1) as i64)
        .fetch_all(&mut *c)
        .await
        .map_err(|e| StoreError::new("taking runs from the queue", e))?;
    Ok((ids.len(), ids))
}

/// The runs a take claims, to be a materialized CTE: run once (as a subquery joined to the
/// claim's `UPDATE`, the planner may run it again per row, and each run skips what the last one
/// locked, so more than `limit` would be taken; seen with three workers). `limit` is a
/// placeholder; `and` a further condition (`AND …`) or empty. Read through the partial index
/// of the runs handed over (migration 0017), in its order.
pub(crate) fn pick(limit: &str, and: &str) -> String {
    handed_over("id", limit, and)
}

/// The columns `cols` of up to `limit` runs handed over that `and` admits, first handed over
/// first, locked, skipping those another transaction holds.
fn handed_over(cols: &str, limit: &str, and: &str) -> String {
    format!(
        "SELECT {cols} FROM ll_runs WHERE status = {{Queued}} AND dispatched_at IS NOT NULL {and}
         ORDER BY dispatched_at, id LIMIT {limit} FOR UPDATE SKIP LOCKED"
    )
}

/// [`pick`] from a place in the queue: first the runs after `(at, id)` (`at` and `id` are
/// placeholders of a hand-over time and a run id), then, if they are fewer than `limit`, those
/// up to it, first handed over first. `picked` (id, `dispatched_at`) is all of them, and
/// `ahead` those after the place.
///
/// Why: the partial index of the runs handed over keeps an entry of every run claimed until
/// vacuum, at its head, since runs leave in the index's order. A pick from the head walks them
/// all: in a drain of 50,000 runs, 400 pages a pick by the end (0.4 ms of a 1.5 ms write, seen
/// with `auto_explain`). Started where this worker's last pick ended, it reads live entries.
/// Runs handed over behind that place (how they come to be there: [`super::QueueHead`]) are
/// taken once those ahead do not fill the pick, or once the place is forgotten; the runs
/// behind are read from the index's head, as before.
pub(crate) fn pick_from(limit: &str, and: &str, at: &str, id: &str) -> String {
    let cols = "id, dispatched_at";
    format!(
        "ahead AS MATERIALIZED ({ahead}),
         picked AS MATERIALIZED (SELECT {cols} FROM ahead UNION ALL SELECT * FROM ({behind}) behind)",
        ahead = handed_over(cols, limit, &format!("AND (dispatched_at, id) > ({at}, {id}) {and}")),
        behind = handed_over(
            cols,
            &format!("greatest({limit} - (SELECT count(*) FROM ahead), 0)"),
            &format!("AND (dispatched_at, id) <= ({at}, {id}) {and}")
        ),
    )
}

/// Drops every task of our queue in apalis's table: none is written any more; those an earlier
/// version left name runs that the queue's rows hold already.
pub(crate) async fn forget_all(c: &mut sqlx::PgConnection) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM apalis.jobs WHERE job_type = $1")
        .bind(QUEUE)
        .execute(&mut *c)
        .await
        .map_err(|e| StoreError::new("clearing the queue", e))?;
    Ok(())
}

/// [`forget_all`], for the housekeeping.
pub(crate) async fn prune(pool: &sqlx::PgPool) -> Result<(), StoreError> {
    forget_all(&mut *pool.acquire().await.map_err(|e| StoreError::new("clearing the queue", e))?).await
}
