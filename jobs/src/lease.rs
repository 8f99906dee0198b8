//! The worker's lease: renewed every quarter of it; on a shared database also the fence (a
//! worker that cannot renew stops its runs and takes no work) and the takeover of runs whose
//! worker's lease ran out. Recovery at start is the same takeover, of this worker's own runs too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, ServerClock};
use crate::events::Observer;
use crate::executor::Executor;
use crate::health::Health;
use crate::in_force::{InForce, JobsConfig};
use crate::share::Share;
use crate::signals::{Receiver, Signal, Signals};
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
    /// This worker's share of the schedule, as the scheduler plans it.
    pub(crate) share: tokio::sync::watch::Sender<Share>,
    /// Whether this worker takes a share: false from the start of its shutdown.
    pub(crate) scheduling: AtomicBool,
    /// What it wrote of its share, held by one division at a time.
    pub(crate) shares: tokio::sync::Mutex<ShareState>,
}

/// What the lease keeper wrote of its share, and the digest of the config in force.
#[derive(Default)]
pub(crate) struct ShareState {
    /// The digest of the config it was last computed for.
    of: Option<(Weak<JobsConfig>, String)>,
    /// The digest last written (`Some(None)`: the worker left the group).
    written: Option<Option<String>>,
}

impl ShareState {
    /// The digest of the scheduled jobs `config` knows ([`crate::share::digest`]), computed
    /// again only when the config in force changed (the weak pointer keeps the old config's
    /// allocation, so a new one is never mistaken for it). Every job is hashed: at a million,
    /// tens of ms, on the blocking pool rather than the runtime's threads that fire ticks.
    async fn digest_of(&mut self, config: Arc<JobsConfig>) -> String {
        if let Some((of, digest)) = &self.of
            && std::ptr::eq(of.as_ptr(), Arc::as_ptr(&config))
        {
            return digest.clone();
        }
        let of = Arc::downgrade(&config);
        let hashed = crate::off_the_runtime({
            let config = config.clone();
            move || scheduled_digest(&config)
        });
        // The runtime shutting down: hashed here.
        let digest = hashed.await.unwrap_or_else(|| scheduled_digest(&config));
        self.of = Some((of, digest.clone()));
        digest
    }
}

fn scheduled_digest(config: &JobsConfig) -> String {
    let scheduled = config
        .jobs
        .iter()
        .filter(|(name, cfg)| cfg.schedule.is_some() && crate::scheduler::schedulable(config, name, cfg))
        .map(|(name, _)| name.as_str());
    crate::share::digest(scheduled)
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

    /// Writes this worker's digest with its lease and reads its group (on a shared database
    /// only); the scheduler is told when its share changed. Others are told (a signal) when
    /// this worker's own entry changed: it joined, left, or knows other jobs now. `reread`:
    /// read the group even if the digest is the one last written (another worker changed).
    pub(crate) async fn divide(&self, reread: bool) -> Result<(), StoreError> {
        if !self.storage.takes_over_from_others() {
            return Ok(());
        }
        // One at a time: a leave is never overwritten by a division that began before it.
        let mut state = self.shares.lock().await;
        let digest = if self.scheduling.load(Ordering::SeqCst) { Some(state.digest_of(self.config.get()).await) } else { None };
        let changed = state.written.as_ref() != Some(&digest);
        if !changed && (!reread || digest.is_none()) {
            return Ok(());
        }
        let members = self.leases.share(&self.worker, digest.as_deref()).await?;
        state.written = Some(digest.clone());
        if changed {
            self.signals.publish(Signal::WorkersChanged);
        }
        if digest.is_none() {
            return Ok(());
        }
        let share = Share::among(&self.worker.name, members);
        self.share.send_if_modified(|s| {
            if *s == share {
                return false;
            }
            let workers = share.members().len().max(1);
            tracing::info!(workers, members = ?share.members(), "this worker plans its share of the scheduled jobs: one of {workers}");
            *s = share;
            true
        });
        Ok(())
    }

    /// The worker stops scheduling (its shutdown began): its entry leaves the group at once,
    /// so that the others take its jobs now, not when its lease is given up after the drain.
    pub(crate) async fn leave_shares(&self) {
        self.scheduling.store(false, Ordering::SeqCst);
        if let Err(e) = self.divide(true).await {
            tracing::warn!(error = %e, "cannot give up the worker's share of the schedule; the others take it when its lease ends");
        }
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
    pub(crate) async fn run(self: Arc<Self>, mut renewed: std::time::Instant, mut signals: Receiver, stop: CancellationToken) {
        let fencing = crate::decide::fencing(self.lease);
        let fences = self.storage.takes_over_from_others();
        let mut lost = false;
        let mut failing: bool;
        let mut fenced = false;
        let mut renew_at = tokio::time::Instant::now() + fencing.renew_every;
        loop {
            let fence_at = tokio::time::Instant::from_std(renewed + fencing.fence_after);
            // Until the renewal is due: the fence's deadline, and between renewals the share
            // read again when another worker joined or left or the jobs in force changed.
            tokio::select! {
                () = tokio::time::sleep_until(renew_at) => {}
                () = tokio::time::sleep_until(fence_at), if fences && !fenced => {
                    fenced = true;
                    renew_at = tokio::time::Instant::now() + fencing.retry_every;
                    self.fence(fencing.fence_after);
                    continue;
                }
                reread = shares_changed(&mut signals), if fences && !fenced => {
                    let Some(reread) = reread else { return };
                    // Never past the renewal or the fence's deadline: neither waits for it (the
                    // renewal due now reads the share after it anyway).
                    let until = (tokio::time::Instant::now() + fencing.renew_every).min(fence_at).min(renew_at);
                    if until > tokio::time::Instant::now() {
                        self.bounded(until, self.divide(reread), "read the worker's share of the schedule").await;
                    }
                    continue;
                }
                () = stop.cancelled() => return,
            }
            // The renewal may hang (a cut connection): the fence's deadline runs beside it.
            let renew = async {
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
                    renew_at = tokio::time::Instant::now() + fencing.retry_every;
                    self.fence(fencing.fence_after);
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
            renew_at = tokio::time::Instant::now() + if failing || fenced { fencing.retry_every } else { fencing.renew_every };
            // Bounded: a connection cut mid-way must not keep this loop from watching the fence
            // (nor, together, past its deadline).
            if fences && !failing && !fenced {
                // Leaving the next renewal its own time before the fence.
                let latest = tokio::time::Instant::from_std(renewed + fencing.fence_after.saturating_sub(fencing.renew_every));
                let until = || (tokio::time::Instant::now() + fencing.renew_every).min(latest);
                // A member whose lease ran out leaves the group only as the others read it.
                self.bounded(until(), self.divide(true), "read the worker's share of the schedule").await;
                self.bounded(until(), self.recover(now, false), "check for runs of workers that are gone").await;
            }
        }
    }

    /// Stops every run this worker holds: no renewal went through for `after`.
    fn fence(&self, after: Duration) {
        let why = format!(
            "fenced: the worker could not renew its lease for {}; its runs were stopped so that no other worker runs them \
             at the same time, and it takes no work until the database takes a renewal",
            humantime::format_duration(after)
        );
        let stopped = self.executor.fence(after);
        tracing::error!(runs = stopped, "{why}");
        self.observer.fenced(stopped);
        self.health.set_fenced(Some(why));
    }

    /// Runs `work` until `until` at most, saying what went wrong.
    async fn bounded(&self, until: tokio::time::Instant, work: impl Future<Output = Result<(), StoreError>>, what: &str) {
        match tokio::time::timeout_at(until, work).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot {what}"),
            Err(_) => tracing::warn!("cannot {what} in time; trying again later"),
        }
    }
}

/// The next signal that may change this worker's share: `Some(true)` when the group must be
/// read again (a worker joined or left, signals were lost), `Some(false)` when only the jobs in
/// force changed (read again if the digest did); `None` once the signals are gone.
async fn shares_changed(signals: &mut Receiver) -> Option<bool> {
    loop {
        match signals.recv().await? {
            Signal::WorkersChanged | Signal::Lagged => return Some(true),
            Signal::JobChanged | Signal::JobsChanged(_) => return Some(false),
            _ => {}
        }
    }
}
