//! Each job's state: its pause (and why) and the last tick the scheduler processed.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{ReadSql, Record, Stmt, job_state_from_row, sql};
use super::{JobState, StoreError, ms};

#[async_trait]
pub(crate) trait JobStates: Send + Sync + std::fmt::Debug {
    async fn job_states(&self) -> Result<HashMap<String, JobState>, StoreError>;
    /// One job's state; the default (never paused, never ticked) when it has none yet.
    async fn job_state(&self, job: &str) -> Result<JobState, StoreError>;
    async fn set_paused(&self, job: &str, paused: bool, reason: Option<&str>, now: DateTime<Utc>) -> Result<(), StoreError>;
    /// Pauses (with one reason) or resumes every job of `jobs`, in one transaction; a resume
    /// also moves each job's last tick to `now` (what it missed while paused is not caught
    /// up). A job already in that state is left as it is (a paused one keeps its own reason).
    /// Returns the jobs whose pause state this changed.
    async fn set_paused_all(
        &self,
        jobs: &[String],
        paused: bool,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, StoreError>;
    /// Moves the job's last processed tick forward (never back).
    async fn set_last_tick(&self, job: &str, tick: DateTime<Utc>) -> Result<(), StoreError>;
}

#[async_trait]
impl<D: ReadSql> JobStates for D {
    async fn job_states(&self) -> Result<HashMap<String, JobState>, StoreError> {
        ReadSql::job_states(self).await
    }

    async fn job_state(&self, job: &str) -> Result<JobState, StoreError> {
        let q = Stmt::new(
            sql!(D, "SELECT job, paused, pause_reason, paused_at, last_tick FROM ll_job_state WHERE job = $1"),
            "reading job state",
        );
        let row = D::fetch_optional(&mut *self.reader().await?, q.bind(job)).await?;
        Ok(row.as_ref().map(job_state_from_row).unwrap_or_default())
    }

    async fn set_paused(&self, job: &str, paused: bool, reason: Option<&str>, now: DateTime<Utc>) -> Result<(), StoreError> {
        D::execute(&mut *self.writer().await?, pause::<D>(job, paused, reason, now)).await?;
        Ok(())
    }

    async fn set_paused_all(
        &self,
        jobs: &[String],
        paused: bool,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, StoreError> {
        let mut tx = self.begin().await?;
        let mut changed = Vec::new();
        for job in jobs {
            let before = Stmt::new(sql!(D, "SELECT paused FROM ll_job_state WHERE job = $1 {lock}"), "reading pause state");
            let was = D::fetch_optional(&mut tx, before.bind(job.as_str())).await?.is_some_and(|r| r.flag("paused"));
            if was == paused {
                continue;
            }
            D::execute(&mut tx, pause::<D>(job, paused, reason, now)).await?;
            if !paused {
                D::execute(&mut tx, last_tick::<D>(job, now)).await?;
            }
            changed.push(job.clone());
        }
        D::commit(tx).await?;
        Ok(changed)
    }

    async fn set_last_tick(&self, job: &str, tick: DateTime<Utc>) -> Result<(), StoreError> {
        D::execute(&mut *self.writer().await?, last_tick::<D>(job, tick)).await?;
        Ok(())
    }
}

/// Job `job` paused since `now` with `reason`, or resumed, whether or not it has a row yet.
fn pause<'a, D: ReadSql>(job: &'a str, paused: bool, reason: Option<&'a str>, now: DateTime<Utc>) -> Stmt<'a> {
    let q = Stmt::new(
        sql!(
            D,
            "INSERT INTO ll_job_state (job, paused, pause_reason, paused_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (job) DO UPDATE SET paused = $2, pause_reason = $3, paused_at = $4"
        ),
        "saving pause state",
    );
    q.bind(job).bind(paused).bind(reason.filter(|_| paused)).bind(paused.then(|| ms(now)))
}

/// Job `job`'s last processed tick moved forward to `tick` (never back).
fn last_tick<'a, D: ReadSql>(job: &'a str, tick: DateTime<Utc>) -> Stmt<'a> {
    let q = Stmt::new(
        sql!(
            D,
            "INSERT INTO ll_job_state (job, last_tick) VALUES ($1, $2)
             ON CONFLICT (job) DO UPDATE SET last_tick = {greatest}(coalesce(ll_job_state.last_tick, 0), $2)"
        ),
        "saving the last tick",
    );
    q.bind(job).bind(ms(tick))
}
