//! Runtime jobs: their definitions, one change at a time with its history.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{Dialect, Record, Stmt, sql};
use super::scripts::*;
use super::{ChangeRequest, Changed, JobChangeRecord, Refused, StoreError, StoredJob, from_ms, ms};
use crate::definitions::{Change, decide_change};

#[async_trait]
pub(crate) trait Definitions: Send + Sync + std::fmt::Debug {
    /// Every runtime job, by name.
    async fn runtime_jobs(&self) -> Result<Vec<StoredJob>, StoreError>;
    /// One runtime job.
    async fn runtime_job(&self, name: &str) -> Result<Option<StoredJob>, StoreError>;
    /// Creates, updates or deletes a runtime job, in one transaction with its history entry,
    /// one change at a time across writers. A create starts the job's state afresh (no pause,
    /// no last tick of an earlier job of the name: its schedule begins at its creation); a delete
    /// drops it.
    async fn change_job(&self, req: &ChangeRequest<'_>, now: DateTime<Utc>) -> Result<Result<Changed, Refused>, StoreError>;
    /// A job's changes, newest first.
    async fn job_history(&self, name: &str, limit: usize) -> Result<Vec<JobChangeRecord>, StoreError>;
}

#[async_trait]
impl<D: Dialect> Definitions for D {
    async fn runtime_jobs(&self) -> Result<Vec<StoredJob>, StoreError> {
        let q = Stmt::new(sql!(D, format!("SELECT {DEFINITION_COLS} FROM ll_job_definitions ORDER BY name")), "reading runtime jobs");
        Ok(D::fetch_all(&mut *self.reader().await?, q).await?.iter().map(stored_job_from_row).collect())
    }

    async fn runtime_job(&self, name: &str) -> Result<Option<StoredJob>, StoreError> {
        let q = Stmt::new(sql!(D, format!("SELECT {DEFINITION_COLS} FROM ll_job_definitions WHERE name = $1")), "reading a runtime job");
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(name)).await?.as_ref().map(stored_job_from_row))
    }

    async fn change_job(&self, req: &ChangeRequest<'_>, now: DateTime<Utc>) -> Result<Result<Changed, Refused>, StoreError> {
        let at = ms(now);
        let mut tx = self.begin().await?;
        // "" is no job's name: it stands for the table, so that changes (and the count a create
        // checks) go one at a time across writers; the name itself orders them with its ticks.
        D::lock_jobs(&mut tx, &["", req.name]).await?;
        let q = Stmt::new(sql!(D, format!("SELECT {DEFINITION_COLS} FROM ll_job_definitions WHERE name = $1")), "reading a runtime job");
        let current = D::fetch_optional(&mut tx, q.bind(req.name)).await?.as_ref().map(stored_job_from_row);
        let q = Stmt::new(sql!(D, "SELECT coalesce(max(version), 0) AS v FROM ll_job_history WHERE job = $1"), "reading a job's history");
        let last = D::fetch_optional(&mut tx, q.bind(req.name)).await?.map_or(0, |r| r.int("v").max(0) as u64);
        // Only a create of a new name is bounded by the count: only then is it read.
        let jobs = if matches!(req.change, Change::Create { .. }) && current.is_none() {
            let q = Stmt::new(sql!(D, "SELECT count(*) AS n FROM ll_job_definitions"), "counting runtime jobs");
            D::fetch_optional(&mut tx, q).await?.map_or(0, |r| r.int("n").max(0) as u64)
        } else {
            0
        };
        let version = match decide_change(&req.change, current.as_ref(), last, jobs) {
            Ok(v) => v as i64,
            Err(refused) => {
                D::rollback(tx).await?;
                return Ok(Err(refused));
            }
        };
        let before = current.as_ref().map(|c| c.definition.to_string());
        let (after, changed) = match req.change {
            Change::Create { definition, .. } => {
                let text = definition.to_string();
                let q = Stmt::new(
                    sql!(
                        D,
                        "INSERT INTO ll_job_definitions (name, definition, version, created_by, created_at, updated_by, updated_at)
                         VALUES ($1, $2, $3, $4, $5, $4, $5)"
                    ),
                    "saving a runtime job",
                );
                D::execute(&mut tx, q.bind(req.name).bind(text.as_str()).bind(version).bind(req.actor).bind(at)).await?;
                // A new job's schedule begins at its creation, recorded with it: every worker plans
                // from there, so one that hears of the job a little late (a signal, a replan after
                // the clock moved) still fires its first tick. A name deleted and created again
                // starts afresh: no pause, no ticks of before to catch up.
                let q = Stmt::new(
                    sql!(
                        D,
                        "INSERT INTO ll_job_state (job, paused, pause_reason, paused_at, last_tick) VALUES ($1, $2, NULL, NULL, $3)
                         ON CONFLICT (job) DO UPDATE SET paused = $2, pause_reason = NULL, paused_at = NULL, last_tick = $3"
                    ),
                    "starting a job's state",
                );
                D::execute(&mut tx, q.bind(req.name).bind(false).bind(at)).await?;
                forget_upstream_outcomes::<D>(&mut tx, req.name).await?;
                let job = StoredJob {
                    name: req.name.to_owned(),
                    definition: definition.clone(),
                    version: version as u64,
                    created_by: req.actor.to_owned(),
                    created_at: from_ms(at),
                    updated_by: req.actor.to_owned(),
                    updated_at: from_ms(at),
                };
                (Some(text), Changed::Saved(job))
            }
            Change::Update { definition, .. } => {
                let text = definition.to_string();
                let q = Stmt::new(
                    sql!(
                        D,
                        "UPDATE ll_job_definitions SET definition = $2, version = $3, updated_by = $4, updated_at = $5 WHERE name = $1"
                    ),
                    "saving a runtime job",
                );
                D::execute(&mut tx, q.bind(req.name).bind(text.as_str()).bind(version).bind(req.actor).bind(at)).await?;
                let mut job = current.clone().expect("checked above");
                job.definition = definition.clone();
                job.version = version as u64;
                job.updated_by = req.actor.to_owned();
                job.updated_at = from_ms(at);
                (Some(text), Changed::Saved(job))
            }
            Change::Delete { .. } => {
                let q = Stmt::new(sql!(D, "DELETE FROM ll_job_definitions WHERE name = $1"), "deleting a runtime job");
                D::execute(&mut tx, q.bind(req.name)).await?;
                let q = Stmt::new(sql!(D, "DELETE FROM ll_job_state WHERE job = $1"), "clearing a job's state");
                D::execute(&mut tx, q.bind(req.name)).await?;
                let q = Stmt::new(sql!(D, "DELETE FROM ll_job_successes WHERE job = $1"), "clearing a job's successes");
                D::execute(&mut tx, q.bind(req.name)).await?;
                forget_upstream_outcomes::<D>(&mut tx, req.name).await?;
                (None, Changed::Deleted { version: version as u64 })
            }
        };
        let q = Stmt::new(
            sql!(D, "INSERT INTO ll_job_history (job, version, action, before, after, actor, at) VALUES ($1, $2, $3, $4, $5, $6, $7)"),
            "recording a job's change",
        );
        D::execute(&mut tx, q.bind(req.name).bind(version).bind(req.change.action()).bind(before).bind(after).bind(req.actor).bind(at))
            .await?;
        D::commit(tx).await?;
        Ok(Ok(changed))
    }

    async fn job_history(&self, name: &str, limit: usize) -> Result<Vec<JobChangeRecord>, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT version, action, before, after, actor, at FROM ll_job_history WHERE job = $1 ORDER BY version DESC LIMIT $2"),
            "reading a job's history",
        );
        let rows = D::fetch_all(&mut *self.reader().await?, q.bind(name).bind(limit.min(100_000) as i64)).await?;
        Ok(rows
            .iter()
            .map(|r| JobChangeRecord {
                version: r.int("version").max(0) as u64,
                action: r.text("action"),
                before: r.json("before"),
                after: r.json("after"),
                actor: r.text("actor"),
                at: from_ms(r.int("at")),
            })
            .collect())
    }
}

/// A job deleted, or created afresh under a name, has no upstream outcomes waiting for it:
/// a job of the same name later starts with none.
async fn forget_upstream_outcomes<D: Dialect>(tx: &mut D::Tx, job: &str) -> Result<(), StoreError> {
    let q = Stmt::new(sql!(D, "DELETE FROM ll_after_outcomes WHERE downstream = $1"), "forgetting upstream outcomes");
    D::execute(tx, q.bind(job)).await?;
    Ok(())
}
