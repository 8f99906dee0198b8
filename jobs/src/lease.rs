//! The worker's lease: renewed every quarter of it; on a shared database also the fence (a
//! worker that cannot renew stops its runs and takes no work) and the takeover of runs whose
//! worker's lease ran out. Recovery at start is the same takeover, of this worker's own runs too.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, ServerClock};
use crate::events::Observer;
use crate::executor::Executor;
use crate::health::Health;
use crate::in_force::InForce;
use crate::signals::{Signal, Signals};
use crate::store::{Leases, StorageKind, StoreError, WorkerId};

/// What the lease keeper and recovery are handed.
pub(crate) struct LeaseKeeper {
    pub(crate) leases: Arc<dyn Leases>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The server's time, measured at each renewal (on a shared database with the system clock).
    pub(crate) server_clock: Option<Arc<ServerClock>>,
    pub(crate) signals: Arc<dyn Signals>,
    pub(crate) observer: Arc<Observer>,
    pub(crate) config: Arc<InForce>,
    pub(crate) executor: Arc<Executor>,
    pub(crate) health: Arc<Health>,
    pub(crate) worker: WorkerId,
    /// How long this worker's runs stay its own without a heartbeat.
    pub(crate) lease: Duration,
    pub(crate) storage: StorageKind,
}

impl LeaseKeeper {
    /// After an unclean stop or a shutdown with interrupted runs: marks orphans interrupted and
    /// starts a follow-up attempt for each where the retry policy allows. `starting`: at start,
    /// when whatever runs under this worker's name is an orphan too.
    pub(crate) async fn recover(&self, now: DateTime<Utc>, starting: bool) -> Result<(), StoreError> {
        let orphans = self.leases.recover(starting.then_some(self.worker.name.as_str()), now).await?;
        for r in &orphans {
            tracing::warn!(run = %r.id, job = %r.owner, status = r.status.as_str(), "run was left running by a worker that stopped or lost its lease");
        }
        if !orphans.is_empty() {
            // Their limits' slots are free now: runs waiting for them may start.
            self.signals.publish(Signal::Wake);
        }
        for r in self.leases.interrupted_without_follow_up().await? {
            // Picked up at once, if the policy gives it another attempt at all.
            let due = crate::decide::next_attempt(r.attempt, self.config.get().retries_for(&r.owner).as_ref(), now).map(|_| now);
            if let Some(id) = self.executor.follow_up(&r, due, now).await? {
                tracing::info!(run = %r.id, retry = %id, "interrupted run picked up again");
                // Due now: the scheduler hands it over (on a shared database, a takeover happens
                // while the scheduler may be asleep until its next tick).
                self.signals.publish(Signal::Wake);
            }
        }
        Ok(())
    }

    /// Measures the server's time from a renewal sent at `sent` (a monotonic instant), and says
    /// so when this machine's clock is more than a second off it.
    pub(crate) fn server_time(&self, sent: std::time::Instant, server: DateTime<Utc>) {
        let Some(clock) = &self.server_clock else { return };
        if let Some(offset) = clock.measure(sent, std::time::Instant::now(), server)
            && offset.abs() > chrono::TimeDelta::seconds(1)
        {
            tracing::warn!(
                worker = %self.worker.name,
                offset_ms = offset.num_milliseconds(),
                "this machine's clock is {}s off the database server's; the worker keeps the server's time (fix the machine's clock: NTP)",
                -offset.num_milliseconds() as f64 / 1000.0
            );
        }
    }

    /// Renews this worker's lease every quarter of it (sooner after a failure), reporting storage
    /// faults the write meets. On a shared database it also fences: when no renewal has gone
    /// through for [`Fencing::fence_after`](crate::decide::Fencing), it stops every run it holds
    /// and takes no work (not ready) until a renewal goes through; and it takes over the runs of
    /// workers whose lease ran out (interrupted, then followed up per policy), as every worker
    /// does at start. `renewed`: when the last renewal that went through was sent.
    pub(crate) async fn run(self: Arc<Self>, mut renewed: std::time::Instant, stop: CancellationToken) {
        let fencing = crate::decide::fencing(self.lease);
        let fences = self.storage.takes_over_from_others();
        let mut lost = false;
        let mut failing = false;
        let mut fenced = false;
        loop {
            let wait = if failing || fenced { fencing.retry_every } else { fencing.renew_every };
            let fence_at = tokio::time::Instant::from_std(renewed + fencing.fence_after);
            // A renewal may hang (a cut connection): the fence's deadline runs beside it.
            let renew = async {
                tokio::time::sleep(wait).await;
                let sent = std::time::Instant::now();
                let now = self.clock.now();
                let result = tokio::time::timeout(fencing.renew_every, self.leases.heartbeat(&self.worker, self.lease, false, now)).await;
                if let Ok(Ok(Some(lease))) = &result {
                    self.server_time(sent, lease.server_now);
                }
                (sent, now, result)
            };
            let (sent, now, result) = tokio::select! {
                r = renew => r,
                () = tokio::time::sleep_until(fence_at), if fences && !fenced => {
                    fenced = true;
                    let why = format!(
                        "fenced: the worker could not renew its lease for {}; its runs were stopped so that no other worker runs them \
                         at the same time, and it takes no work until the database takes a renewal",
                        humantime::format_duration(fencing.fence_after)
                    );
                    let stopped = self.executor.fence(fencing.fence_after);
                    tracing::error!(runs = stopped, "{why}");
                    self.observer.fenced(stopped);
                    self.health.set_fenced(Some(why));
                    continue;
                }
                () = stop.cancelled() => return,
            };
            match result {
                Ok(Ok(Some(_lease))) => {
                    renewed = sent;
                    lost = false;
                    failing = false;
                    self.health.storage_ok();
                    // Work again once the runs the fence stopped have left (their ends recorded or
                    // refused): a run of the old epoch must not be taken over, here or elsewhere,
                    // while its attempt still runs.
                    if fenced && self.executor.running_count() == 0 {
                        fenced = false;
                        self.health.set_fenced(None);
                        self.executor.unfence();
                        tracing::info!("the lease is renewed; the worker takes work again");
                    }
                }
                Ok(Ok(None)) => {
                    failing = false;
                    if !lost {
                        lost = true;
                        tracing::error!(
                            worker = %self.worker.name,
                            "another process started under this worker's name and took its lease; worker names must be unique \
                             (worker.name)"
                        );
                    }
                }
                Ok(Err(e)) => {
                    failing = true;
                    self.health.storage_failed(&e);
                    tracing::warn!(error = %e, "cannot renew the worker's lease");
                }
                Err(_) => {
                    failing = true;
                    tracing::warn!("cannot renew the worker's lease: the database did not answer within {:?}", fencing.renew_every);
                }
            }
            // Bounded: a connection cut mid-way must not keep this loop from watching the fence.
            if fences && !failing && !fenced {
                match tokio::time::timeout(fencing.renew_every, self.recover(now, false)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot check for runs of workers that are gone"),
                    Err(_) => tracing::warn!("checking for runs of workers that are gone took too long; trying again later"),
                }
            }
        }
    }
}
