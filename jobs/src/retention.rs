//! Which jobs' history may need pruning: asked for as the notifier notices runs' outcomes
//! (only a noticed run may be pruned) and as ticks are skipped, taken in batches by the
//! housekeeper, off the run path.
//!
//! A busy job is pruned once a tenth of what it keeps has finished since its last pruning
//! (at least one run), not at every batch: each pruning statement reads past the runs kept to
//! find its cut, whatever it deletes, so deleting ten runs a statement costs about what one
//! did. Every worker counts only the runs it noticed, so three workers together prune a job as
//! often as one would. A job that slows down or stops is pruned [`PRUNE_AT_LATEST`] after its
//! first run waiting. So history exceeds `max_runs` by about a tenth a worker that notices its
//! runs (and what ends during a batch's wait), for at most about a minute once the job is quiet.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

/// A busy worker prunes at most this often; an idle one not at all.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(5);

/// A job's finished runs wait at most this long for its history to be pruned, however few.
pub(crate) const PRUNE_AT_LATEST: Duration = Duration::from_secs(60);

/// How many finished runs a job keeping `keep` gathers before a batch prunes it: a tenth of
/// what it keeps, at least one (every run, with no count kept).
pub(crate) fn prune_after(keep: Option<u32>) -> u32 {
    keep.map_or(1, |k| (k / 10).max(1))
}

/// What waits for one job's retention: how many runs finished (or ticks were skipped) since it
/// was last pruned, and when the first of them did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub(crate) runs: u32,
    pub(crate) since: DateTime<Utc>,
}

#[derive(Debug, Default)]
struct Pending {
    jobs: BTreeMap<String, Waiting>,
    /// The first request since the last batch was taken: the next batch is due
    /// [`PRUNE_EVERY`] after it.
    batch_since: Option<DateTime<Utc>>,
}

/// The housekeeper's queue of jobs to prune.
#[derive(Debug, Default)]
pub(crate) struct PruneQueue {
    pending: Mutex<Pending>,
    wake: Notify,
}

impl PruneQueue {
    /// Asks for `job`'s retention to be applied soon, for `runs` finished runs (0: a retry, due
    /// within [`PRUNE_AT_LATEST`]). `at`: the engine-clock instant of what asked (a run's end,
    /// a skipped tick).
    pub(crate) fn prune_soon(&self, job: &str, at: DateTime<Utc>, runs: u32) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let w = p.jobs.entry(job.to_string()).or_insert(Waiting { runs: 0, since: at });
        w.runs = w.runs.saturating_add(runs);
        w.since = w.since.min(at);
        // The housekeeper is woken once a batch, not once a run: a request within a batch (an
        // earlier instant included) moves the batch's due time by less than PRUNE_EVERY.
        let new_batch = p.batch_since.is_none();
        p.batch_since = Some(p.batch_since.map_or(at, |s| s.min(at)));
        drop(p);
        if new_batch {
            self.wake.notify_one();
        }
    }

    /// When the next batch is due: [`PRUNE_EVERY`] after its first request, or sooner when a
    /// job's runs have waited [`PRUNE_AT_LATEST`]. None while nothing waits.
    pub(crate) fn next_due(&self) -> Option<DateTime<Utc>> {
        let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let batch = p.batch_since.map(|s| s + chrono::Duration::from_std(PRUNE_EVERY).unwrap_or_default());
        let oldest = p.jobs.values().map(|w| w.since).min();
        let latest = oldest.map(|s| s + chrono::Duration::from_std(PRUNE_AT_LATEST).unwrap_or_default());
        batch.into_iter().chain(latest).min()
    }

    /// Takes the jobs to prune now: those `ready` says have gathered enough runs, and those
    /// whose runs have waited [`PRUNE_AT_LATEST`] by `now`. The others keep waiting, counted.
    pub(crate) fn take_due(&self, now: DateTime<Utc>, ready: impl Fn(&str, &Waiting) -> bool) -> Vec<String> {
        let latest = chrono::Duration::from_std(PRUNE_AT_LATEST).unwrap_or_default();
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.batch_since = None;
        let mut due = Vec::new();
        p.jobs.retain(|job, w| {
            let take = ready(job, w) || w.since + latest <= now;
            if take {
                due.push(job.clone());
            }
            !take
        });
        due
    }

    /// Resolves at the next batch's first request.
    pub(crate) async fn requested(&self) {
        self.wake.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0).single().expect("valid instant")
    }

    #[test]
    fn a_tenth_of_what_is_kept_gathers_before_a_job_is_pruned() {
        assert_eq!(prune_after(Some(100)), 10);
        assert_eq!(prune_after(Some(1_000)), 100);
        assert_eq!(prune_after(Some(19)), 1);
        assert_eq!(prune_after(Some(0)), 1);
        assert_eq!(prune_after(None), 1);
    }

    #[test]
    fn a_batch_takes_the_jobs_that_gathered_enough_and_keeps_counting_the_others() {
        let q = PruneQueue::default();
        assert_eq!(q.next_due(), None);
        q.prune_soon("busy", at(0), 4);
        q.prune_soon("quiet", at(1), 1);
        q.prune_soon("busy", at(2), 6);
        assert_eq!(q.next_due(), Some(at(5)), "PRUNE_EVERY after the batch's first request");
        let ready = |_: &str, w: &Waiting| w.runs >= 10;
        assert_eq!(q.take_due(at(5), ready), ["busy"]);
        // Nothing asked since: due when the quiet job's run has waited PRUNE_AT_LATEST.
        assert_eq!(q.next_due(), Some(at(61)));
        q.prune_soon("busy", at(7), 3);
        assert_eq!(q.next_due(), Some(at(12)));
        assert!(q.take_due(at(12), ready).is_empty(), "3 and 1 runs are not enough");
        q.prune_soon("quiet", at(30), 1);
        assert_eq!(q.take_due(at(35), ready), Vec::<String>::new());
        // The quiet job's first run has waited a minute: pruned with its two runs counted;
        // the busy job's three (from 7 s) keep waiting.
        assert_eq!(q.next_due(), Some(at(61)));
        assert_eq!(q.take_due(at(61), ready), ["quiet"]);
        assert_eq!(q.next_due(), Some(at(67)));
        assert_eq!(q.take_due(at(67), ready), ["busy"]);
        assert_eq!(q.next_due(), None);
        // A pruning that failed is asked for again with no runs: tried again within a minute.
        q.prune_soon("failed", at(70), 0);
        assert_eq!(q.next_due(), Some(at(75)));
        assert!(q.take_due(at(75), ready).is_empty());
        assert_eq!(q.next_due(), Some(at(130)));
        assert_eq!(q.take_due(at(130), ready), ["failed"]);
    }
}
