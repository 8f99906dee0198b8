//! Deadlines watched from the database: the runs of jobs with a deadline that have not ended,
//! and each miss told once (with its notifications) whichever worker's pass sees it first.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{Dialect, Record, Stmt, run_cols, run_from_row, sql};
use super::scripts::record_notification;
use super::{StoreError, from_ms, ms};
use crate::deadline::{Miss, Root, Which};
use crate::notify::NewNotification;
use crate::run::{Run, RunStatus, Trigger};

/// What a deadline pass looks at: the runs not ended, each with its root (the run identity's
/// first attempt), and the deadlines already told of those roots.
#[derive(Debug, Default)]
pub(crate) struct Watched {
    pub(crate) runs: Vec<(Run, Root)>,
    pub(crate) told: HashSet<(String, Which)>,
}

#[async_trait]
pub(crate) trait Deadlines: Send + Sync + std::fmt::Debug {
    /// The runs of `jobs` (of every job: `None`) that have not ended (queued, running, waiting
    /// for a decision), with their roots and the deadlines already told of them.
    async fn watched(&self, jobs: Option<&[&str]>) -> Result<Watched, StoreError>;
    /// Records each miss and its notifications in one transaction, once per root and deadline
    /// (a miss already told, by this pass or another worker's, records nothing); returns
    /// those told now.
    async fn tell_misses(&self, misses: &[(Miss, Vec<NewNotification>)], now: DateTime<Utc>) -> Result<Vec<Miss>, StoreError>;
    /// The deadlines the run identity `root_id` missed, in the order they were told.
    async fn misses_of(&self, root_id: &str) -> Result<Vec<Miss>, StoreError>;
}

#[async_trait]
impl<D: Dialect> Deadlines for D {
    async fn watched(&self, jobs: Option<&[&str]>) -> Result<Watched, StoreError> {
        if jobs.is_some_and(<[&str]>::is_empty) {
            return Ok(Watched::default());
        }
        let mut c = self.reader().await?;
        let rows = match jobs {
            Some(jobs) => {
                let q = Stmt::new(
                    sql!(
                        D,
                        concat!(
                            "SELECT ",
                            run_cols!(),
                            " FROM ll_runs WHERE job {in $1} AND status IN ({Queued}, {Running}, {WaitingApproval}) ORDER BY enqueued_at, id"
                        )
                    ),
                    "reading the runs deadlines are watched on",
                );
                D::fetch_all(&mut *c, q.bind_list(jobs.iter().copied())).await?
            }
            None => {
                let q = Stmt::new(
                    sql!(
                        D,
                        concat!(
                            "SELECT ",
                            run_cols!(),
                            " FROM ll_runs WHERE status IN ({Queued}, {Running}, {WaitingApproval}) ORDER BY enqueued_at, id"
                        )
                    ),
                    "reading the runs deadlines are watched on",
                );
                D::fetch_all(&mut *c, q).await?
            }
        };
        let runs: Vec<Run> = rows.iter().map(run_from_row).collect();
        if runs.is_empty() {
            return Ok(Watched::default());
        }
        let roots: Vec<&str> = runs.iter().map(|r| r.root_id.as_str()).collect::<HashSet<_>>().into_iter().collect();
        let q = Stmt::new(
            sql!(D, "SELECT id, trigger, enqueued_at, started_at FROM ll_runs WHERE id {in $1}"),
            "reading the first attempts of watched runs",
        );
        let mut of_root: HashMap<String, Root> = HashMap::new();
        for r in D::fetch_all(&mut *c, q.bind_list(roots.iter().copied())).await? {
            of_root.insert(
                r.text("id"),
                Root {
                    trigger: r.str("trigger").parse().unwrap_or(Trigger::Api),
                    asked_at: from_ms(r.int("enqueued_at")),
                    started: r.opt_int("started_at").is_some(),
                },
            );
        }
        let q = Stmt::new(sql!(D, "SELECT root_id, deadline FROM ll_deadline_misses WHERE root_id {in $1}"), "reading deadlines told");
        let told = D::fetch_all(&mut *c, q.bind_list(roots.iter().copied()))
            .await?
            .iter()
            .filter_map(|r| Some((r.text("root_id"), r.str("deadline").parse().ok()?)))
            .collect();
        let runs = runs
            .into_iter()
            .map(|run| {
                // A root pruned away (or this run's own row, for a first attempt).
                let root = of_root.get(&run.root_id).copied().unwrap_or(Root {
                    trigger: run.trigger,
                    asked_at: run.enqueued_at,
                    started: run.started_at.is_some() || run.status != RunStatus::Queued,
                });
                (run, root)
            })
            .collect();
        Ok(Watched { runs, told })
    }

    async fn tell_misses(&self, misses: &[(Miss, Vec<NewNotification>)], now: DateTime<Utc>) -> Result<Vec<Miss>, StoreError> {
        if misses.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let mut told = Vec::new();
        for (m, notifications) in misses {
            let q = Stmt::new(
                sql!(
                    D,
                    "INSERT INTO ll_deadline_misses (root_id, deadline, job, run_id, tick, due_at, told_at, action)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (root_id, deadline) DO NOTHING"
                ),
                "recording a missed deadline",
            );
            let inserted = D::execute(
                &mut tx,
                q.bind(m.root_id.as_str())
                    .bind(m.which.as_str())
                    .bind(m.job.as_str())
                    .bind(m.run_id.as_str())
                    .bind(m.tick.map(ms))
                    .bind(ms(m.due_at))
                    .bind(ms(now))
                    .bind(if m.cancel { "cancel" } else { "notify" }),
            )
            .await?;
            if inserted == 0 {
                continue;
            }
            for n in notifications {
                record_notification::<D>(&mut tx, n, now).await?;
            }
            told.push(Miss { told_at: Some(now), ..m.clone() });
        }
        D::commit(tx).await?;
        Ok(told)
    }

    async fn misses_of(&self, root_id: &str) -> Result<Vec<Miss>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "SELECT root_id, deadline, job, run_id, tick, due_at, told_at, action FROM ll_deadline_misses WHERE root_id = $1 ORDER BY told_at, deadline"
            ),
            "reading a run's missed deadlines",
        );
        Ok(D::fetch_all(&mut *self.reader().await?, q.bind(root_id))
            .await?
            .iter()
            .filter_map(|r| {
                Some(Miss {
                    root_id: r.text("root_id"),
                    run_id: r.text("run_id"),
                    job: r.text("job"),
                    which: r.str("deadline").parse().ok()?,
                    tick: r.opt_int("tick").map(from_ms),
                    due_at: from_ms(r.int("due_at")),
                    told_at: r.opt_int("told_at").map(from_ms),
                    cancel: r.str("action") == "cancel",
                })
            })
            .collect())
    }
}
