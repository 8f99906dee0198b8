//! Ticks no worker fired on time, each set told once (with its notifications) by the pass that
//! next sees it; the last of a job's, for its listing.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::dialect::{Dialect, Record, Stmt, sql};
use super::scripts::record_notification;
use super::{StoreError, from_ms, ms};
use crate::notify::NewNotification;
use crate::schedule::MissedTicks;

#[async_trait]
pub(crate) trait Missed: Send + Sync + std::fmt::Debug {
    /// Records each job's missed ticks and their notifications in one transaction, once per
    /// job and first missed tick (a set already told, by a pass before a crash or another
    /// worker's, records nothing); returns those told now.
    async fn tell_missed(
        &self,
        missed: &[(String, MissedTicks, Vec<NewNotification>)],
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, MissedTicks)>, StoreError>;
    /// The last set of `job`'s ticks told missed, and when it was told.
    async fn last_missed(&self, job: &str) -> Result<Option<(MissedTicks, DateTime<Utc>)>, StoreError>;
}

#[async_trait]
impl<D: Dialect> Missed for D {
    async fn tell_missed(
        &self,
        missed: &[(String, MissedTicks, Vec<NewNotification>)],
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, MissedTicks)>, StoreError> {
        if missed.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let mut told = Vec::new();
        for (job, m, notifications) in missed {
            let q = Stmt::new(
                sql!(
                    D,
                    "INSERT INTO ll_missed_ticks (job, first_tick, last_tick, count, caught_up, skipped, outside_window, told_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (job, first_tick) DO NOTHING"
                ),
                "recording missed ticks",
            );
            let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
            let inserted = D::execute(
                &mut tx,
                q.bind(job.as_str())
                    .bind(ms(m.first))
                    .bind(ms(m.last))
                    .bind(n(m.count))
                    .bind(n(m.caught_up))
                    .bind(n(m.skipped))
                    .bind(n(m.outside_window))
                    .bind(ms(now)),
            )
            .await?;
            if inserted == 0 {
                continue;
            }
            for n in notifications {
                record_notification::<D>(&mut tx, n, now).await?;
            }
            told.push((job.clone(), *m));
        }
        D::commit(tx).await?;
        Ok(told)
    }

    async fn last_missed(&self, job: &str) -> Result<Option<(MissedTicks, DateTime<Utc>)>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "SELECT first_tick, last_tick, count, caught_up, skipped, outside_window, told_at FROM ll_missed_ticks
                 WHERE job = $1 ORDER BY first_tick DESC LIMIT 1"
            ),
            "reading a job's last missed ticks",
        );
        let row = D::fetch_optional(&mut *self.reader().await?, q.bind(job)).await?;
        let n = |v: i64| usize::try_from(v).unwrap_or(0);
        Ok(row.map(|r| {
            (
                MissedTicks {
                    first: from_ms(r.int("first_tick")),
                    last: from_ms(r.int("last_tick")),
                    count: n(r.int("count")),
                    caught_up: n(r.int("caught_up")),
                    skipped: n(r.int("skipped")),
                    outside_window: n(r.int("outside_window")),
                },
                from_ms(r.int("told_at")),
            )
        }))
    }
}
