//! Which jobs' history may need pruning: asked for as the notifier notices runs' outcomes
//! (only a noticed run may be pruned) and as ticks are skipped, taken in batches by the
//! housekeeper, off the run path.

use std::collections::BTreeSet;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

/// Jobs waiting for their retention to be applied, and when the first of them asked.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub(crate) jobs: BTreeSet<String>,
    pub(crate) since: Option<DateTime<Utc>>,
}

/// The housekeeper's queue of jobs to prune.
#[derive(Debug, Default)]
pub(crate) struct PruneQueue {
    pending: Mutex<Pending>,
    wake: Notify,
}

impl PruneQueue {
    /// Asks for `job`'s retention to be applied soon. `at`: the engine-clock instant of what
    /// asked (a run's end, a skipped tick); a batch is due a while after its first request.
    pub(crate) fn prune_soon(&self, job: &str, at: DateTime<Utc>) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.jobs.insert(job.to_string());
        p.since = Some(p.since.map_or(at, |s| s.min(at)));
        drop(p);
        self.wake.notify_one();
    }

    /// When the batch waiting now was first asked for.
    pub(crate) fn since(&self) -> Option<DateTime<Utc>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).since
    }

    /// Takes the batch.
    pub(crate) fn take(&self) -> BTreeSet<String> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner())).jobs
    }

    /// Resolves at the next request.
    pub(crate) async fn requested(&self) {
        self.wake.notified().await;
    }
}
