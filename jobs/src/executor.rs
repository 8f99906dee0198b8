//! Execution: `concurrency` slots, and the way every run takes through them.
//!
//! - **Claim**: runs are claimed in the store transaction that hands them over — a tick's, a
//!   dispatch's, or the queue intake's — for which the caller first takes a [`Ticket`] (a free
//!   slot and a drain pass) per run. [`launch`] starts what was claimed.
//! - **Intake** ([`intake`]): runs that could not start at once wait in the queue (apalis, in
//!   the backend); woken by pushes, the intake takes as many as there are free slots, claiming
//!   them in the transaction that consumes their tasks. apalis's own worker loop is not used:
//!   it acknowledges each task in a transaction of its own (measured: ~380 runs/s at
//!   concurrency 32), while this needs one per batch.
//! - **Run**: each claimed run gets its own task with a [`RunContext`], the job's timeout and
//!   cancellation; its target runs in a further task, so a panic fails that run and nothing else.
//! - **Record**: the recorder writes the ends of whatever runs have finished in one statement,
//!   then frees their slots and passes, schedules retries and tells waiters.
//!
//! A run holds its drain [`Pass`] from before its claim until its end is recorded.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use opentelemetry::context::FutureExt as _;

use crate::context::{RunContext, RunEnv};
use crate::decide::{Settled, StopReason, next_attempt, settle};
use crate::engine::Shared;
use crate::events::{Cancelled, Ended, Op, Owner};
use crate::gate::{Gate, Pass};
use crate::run::{Outcome, Run, RunStatus};
use crate::signals::{Receiver, Signal};
use crate::snapshot::{JobSnapshot, TargetRef};
use crate::store::{Handed, RunEnd};

/// Ends are written in batches of at most this many runs.
const BATCH: usize = 1024;

/// One run in progress in this process.
#[derive(Debug, Default)]
pub(crate) struct Running {
    token: CancellationToken,
    reason: std::sync::Mutex<Option<StopReason>>,
}

impl Running {
    /// Stops the run; the first reason given is the one recorded.
    pub(crate) fn stop(&self, why: StopReason) {
        self.reason.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(why);
        self.token.cancel();
    }
}

/// A free slot and a drain pass: what a run needs before it may be claimed.
#[derive(Debug)]
pub(crate) struct Ticket {
    /// Both are held for what they release when dropped.
    _slot: OwnedSemaphorePermit,
    _pass: Pass,
}

/// A run that ended, on its way to the recorder.
struct Finished {
    run: Run,
    /// When its target was called (the claim recorded when it was claimed).
    started: Option<chrono::DateTime<chrono::Utc>>,
    end: Settled,
    ticket: Ticket,
    /// The execution's trace, when spans are exported.
    trace_id: Option<String>,
}

/// The slots and the way to the recorder. Owned by `Shared`.
#[derive(Debug)]
pub(crate) struct Executors {
    slots: Arc<Semaphore>,
    finished: mpsc::UnboundedSender<Finished>,
}

/// The recorder's end of the executors' channel, taken by [`recorder`].
pub(crate) struct RecorderRx(mpsc::UnboundedReceiver<Finished>);

impl Executors {
    pub(crate) fn new(concurrency: usize) -> (Self, RecorderRx) {
        let (finished, rx) = mpsc::unbounded_channel();
        (Self { slots: Arc::new(Semaphore::new(concurrency.max(1))), finished }, RecorderRx(rx))
    }

    /// Up to `n` tickets, without waiting: as many as there are free slots, none once the
    /// gate is closed.
    pub(crate) fn tickets(&self, gate: &Arc<Gate>, n: usize) -> Vec<Ticket> {
        let mut out = Vec::new();
        while out.len() < n {
            let Ok(slot) = self.slots.clone().try_acquire_owned() else { break };
            let Some(pass) = gate.enter() else { break };
            out.push(Ticket { _slot: slot, _pass: pass });
        }
        out
    }

    /// Waits for a free slot, then takes up to `max` tickets; none once the gate is closed.
    pub(crate) async fn tickets_when_free(&self, gate: &Arc<Gate>, max: usize) -> Vec<Ticket> {
        let slot = tokio::select! {
            s = self.slots.clone().acquire_owned() => s.ok(),
            () = gate.closed() => None,
        };
        let (Some(slot), Some(pass)) = (slot, gate.enter()) else { return Vec::new() };
        let mut out = vec![Ticket { _slot: slot, _pass: pass }];
        out.extend(self.tickets(gate, max.saturating_sub(1)));
        out
    }
}

/// Starts claimed runs, one ticket each; tickets left over are returned (dropped).
pub(crate) fn launch(shared: &Arc<Shared>, runs: Vec<Handed>, tickets: Vec<Ticket>) {
    debug_assert!(runs.len() <= tickets.len());
    if !runs.is_empty() {
        shared.runs_changed();
    }
    for (handed, ticket) in runs.into_iter().zip(tickets) {
        tokio::spawn(run_one(shared.clone(), handed, ticket));
    }
}

/// One claimed run: its target in a task of its own, so that a panic becomes this run's end.
/// The run's span is the root of its trace; its `before` hooks may cancel it.
async fn run_one(shared: Arc<Shared>, handed: Handed, ticket: Ticket) {
    let Handed { run, snapshot, resumed } = handed;
    let entry = shared.track(&run.id);
    let obs = shared.observer().clone();
    obs.run_started(&run, run.lateness(), resumed);
    let op = Op::Run { job: run.job.clone(), trigger: run.trigger.as_str(), attempt: run.attempt };
    let started = Arc::new(std::sync::OnceLock::new());
    let (end, trace_id) = match obs.begin(op, Owner::from(&run), None).await {
        Err(Cancelled(why)) => (settle(None, Some(StopReason::Cancelled(why))), None),
        Ok(op) => {
            // A resumed run keeps its first start.
            let started_now = (!resumed).then(|| started.clone());
            let work = execute(shared.clone(), run.clone(), snapshot, entry, started_now).with_context(op.context());
            let end = match tokio::spawn(work).await {
                Ok(end) => end,
                Err(e) => Settled {
                    status: RunStatus::Failed,
                    output: None,
                    error: Some(format!("the run panicked: {e}")),
                    retry: false,
                    wait_until: None,
                },
            };
            let trace_id = op.trace_id();
            op.end(&obs, Ended { status: Some(end.status), error: end.error.as_deref(), ..Ended::ok() }).await;
            (end, trace_id)
        }
    };
    // The recorder lives until the drain is over; if it is gone the process is stopping and
    // the run is recovered at the next start.
    let started = started.get().copied();
    let _ = shared.executors().finished.send(Finished { run, started, end, ticket, trace_id });
}

async fn execute(
    shared: Arc<Shared>,
    run: Run,
    snapshot: Option<JobSnapshot>,
    entry: Arc<Running>,
    started: Option<Arc<std::sync::OnceLock<chrono::DateTime<chrono::Utc>>>>,
) -> Settled {
    // The job as it was when the run was created; rows from before snapshots use the config
    // in force.
    let mut snapshot = snapshot.or_else(|| shared.job(&run.job).map(|j| shared.snapshot().snapshot_of(&j)));
    // Runs stored before workflow definitions were kept with them follow the config in force.
    if let Some(JobSnapshot { target: TargetRef::Workflow { workflow, definition: definition @ None }, .. }) = &mut snapshot {
        *definition = shared.workflow(workflow);
    }
    let outcome = match snapshot {
        None => Some(Outcome::permanent(format!("job \"{}\" is no longer defined", run.job))),
        Some(job) => {
            let job = Arc::new(job);
            let env = RunEnv {
                data_dir: shared.data_dir(),
                store: shared.store_handle(),
                clock: shared.clock().clone(),
                agents: shared.agents(),
                observer: shared.observer().clone(),
                signals: shared.signals_handle(),
            };
            let ctx = RunContext::new(run, job.clone(), entry.token.clone(), env);
            // The run's start, as recorded: the moment its target is called.
            let clock = shared.clock().clone();
            let now = clock.now();
            if let Some(started) = started {
                let _ = started.set(now);
            }
            let work = shared.targets().run(ctx);
            // On the engine's clock, like every other time limit: tests move it.
            let deadline = job.timeout().and_then(|t| now.checked_add_signed(chrono::TimeDelta::from_std(t).ok()?));
            let limit = async {
                match deadline {
                    Some(at) => clock.sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                o = work => Some(o),
                () = limit => {
                    if let Some(t) = job.timeout() {
                        entry.stop(StopReason::TimedOut(t));
                    }
                    None
                }
                () = entry.token.cancelled() => None,
            }
        }
    };
    let stop = entry.reason.lock().unwrap_or_else(|e| e.into_inner()).clone();
    settle(outcome, stop)
}

/// Writes the ends of whatever runs have finished (up to [`BATCH`]) in one statement, then
/// frees their slots and passes.
pub(crate) async fn recorder(shared: Arc<Shared>, rx: RecorderRx, stop: CancellationToken) {
    let mut rx = rx.0;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => if n == 0 { return },
            () = stop.cancelled() => return,
        }
        let now = shared.clock().now();
        let ends: Vec<RunEnd<'_>> = batch
            .iter()
            .map(|f| RunEnd {
                id: &f.run.id,
                started_at: f.started,
                status: f.end.status,
                output: f.end.output.as_ref(),
                error: f.end.error.as_deref(),
                wait_until: f.end.wait_until,
                trace_id: f.trace_id.as_deref(),
            })
            .collect();
        // Until the database takes them (a server restarting, a failover): the runs keep
        // their slots meanwhile, so nothing new starts on a worker that cannot record. Only a
        // stop gives up (the runs are then recovered as interrupted).
        let mut recorded = false;
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let began = std::time::Instant::now();
            let res = shared.store().finish_many(&ends, now).await;
            tracing::debug!(runs = ends.len(), finish_us = began.elapsed().as_micros() as u64, "ends recorded");
            match res {
                Ok(_) => {
                    if attempt > 1 {
                        tracing::info!(runs = ends.len(), attempt, "the end of runs is recorded");
                    }
                    recorded = true;
                    break;
                }
                Err(e) => {
                    if attempt == 1 || attempt.is_multiple_of(10) {
                        tracing::error!(runs = ends.len(), attempt, error = %e, "cannot record the end of runs; retrying");
                    }
                    let backoff = Duration::from_millis(100 * u64::from(attempt.min(50)));
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = stop.cancelled() => break,
                    }
                }
            }
        }
        drop(ends);
        for f in batch.drain(..) {
            // Only now, with the end recorded (or given up on: the run is recovered as
            // interrupted at the next start), does the run leave the running map.
            shared.untrack(&f.run.id);
            if f.end.status == RunStatus::Failed && f.end.error.as_deref().is_some_and(|e| e.starts_with("the run panicked")) {
                tracing::error!(run = %f.run.id, job = %f.run.job, error = f.end.error.as_deref().unwrap_or(""), "run panicked");
            }
            shared.observer().run_finished(&f.run, f.end.status, f.end.error.as_deref(), f.end.wait_until);
            if recorded && f.end.retry {
                schedule_retry(&shared, &f.run, now).await;
            }
            shared.prune_soon(&f.run.job, now);
            shared.run_finished(&f.run.id);
            drop(f.ticket);
        }
    }
}

/// Schedules the next attempt of a failed run after the job's backoff, if its policy allows.
async fn schedule_retry(shared: &Shared, run: &Run, now: chrono::DateTime<chrono::Utc>) {
    let due = next_attempt(run.attempt, shared.retries_for(&run.job).as_ref(), now);
    match shared.follow_up(run, due, now).await {
        Ok(Some(id)) => tracing::info!(run = %run.id, retry = %id, due = ?due, "retry scheduled"),
        Ok(None) => {}
        Err(e) => tracing::error!(run = %run.id, error = %e, "cannot schedule a retry"),
    }
    shared.wake_scheduler();
}

/// Stops runs executing here when a stop is asked for through the signals (by another
/// process, or for a run that was being claimed when it was asked).
pub(crate) async fn canceller(shared: Arc<Shared>, mut signals: crate::signals::Receiver, stop: CancellationToken) {
    loop {
        let signal = tokio::select! {
            s = signals.recv() => match s { Some(s) => s, None => return },
            () = stop.cancelled() => return,
        };
        if let Signal::CancelRequested { run, why } = signal {
            shared.stop_here(&run, why);
        }
    }
}

/// Most tasks taken in one claim.
const CLAIM_BATCH: usize = 1024;

/// Takes queued runs into free slots until `stop`: woken when tasks are pushed; while tasks
/// remain it waits only for slots. No polling: a queue that came up short sleeps until the next
/// push wakes it.
pub(crate) async fn intake(shared: Arc<Shared>, mut signals: Receiver, stop: CancellationToken) {
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
            t = shared.executors().tickets_when_free(shared.gate(), CLAIM_BATCH) => t,
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
                launch(&shared, taken.runs, tickets);
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
