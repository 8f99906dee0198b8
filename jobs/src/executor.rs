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
//!   cancellation; a panic of its target is caught in that task and fails that run alone.
//! - **Record**: the recorder writes the ends of whatever runs have finished in one transaction
//!   and, while the queue may hold runs, claims as many in the same transaction: their slots
//!   and passes go to those runs (the single writer alternated between small claims and small
//!   batches of ends). It then schedules retries, tells waiters and frees the slots left over
//!   at once. Where a write is a round trip (PostgreSQL), ends wait a few milliseconds for
//!   more ends while other runs go on: with the queue empty, always; while it may hold runs,
//!   only ends of runs quicker than a write, no longer than one ([`Pace`]).
//!
//! A run holds its drain [`Pass`] from before its claim until its end is recorded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use futures::FutureExt as _;
use opentelemetry::context::FutureExt as _;

use crate::clock::Clock;
use crate::context::{RunContext, RunEnv, Targets, retry_write};
use crate::decide::{Settled, StopReason, next_attempt, settle};
use crate::events::{Cancelled, Ended, InternalEvent, Observer, Op, RunRef};
use crate::gate::{Gate, Pass};
use crate::in_force::InForce;
use crate::run::{Outcome, Run, RunStatus};
use crate::signals::{Receiver, Signal, Signals};
use crate::snapshot::{JobSnapshot, TargetRef};
use crate::store::{Ends, Handed, LimitPass, Records, RunEnd, StoreError, Taken};

/// Ends are written in batches of at most this many runs.
const BATCH: usize = 1024;

/// Ends that gather ([`crate::store::Ends::ends_gather`]) stop gathering at this many: a
/// tick's runs on each of three workers (333 each), or half of one worker's 1,000.
const GATHER_UP_TO: usize = 512;

/// How quickly this worker's runs end and its writes of ends go through, as the recorder saw
/// them: whether ends are worth gathering while the queue holds runs ([`Pace::gather`]).
#[derive(Debug, Default)]
struct Pace {
    /// A moving average of the runs' work, from their execution's start to its end (not the
    /// wait for the recorder after it); none until a run has ended.
    work: Option<Duration>,
    /// How long the last write of ends took (its last attempt).
    write: Duration,
}

impl Pace {
    /// A run that worked this long ended.
    fn ended(&mut self, work: Duration) {
        self.work = Some(match self.work {
            None => work,
            Some(w) => (w * 7 + work) / 8,
        });
    }

    /// How ends wait for more, where the backend's gathering is `base`. With the queue empty
    /// their slots hold nothing back: while they keep coming no more than `base` apart (a
    /// tick's runs ending one after another), for up to [`GATHER_STREAM`] times `base` (a tick
    /// of 333 runs on each of three workers was written in 8 or 9 writes each with `base` as
    /// the whole wait, in 5 with four times it, in 1.4 with this; `cargo bench … postgres --
    /// shares`). Each end carries its own time, its run's `finished_at`. While it may hold
    /// runs, each end keeps a slot a queued run would take, and a write of ends is also the
    /// claim of as many runs: only for runs that end sooner than a write takes, and no longer
    /// than the last write took (waiting longer costs more than the write it saves). Either
    /// wait ends early once every end still to come is in ([`Executor::ends_to_come`]: the
    /// runs executing here, or every slot held while the queue may hold runs): with a long
    /// run among quick ones, each write waits its whole time, so a quick run's end may be
    /// recorded a write later.
    fn gather(&self, base: Duration, queue_may_hold: bool) -> Gathering {
        if !queue_may_hold {
            return Gathering { quiet: base, most: base * GATHER_STREAM };
        }
        match self.work {
            Some(work) if work < self.write => Gathering::within(base.min(self.write)),
            _ => Gathering::NONE,
        }
    }
}

/// How many times the backend's gathering ends may wait while they keep coming: 100 ms on
/// PostgreSQL, the longest a run then counts as running after it ended (before its write).
const GATHER_STREAM: u32 = 20;

/// How long a batch of ends waits for more: at most `most` from when it began, and no longer
/// than `quiet` after the last end that joined it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Gathering {
    quiet: Duration,
    most: Duration,
}

impl Gathering {
    const NONE: Gathering = Gathering { quiet: Duration::ZERO, most: Duration::ZERO };

    /// At most `d` in all, however the ends come.
    fn within(d: Duration) -> Self {
        Gathering { quiet: d, most: d }
    }

    /// Adds to `batch` what `rx` brings until `to_come` says no more are coming, the batch
    /// holds [`GATHER_UP_TO`] or something `urgent`, or the wait is over; returns at `stop`
    /// too.
    async fn gather<T>(
        self,
        rx: &mut mpsc::UnboundedReceiver<T>,
        batch: &mut Vec<T>,
        to_come: impl Fn() -> usize,
        urgent: impl Fn(&T) -> bool,
        stop: &CancellationToken,
    ) {
        if self.most.is_zero() || batch.iter().any(&urgent) {
            return;
        }
        let began = tokio::time::Instant::now();
        let mut last = began;
        while batch.len() < GATHER_UP_TO && to_come() > batch.len() {
            let until = (began + self.most).min(last + self.quiet);
            let room = GATHER_UP_TO - batch.len();
            let had = batch.len();
            tokio::select! {
                got = tokio::time::timeout_at(until, rx.recv_many(batch, room)) => {
                    if !matches!(got, Ok(n) if n > 0) || batch[had..].iter().any(&urgent) { break }
                    last = tokio::time::Instant::now();
                }
                () = stop.cancelled() => break,
            }
        }
    }
}

/// The longest a run's end waits for its last output lines to be recorded.
const LOG_FINISH_WITHIN: Duration = Duration::from_secs(5);

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

impl Ticket {
    /// Gives back the slots of `tickets` at once: the intake, woken by the first, sees them
    /// all and claims that many in one transaction (freed one by one, it claimed one run a
    /// transaction as often as not: measured in `cargo bench … runcore -- queue`).
    fn release_all(tickets: Vec<Ticket>) {
        let mut slots: Option<OwnedSemaphorePermit> = None;
        let mut passes = Vec::with_capacity(tickets.len());
        for Ticket { _slot: slot, _pass: pass } in tickets {
            match &mut slots {
                Some(all) => all.merge(slot),
                None => slots = Some(slot),
            }
            passes.push(pass);
        }
        // As a ticket drops: its slot, then its pass.
        drop(slots);
        drop(passes);
    }
}

/// The runs of one launch: each gives back a permit as it starts.
#[derive(Debug)]
pub(crate) struct Starting {
    started: Arc<tokio::sync::Semaphore>,
    runs: u32,
}

impl Starting {
    /// Once every run of the launch has started.
    pub(crate) async fn all_started(&self) {
        let _ = self.started.acquire_many(self.runs).await;
    }
}

/// Runs' tasks made ahead ([`Executor::ready`]), each waiting to be handed its run.
#[derive(Default)]
pub(crate) struct Ready(Vec<tokio::sync::oneshot::Sender<(Handed, Ticket, StartShare)>>);

/// One run's part of a launch, given up as its target is called or as it ends without one.
struct StartShare(Arc<tokio::sync::Semaphore>);

impl Drop for StartShare {
    fn drop(&mut self) {
        self.0.add_permits(1);
    }
}

/// A run that ended, on its way to the recorder.
struct Finished {
    run: Run,
    /// When its target was called (the claim recorded when it was claimed).
    started: Option<chrono::DateTime<chrono::Utc>>,
    end: Settled,
    /// How long it worked, from its execution's start to its end (none: it did not begin).
    work: Option<Duration>,
    /// When it ended, on the engine's clock: its `finished_at`, however long its end waits
    /// for the write that records it.
    ended: chrono::DateTime<chrono::Utc>,
    ticket: Ticket,
    /// The execution's trace, when spans are exported.
    trace_id: Option<String>,
}

/// What the executor is handed by the engine that composes it: narrow handles, no engine.
pub(crate) struct ExecutorEnv {
    pub(crate) ends: Arc<dyn Ends>,
    /// What each run records as it goes (handed to its context).
    pub(crate) records: Arc<dyn Records>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) targets: Arc<dyn Targets>,
    pub(crate) observer: Arc<Observer>,
    pub(crate) signals: Arc<dyn Signals>,
    pub(crate) config: Arc<InForce>,
    /// This worker's name, which its claims record.
    pub(crate) worker: String,
    /// Where storage faults seen while recording ends are reported.
    pub(crate) health: Arc<crate::health::Health>,
    /// Asked to prune the jobs of successes noticed with their ends (as the notifier asks for
    /// the runs it notices).
    pub(crate) retention: Arc<crate::retention::PruneQueue>,
}

/// The executor owns what runs take on their way: the `worker.concurrency` slots, the drain
/// gate, the runs executing here, and the way to the recorder.
///
/// Locking rule: the `std` lock guards the running map only and is never held across `.await`.
pub(crate) struct Executor {
    env: ExecutorEnv,
    /// `worker.concurrency`: the number of slots.
    concurrency: usize,
    slots: Arc<Semaphore>,
    gate: Arc<Gate>,
    finished: mpsc::UnboundedSender<Finished>,
    /// Runs executing in this process, by id, and whether the worker is fenced.
    running: Mutex<Tracked>,
    /// How many runs execute here, as it changes (for whoever waits for none).
    count: tokio::sync::watch::Sender<usize>,
    /// Set while the scheduler fires ticks: the ends of runs wait for the single writer until
    /// the burst's transactions are through ([`Executor::firing`]).
    firing: tokio::sync::watch::Sender<bool>,
    /// Whether the queue may hold runs: set by a push the intake hears of and by a take that
    /// came back full, cleared by one that came back short. Only a hint for the recorder
    /// (whether to claim with the ends it writes); the intake, woken by every push, is what
    /// guarantees that queued runs are taken.
    queue_may_hold: std::sync::atomic::AtomicBool,
}

/// Held while the scheduler fires a pass's ticks (see [`Executor::firing`]).
pub(crate) struct Firing<'a>(&'a tokio::sync::watch::Sender<bool>);

impl Drop for Firing<'_> {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

/// The longest the ends of runs wait for a pass of ticks to be fired.
const ENDS_WAIT_FOR_TICKS: Duration = Duration::from_millis(500);

/// The runs executing here and the fence, under one lock: a run claimed just before the
/// worker fenced itself (its claim in flight) is stopped as it starts.
#[derive(Debug, Default)]
struct Tracked {
    runs: HashMap<String, Arc<Running>>,
    /// Set while the worker is fenced: how long it went without a renewal.
    fenced: Option<Duration>,
}

/// The recorder's end of the executor's channel, taken by [`recorder`].
pub(crate) struct RecorderRx(mpsc::UnboundedReceiver<Finished>);

impl Executor {
    pub(crate) fn new(concurrency: usize, env: ExecutorEnv) -> (Arc<Self>, RecorderRx) {
        let (finished, rx) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(concurrency.max(1)));
        (
            Arc::new(Self {
                env,
                concurrency: concurrency.max(1),
                slots,
                gate: Arc::new(Gate::new()),
                finished,
                running: Mutex::default(),
                count: tokio::sync::watch::Sender::new(0),
                firing: tokio::sync::watch::Sender::new(false),
                queue_may_hold: std::sync::atomic::AtomicBool::new(false),
            }),
            RecorderRx(rx),
        )
    }

    /// Ticks come first on the single writer: while the guard is held, the recorder holds the
    /// ends of runs back (at most [`ENDS_WAIT_FOR_TICKS`]). A burst fired in several
    /// transactions then writes them one after the other; measured, the ends of the first
    /// transaction's runs, written between them, held the last ones back by up to 20 ms. An
    /// end waits in memory, its run not yet reported done: nothing is said before it is
    /// written.
    pub(crate) fn firing(&self) -> Firing<'_> {
        self.firing.send_replace(true);
        Firing(&self.firing)
    }

    /// Every run passes it before its claim and holds its pass until its end is recorded.
    pub(crate) fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Up to `n` tickets, without waiting: as many as there are free slots, none once the
    /// gate is closed.
    pub(crate) fn tickets(&self, n: usize) -> Vec<Ticket> {
        let mut out = Vec::new();
        while out.len() < n {
            let Ok(slot) = self.slots.clone().try_acquire_owned() else { break };
            let Some(pass) = self.gate.enter() else { break };
            out.push(Ticket { _slot: slot, _pass: pass });
        }
        out
    }

    /// Waits for a free slot, then takes up to `max` tickets; none once the gate is closed.
    /// Fewer than `enough` free: waits up to [`FULLER_CLAIM_WITHIN`] for more, so that a queue
    /// drains in claims of many runs rather than of one each.
    async fn tickets_when_free(&self, max: usize, enough: usize) -> Vec<Ticket> {
        let slot = tokio::select! {
            s = self.slots.clone().acquire_owned() => s.ok(),
            () = self.gate.closed() => None,
        };
        let (Some(slot), Some(pass)) = (slot, self.gate.enter()) else { return Vec::new() };
        let mut out = vec![Ticket { _slot: slot, _pass: pass }];
        out.extend(self.tickets(max.saturating_sub(1)));
        let until = tokio::time::Instant::now() + FULLER_CLAIM_WITHIN;
        while out.len() < enough.min(max) {
            let more = tokio::select! {
                s = self.slots.clone().acquire_owned() => s.ok(),
                () = tokio::time::sleep_until(until) => None,
            };
            let (Some(slot), Some(pass)) = (more, self.gate.enter()) else { break };
            out.push(Ticket { _slot: slot, _pass: pass });
            if self.gate.is_closed() {
                break;
            }
            out.extend(self.tickets(max.saturating_sub(out.len())));
        }
        out
    }

    /// Starts claimed runs, one ticket each; tickets left over are returned (dropped). The
    /// answer tells when every one of them has started (its target called, or it ended
    /// without one).
    pub(crate) fn launch(self: &Arc<Self>, runs: Vec<Handed>, tickets: Vec<Ticket>) -> Starting {
        self.launch_ready(Ready::default(), runs, tickets)
    }

    /// Makes `n` runs' tasks ahead of a held tick transaction's commit, each waiting for the
    /// run it will be handed: made at the instant, a thousand of them were a serial part of a
    /// burst's start (each a new task of two kilobytes, on the thread that launches them, while
    /// the runs already handed over waited for the other one). Nothing of a run is done before
    /// it is handed over, so a transaction let go or failed leaves nothing: its waiting tasks
    /// end as the [`Ready`] is dropped.
    pub(crate) fn ready(self: &Arc<Self>, n: usize) -> Ready {
        Ready(
            (0..n)
                .map(|_| {
                    let (tx, rx) = tokio::sync::oneshot::channel::<(Handed, Ticket, StartShare)>();
                    let exec = self.clone();
                    tokio::spawn(async move {
                        if let Ok((handed, ticket, share)) = rx.await {
                            run_one(exec, handed, ticket, share).await;
                        }
                    });
                    tx
                })
                .collect(),
        )
    }

    /// [`Executor::launch`] into the tasks `ready` made, as many as there are; the tasks left
    /// over end.
    pub(crate) fn launch_ready(self: &Arc<Self>, ready: Ready, runs: Vec<Handed>, tickets: Vec<Ticket>) -> Starting {
        debug_assert!(runs.len() <= tickets.len());
        if !runs.is_empty() {
            self.env.signals.publish(Signal::RunsChanged);
        }
        let mut tickets = tickets;
        let spare = tickets.split_off(runs.len().min(tickets.len()));
        let started = Arc::new(tokio::sync::Semaphore::new(0));
        let mut launched = 0;
        let mut waiting = ready.0.into_iter();
        for (handed, ticket) in runs.into_iter().zip(tickets) {
            let run = (handed, ticket, StartShare(started.clone()));
            // A task made ahead is handed its run; with none (or one gone with the runtime),
            // the run gets a task of its own.
            let unsent = match waiting.next() {
                Some(task) => task.send(run).err(),
                None => Some(run),
            };
            if let Some((handed, ticket, share)) = unsent {
                // Boxed: spawning moves the future whole, several times, into the new task.
                tokio::spawn(Box::pin(run_one(self.clone(), handed, ticket, share)));
            }
            launched += 1;
        }
        Ticket::release_all(spare);
        Starting { started, runs: launched }
    }

    /// Number of runs executing here.
    pub(crate) fn running_count(&self) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).runs.len()
    }

    /// How many runs' ends the recorder may still see, its batch's included: while the queue
    /// may hold runs, every slot held, since the runs the last write claimed hold theirs before
    /// they start (a write that waited only for the runs started carried two thirds of a
    /// drain's concurrency, measured in `cargo bench … postgres -- drain`; the intake's tickets
    /// of a claim in flight count too, for as long as the gathering lasts); otherwise the runs
    /// executing here.
    fn ends_to_come(&self, queue_may_hold: bool) -> usize {
        if queue_may_hold { self.concurrency.saturating_sub(self.slots.available_permits()) } else { self.running_count() }
    }

    /// Registers a run that starts executing here; stopped at once while the worker is fenced.
    fn track(&self, id: &str) -> Arc<Running> {
        let entry = Arc::new(Running::default());
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(after) = running.fenced {
            entry.stop(StopReason::Fenced(after));
        }
        running.runs.insert(id.to_string(), entry.clone());
        self.count.send_replace(running.runs.len());
        entry
    }

    /// Forgets a run whose end is recorded (or given up on).
    fn untrack(&self, id: &str) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.runs.remove(id);
        self.count.send_replace(running.runs.len());
    }

    /// Waits until no run executes here.
    pub(crate) async fn idle(&self) {
        let _ = self.count.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Stops a run if it executes here.
    pub(crate) fn stop_here(&self, id: &str, why: String) -> bool {
        let entry = self.running.lock().unwrap_or_else(|e| e.into_inner()).runs.get(id).cloned();
        match entry {
            Some(r) => {
                r.stop(StopReason::Cancelled(why));
                true
            }
            None => false,
        }
    }

    /// Stops every run executing here and takes none until [`Executor::unfence`]: the worker
    /// could not renew its lease for `after`. Returns how many runs were stopped.
    pub(crate) fn fence(&self, after: Duration) -> usize {
        self.gate.hold(true);
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.fenced = Some(after);
        for r in running.runs.values() {
            r.stop(StopReason::Fenced(after));
        }
        running.runs.len()
    }

    /// Takes work again (the lease was renewed, and the runs stopped by the fence are gone).
    pub(crate) fn unfence(&self) {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).fenced = None;
        self.gate.hold(false);
    }

    /// Stops every run executing here (the drain's grace is over); returns how many.
    pub(crate) fn stop_all(&self, why: &StopReason) -> usize {
        let left: Vec<Arc<Running>> = self.running.lock().unwrap_or_else(|e| e.into_inner()).runs.values().cloned().collect();
        for r in &left {
            r.stop(why.clone());
        }
        left.len()
    }

    /// Stops a run: a running one is told to stop and records the reason itself (here, or on
    /// whichever worker runs it: its work must stop, not only its row); a queued or waiting one
    /// is marked cancelled.
    pub(crate) async fn stop_run(&self, id: &str, why: String, now: chrono::DateTime<chrono::Utc>) -> bool {
        // Twice at most: a queued run may be claimed between the two writes.
        for _ in 0..2 {
            if self.stop_here(id, why.clone()) {
                return true;
            }
            // Running elsewhere: the request is kept with the run first, so a worker that misses
            // the signal (its listener reconnecting) finds it when it reads what it missed, and
            // a takeover of a gone worker's run cancels it rather than retrying it.
            match self.env.ends.request_cancel(id, &why).await {
                Ok(true) => {
                    self.env.signals.publish(Signal::CancelRequested { run: id.to_string(), why });
                    return true;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(run = id, error = %e, "cannot keep the cancel request");
                    return false;
                }
            }
            match self.env.ends.finish(id, RunStatus::Cancelled, None, Some(&why), now).await {
                Ok(true) => {
                    self.env.signals.publish(Signal::RunFinished(id.to_string()));
                    return true;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(run = id, error = %e, "cannot cancel the run");
                    return false;
                }
            }
        }
        false
    }

    /// Creates the next attempt of a failed or interrupted run, due at `due_at` (as decided by
    /// [`next_attempt`]), with the same identity and job snapshot; with no `due_at`, marks the
    /// run as having none.
    pub(crate) async fn follow_up(
        &self,
        run: &Run,
        due_at: Option<chrono::DateTime<chrono::Utc>>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<String>, StoreError> {
        match due_at {
            Some(due) => {
                let id = self.env.ends.follow_up(run, due, now).await?;
                if let Some(id) = &id {
                    self.env.observer.run_created(&run.owner, run.trigger, id);
                }
                Ok(id)
            }
            None => {
                self.env.ends.mark_no_follow_up(&run.id).await?;
                Ok(None)
            }
        }
    }
}

/// One claimed run, in a task of its own: a panic of its target becomes this run's end. The
/// run's span is the root of its trace; its `before` hooks may cancel it.
async fn run_one(exec: Arc<Executor>, handed: Handed, ticket: Ticket, share: StartShare) {
    let Handed { run, snapshot, resumed } = handed;
    let entry = exec.track(&run.id);
    let obs = exec.env.observer.clone();
    obs.run_started(&run, run.lateness(), resumed);
    let op = Op::Run { job: run.owner.to_string(), trigger: run.trigger.as_str(), attempt: run.attempt };
    let started = Arc::new(std::sync::OnceLock::new());
    // What it awaits is inline, so the task is whole when it is made: a held tick's runs get
    // theirs ahead of the instant (`Executor::ready`), and then allocate and copy no future of
    // their own as they start (boxed here, the three were copied into fresh pages at the
    // instant; inline, a burst's last start came 1.7 ms sooner: BENCHMARKS.md). A task made at
    // the launch boxes the whole run once instead.
    let (end, trace_id, work) = match obs.begin(op, RunRef::from(&run), None).await {
        Err(Cancelled(why)) => (settle(None, Some(StopReason::Cancelled(why))), None, None),
        Ok(op) => {
            // A resumed run keeps its first start.
            let started_now = (!resumed).then(|| started.clone());
            let work = execute(exec.clone(), run.clone(), snapshot, entry, started_now, share).with_context(op.context());
            // In this task, not one of its own: a run is one task from claim to end (a second
            // one per run was a tenth of a burst's launch cost), and a panic is caught here.
            let began = std::time::Instant::now();
            let end = match std::panic::AssertUnwindSafe(work).catch_unwind().await {
                Ok(end) => end,
                Err(panic) => crate::decide::panicked(panic_message(panic.as_ref())),
            };
            let work = began.elapsed();
            let trace_id = op.trace_id();
            op.end(&obs, Ended { status: Some(end.status), error: end.error.as_deref(), ..Ended::ok() }).await;
            (end, trace_id, Some(work))
        }
    };
    // The recorder lives until the drain is over; if it is gone the process is stopping and
    // the run is recovered at the next start.
    let started = started.get().copied();
    let ended = exec.env.clock.now();
    let _ = exec.finished.send(Finished { run, started, end, work, ended, ticket, trace_id });
}

/// What a panic said, when it said it with a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("(no message)")
}

async fn execute(
    exec: Arc<Executor>,
    run: Run,
    snapshot: Option<JobSnapshot>,
    entry: Arc<Running>,
    started: Option<Arc<std::sync::OnceLock<chrono::DateTime<chrono::Utc>>>>,
    share: StartShare,
) -> Settled {
    // The job as it was when the run was created; rows from before snapshots use the config
    // in force.
    let config = exec.env.config.get();
    let mut snapshot = snapshot.or_else(|| run.owner.job().and_then(|j| config.jobs.get(j)).map(|j| config.snapshot_of(j)));
    // Runs stored before workflow definitions were kept with them follow the config in force.
    if let Some(JobSnapshot { target: TargetRef::Workflow { workflow, definition: definition @ None }, .. }) = &mut snapshot {
        *definition = config.workflows.get(workflow).cloned();
    }
    let outcome = match snapshot {
        // Stopped before it began (claimed as the worker fenced itself): nothing is started.
        _ if entry.token.is_cancelled() => None,
        None => Some(Outcome::permanent(format!("job \"{}\" is no longer defined", run.owner))),
        Some(job) => {
            let job = Arc::new(job);
            let env = RunEnv {
                data_dir: config.data_dir.clone(),
                records: exec.env.records.clone(),
                clock: exec.env.clock.clone(),
                agents: config.agents.clone(),
                observer: exec.env.observer.clone(),
                signals: exec.env.signals.clone(),
            };
            let run_id = run.id.clone();
            // A resumed run keeps its first start: none is recorded for this execution.
            let resumed = started.is_none();
            let ctx = RunContext::new(run, resumed, job.clone(), entry.token.clone(), env);
            let live = ctx.output().clone();
            let _writer = live.guard();
            // The run's start, as recorded: the moment its target is called.
            let clock = exec.env.clock.clone();
            let now = clock.now();
            if let Some(started) = started {
                let _ = started.set(now);
            }
            drop(share);
            let work = exec.env.targets.run(ctx);
            // On the engine's clock, like every other time limit: tests move it.
            let deadline = job.timeout().and_then(|t| now.checked_add_signed(chrono::TimeDelta::from_std(t).ok()?));
            let limit = async {
                match deadline {
                    Some(at) => clock.sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let outcome = tokio::select! {
                o = work => Some(o),
                () = limit => {
                    if let Some(t) = job.timeout() {
                        entry.stop(StopReason::TimedOut(t));
                    }
                    None
                }
                () = entry.token.cancelled() => None,
            };
            // Why it stopped, as the work ended: a stop asked for later (a fence while the last
            // lines wait for the database) comes after the outcome and does not replace it.
            let stop = stop_reason(&entry);
            // Every line printed is recorded before the end is, unless the database takes too
            // long: the log never holds up the end.
            if tokio::time::timeout(LOG_FINISH_WITHIN, live.finish()).await.is_err() {
                tracing::warn!(run = %run_id, "the run's last output lines are not recorded: the database is slow; its end is recorded without them");
            }
            // A cancel asked during that wait still stops a run that would go on (waiting for
            // an approval or for a step's limits): nothing else would record it.
            let goes_on = matches!(outcome, Some(Outcome::Waiting { .. } | Outcome::WaitingForLimits { .. }));
            let stop = stop.or_else(|| stop_reason(&entry).filter(|r| goes_on && matches!(r, StopReason::Cancelled(_))));
            return settle(outcome, stop);
        }
    };
    settle(outcome, stop_reason(&entry))
}

/// The reason the run was told to stop, if it was.
fn stop_reason(entry: &Running) -> Option<StopReason> {
    entry.reason.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Writes the ends of whatever runs have finished (up to [`BATCH`]) in one transaction, with
/// the claims of queued runs that take their slots while the queue may hold some; then starts
/// those runs and frees the slots left over.
pub(crate) async fn recorder(exec: Arc<Executor>, rx: RecorderRx, stop: CancellationToken) {
    let mut rx = rx.0;
    let mut batch = Vec::with_capacity(BATCH);
    let mut pace = Pace::default();
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => if n == 0 { return },
            () = stop.cancelled() => return,
        }
        // Ticks being fired go first; the ends that arrive meanwhile join this batch. (The
        // wait is the firing's, some milliseconds; each end carries the time its run ended.)
        let mut firing = exec.firing.subscribe();
        if *firing.borrow() {
            tokio::select! {
                _ = tokio::time::timeout(ENDS_WAIT_FOR_TICKS, firing.wait_for(|f| !*f)) => {}
                () = stop.cancelled() => {}
            }
            while batch.len() < BATCH {
                let Ok(f) = rx.try_recv() else { break };
                batch.push(f);
            }
        }
        // Ends that free no limit's slot gather while other runs are still going (one that
        // frees one ends the gathering: its slot goes to the head of its line now), where a
        // write costs a round trip and a commit: a few milliseconds, longer while they keep
        // coming; while the queue may hold runs, only ends of runs quicker than a write, and no
        // longer than one ([`Pace`]): a drain's write then carries the ends (and claims) of
        // every run the last one claimed, not half of them.
        let queue_may_hold = exec.queue_may_hold.load(Relaxed);
        let frees_a_slot = |f: &Finished| !f.run.pools.is_empty();
        let gathering = pace.gather(exec.env.ends.ends_gather(), queue_may_hold);
        gathering.gather(&mut rx, &mut batch, || exec.ends_to_come(queue_may_hold), frees_a_slot, &stop).await;
        let now = exec.env.clock.now();
        for work in batch.iter().filter_map(|f| f.work) {
            pace.ended(work);
        }
        // Each end's next attempt, decided before the end is written: an end no attempt
        // follows is recorded as the run's outcome in the same statement.
        let config = exec.env.config.get();
        let retries: Vec<Option<chrono::DateTime<chrono::Utc>>> = batch
            .iter()
            .map(|f| f.end.retry.then(|| next_attempt(f.run.attempt, config.retries_for(&f.run.owner).as_ref(), now)).flatten())
            .collect();
        // The successes whose notice could do nothing more than their end's write does.
        let noticed: Vec<bool> = batch.iter().map(|f| config.noticed_at_end(&f.run.owner, f.end.status)).collect();
        drop(config);
        // The slots these runs free are filled again in the same write while the queue may
        // hold runs; after a failed attempt, the ends are written alone (the intake claims).
        let refill = if exec.queue_may_hold.load(Relaxed) && exec.gate.admits() { batch.len() } else { 0 };
        let claim_too = AtomicBool::new(refill > 0);
        // The pools whose slots these ends free: the runs waiting for them are admitted in the
        // same write, into these runs' slots first.
        let mut freed_pools: Vec<crate::limits::Pool> = batch.iter().flat_map(|f| f.run.pools.iter().cloned()).collect();
        freed_pools.sort();
        freed_pools.dedup();
        let sizes = exec.env.config.get().limits.clone();
        let admit_into = if exec.gate.admits() { batch.len() } else { 0 };
        // A run queued again for a workflow step's limits: what it waits for.
        let requeued: Vec<Option<String>> = batch.iter().map(|f| f.end.pools.as_deref().and_then(crate::limits::stored)).collect();
        let ends: Vec<RunEnd<'_>> = batch
            .iter()
            .zip(&retries)
            .zip(&requeued)
            .zip(&noticed)
            .map(|(((f, retry), limits), &noticed)| RunEnd {
                id: &f.run.id,
                started_at: f.started,
                ended_at: Some(f.ended),
                status: f.end.status,
                output: f.end.output.as_ref(),
                error: f.end.error.as_deref(),
                wait_until: f.end.wait_until,
                trace_id: f.trace_id.as_deref(),
                // Only a failure's finality depends on it (a success or a cancel is final); an
                // interrupted run's follow-up is recovery's to decide.
                last: matches!(f.end.status, RunStatus::Failed | RunStatus::TimedOut) && retry.is_none(),
                limits: limits.as_deref(),
                noticed,
            })
            .collect();
        // Until the database takes them (a server restarting, a failover): the runs keep
        // their slots meanwhile, so nothing new starts on a worker that cannot record. Only a
        // stop gives up (the runs are then recovered as interrupted).
        // The last attempt's time, for the pace (a retry's backoff is not a write's time).
        let last_write_us = std::sync::atomic::AtomicU64::new(0);
        let finish = || async {
            let began = std::time::Instant::now();
            let n = if claim_too.load(Relaxed) { refill } else { 0 };
            let res = if freed_pools.is_empty() {
                exec.env.ends.finish_and_claim(&ends, n, &exec.env.worker, now).await
            } else {
                let pass = LimitPass { due: &[], sizes: &sizes, waiters: false, freed: &freed_pools, spare: admit_into };
                exec.env.ends.finish_and_admit(&ends, pass, n, &exec.env.worker, now).await
            };
            let took_us = began.elapsed().as_micros() as u64;
            last_write_us.store(took_us, Relaxed);
            match &res {
                Ok((_, taken)) => exec.env.observer.emit(InternalEvent::EndsRecorded {
                    runs: ends.len(),
                    claimed: taken.runs.len(),
                    finish_us: took_us,
                    at_ms: exec.env.clock.now().timestamp_millis(),
                    write: taken.write,
                }),
                Err(_) => claim_too.store(false, Relaxed),
            }
            res
        };
        let failed = |e: &StoreError, attempt: u32| {
            exec.env.health.storage_failed(e);
            if attempt == 1 || attempt.is_multiple_of(10) {
                tracing::error!(runs = ends.len(), attempt, error = %e, "cannot record the end of runs; retrying");
            }
            true
        };
        let written = retry_write(&stop, failed, finish).await;
        pace.write = Duration::from_micros(last_write_us.load(Relaxed));
        let (recorded, taken): (std::collections::HashSet<String>, Taken) = match written {
            Ok(((done, taken), attempts)) => {
                exec.env.health.storage_ok();
                if attempts > 1 {
                    tracing::info!(runs = ends.len(), attempts, "the end of runs is recorded");
                }
                if done.len() < ends.len() {
                    // Not recorded: the run is no longer running (cancelled, taken over), or it
                    // is and the fence refused this worker's write (its lease ran out or its
                    // epoch is gone); the second is told.
                    let left: Vec<&str> = ends.iter().map(|e| e.id).filter(|id| !done.iter().any(|d| d == id)).collect();
                    match exec.env.ends.still_running(&left).await {
                        Ok(refused) => exec.env.observer.ends_refused(left.len(), &refused),
                        Err(e) => tracing::debug!(error = %e, runs = left.len(), "ends not recorded; cannot tell why"),
                    }
                }
                if claim_too.load(Relaxed) {
                    exec.queue_may_hold.store(taken.tasks == refill.saturating_sub(taken.admitted) || taken.unfinished, Relaxed);
                }
                if taken.unfinished {
                    exec.env.signals.publish(Signal::Wake);
                    exec.env.signals.publish(Signal::TasksPushed);
                }
                if taken.pushed > 0 {
                    exec.env.signals.publish(Signal::TasksPushed);
                }
                for (limit, waited) in &taken.waited {
                    exec.env.observer.limit_waited(limit, *waited);
                }
                (done.into_iter().collect(), taken)
            }
            // Stopped: the runs are recovered as interrupted at the next start.
            Err(_) => Default::default(),
        };
        drop(ends);
        // A claim given up on may have left tasks behind that the intake, its own take short
        // while this transaction held them (PostgreSQL skips locked tasks), will not look for
        // until the next push: it is told now.
        if refill > 0 && !claim_too.load(Relaxed) {
            exec.queue_may_hold.store(true, Relaxed);
            exec.env.signals.publish(Signal::TasksPushed);
        }
        // The runs claimed with the ends start at once, on the tickets of the first ends (each
        // holds its pass until its own end is recorded, in a later batch); the other tickets
        // are freed after the retries below are written.
        let mut freed: Vec<Ticket> = Vec::with_capacity(batch.len());
        let mut ended = Vec::with_capacity(batch.len());
        for f in batch.drain(..) {
            freed.push(f.ticket);
            ended.push((f.run, f.end));
        }
        let left = freed.split_off(taken.runs.len().min(freed.len()));
        exec.launch(taken.runs, freed);
        // A wait with an end is a new due time, and a run queued again for limits is due: the
        // scheduler reads them (a run's end alone does not wake it unless runs are held back).
        let waits_end = ended.iter().any(|(_, end)| end.wait_until.is_some() || end.status == RunStatus::Queued);
        for (((run, end), retry), noticed) in ended.into_iter().zip(retries).zip(noticed) {
            // Only now, with the end recorded (or given up on: the run is recovered as
            // interrupted at the next start), does the run leave the running map.
            exec.untrack(&run.id);
            // Noticed with its end: its job's history may be pruned, as a notice pass asks.
            if noticed && end.status == RunStatus::Succeeded && recorded.contains(&run.id) {
                exec.env.retention.prune_soon(&run.owner.to_string(), now, 1);
            }
            if end.cause == crate::decide::EndCause::Panicked {
                tracing::error!(run = %run.id, job = %run.owner, error = end.error.as_deref().unwrap_or(""), "run panicked");
            }
            exec.env.observer.run_finished(&run, end.status, end.error.as_deref(), end.wait_until);
            // Only this end's own record decides a retry: a run fenced or cancelled meanwhile is
            // followed up by whoever recorded its end.
            if recorded.contains(&run.id)
                && let Some(due) = retry
            {
                schedule_retry(&exec, &run, due, now).await;
            }
            exec.env.signals.publish(Signal::RunFinished(run.id.clone()));
        }
        if waits_end {
            exec.env.signals.publish(Signal::Wake);
        }
        // After the retries are written: a drain waits for the passes, and a retry not yet
        // written when the process stops would be lost (an end no attempt follows is final).
        Ticket::release_all(left);
    }
}

/// Creates the next attempt of a failed run, due after the job's backoff.
async fn schedule_retry(exec: &Executor, run: &Run, due: chrono::DateTime<chrono::Utc>, now: chrono::DateTime<chrono::Utc>) {
    match exec.follow_up(run, Some(due), now).await {
        Ok(Some(id)) => tracing::info!(run = %run.id, retry = %id, due = ?due, "retry scheduled"),
        Ok(None) => {}
        Err(e) => tracing::error!(run = %run.id, error = %e, "cannot schedule a retry"),
    }
    exec.env.signals.publish(Signal::Wake);
}

/// Stops runs executing here when a stop is asked for through the signals (by another
/// process, or for a run that was being claimed when it was asked). A receiver that may have
/// missed some (`Lagged`: it fell behind, or the listener reconnected) reads the requests kept
/// with this worker's runs instead, until a read goes through.
pub(crate) async fn canceller(exec: Arc<Executor>, mut signals: Receiver, stop: CancellationToken) {
    let mut behind = false;
    loop {
        let signal = if behind {
            tokio::select! {
                s = signals.recv() => s,
                () = tokio::time::sleep(Duration::from_secs(1)) => Some(Signal::Lagged),
                () = stop.cancelled() => return,
            }
        } else {
            tokio::select! {
                s = signals.recv() => s,
                () = stop.cancelled() => return,
            }
        };
        match signal {
            None => return,
            Some(Signal::CancelRequested { run, why }) => {
                exec.stop_here(&run, why);
            }
            Some(Signal::Lagged) => match exec.env.ends.cancels_requested(&exec.env.worker).await {
                Ok(asked) => {
                    behind = false;
                    for (run, why) in asked {
                        if exec.stop_here(&run, why) {
                            tracing::info!(run, "a cancel missed while the signals were behind is applied");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the cancels asked for; retrying");
                    behind = true;
                }
            },
            Some(_) => {}
        }
    }
}

/// Most tasks taken in one claim.
const CLAIM_BATCH: usize = 1024;

/// How long the intake waits for a fuller claim (a quarter of the slots) once one slot is free.
/// Measured on 50,000 queued runs at concurrency 32 (`cargo bench … runcore -- queue`): with
/// slots taken as they came free, a claim took one run as often as not, each a transaction.
const FULLER_CLAIM_WITHIN: Duration = Duration::from_millis(2);

/// Takes queued runs into free slots until `stop`: woken when tasks are pushed; while tasks
/// remain it waits only for slots. No polling: a queue that came up short sleeps until the next
/// push wakes it.
pub(crate) async fn intake(exec: Arc<Executor>, mut signals: Receiver, stop: CancellationToken) {
    // This receiver was subscribed before the scheduler could push, so every later push wakes
    // it; but runs queued before this worker started (on PostgreSQL the queue outlives every
    // worker: runs queued as the last one stopped, or inserted while none was up) were pushed
    // to nobody. One look at start takes them; the lease is held by now.
    let mut more = true;
    exec.queue_may_hold.store(true, Relaxed);
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
            exec.queue_may_hold.store(true, Relaxed);
        }
        let tickets = tokio::select! {
            t = exec.tickets_when_free(CLAIM_BATCH, exec.concurrency / 4) => t,
            () = stop.cancelled() => return,
        };
        if tickets.is_empty() {
            // The gate is closed: nothing more is claimed; queued runs stay for the next start.
            if exec.gate.is_closed() {
                stop.cancelled().await;
                return;
            }
            // Held (the worker fenced itself): claim again once it admits.
            tokio::select! {
                () = exec.gate.admitting() => {}
                () = stop.cancelled() => return,
            }
            more = true;
            continue;
        }
        let asked = tickets.len();
        let now = exec.env.clock.now();
        let began = std::time::Instant::now();
        match exec.env.ends.claim_queued(asked, &exec.env.worker, now).await {
            Ok(taken) => {
                exec.env.observer.emit(InternalEvent::ClaimedFromQueue {
                    asked,
                    tasks: taken.tasks,
                    runs: taken.runs.len(),
                    claim_us: began.elapsed().as_micros() as u64,
                });
                // A full batch: there may be more behind it.
                more = taken.tasks == asked;
                exec.queue_may_hold.store(more, Relaxed);
                exec.launch(taken.runs, tickets);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what `f` returns, without calling it.
    fn answer_size<A, B, C, D, F>(_: fn(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn a_runs_task_is_small_enough_to_make_a_thousand_ahead() {
        // Every run's task carries what a plugin action's run awaits, inline: a burst of 1,000
        // makes and touches that much before its instant, and a launch copies it once. An
        // agent's or a workflow's state is boxed where the target awaits it, and must stay so.
        let size = answer_size(run_one);
        assert!(size <= 6144, "a run's task is {size} bytes: box what a rare target awaits");
    }

    #[test]
    fn ends_gather_while_the_queue_holds_runs_only_for_runs_quicker_than_a_write() {
        let ms = Duration::from_millis;
        let base = ms(5);
        let stream = Gathering { quiet: base, most: ms(100) };
        let mut pace = Pace::default();
        assert_eq!(pace.gather(base, false), stream, "the queue empty: the backend's gathering, longer for a stream of ends");
        assert_eq!(pace.gather(base, true), Gathering::NONE, "no run ended yet: none");
        pace.write = ms(2);
        pace.ended(Duration::from_micros(100));
        assert_eq!(pace.gather(base, true), Gathering::within(ms(2)), "runs quicker than a write: no longer than the last write");
        pace.write = ms(8);
        assert_eq!(pace.gather(base, true), Gathering::within(base), "nor than the backend's gathering");
        assert_eq!(pace.gather(Duration::ZERO, true), Gathering::NONE, "a backend that does not gather (SQLite): none");
        assert_eq!(pace.gather(Duration::ZERO, false).most, Duration::ZERO, "not even with the queue empty");
        // Runs of 10 ms come to dominate the average: a write is sooner than they end.
        for _ in 0..40 {
            pace.ended(ms(10));
        }
        assert_eq!(pace.gather(base, true), Gathering::NONE, "runs slower than a write: their ends go at once");
        assert_eq!(pace.gather(base, false), stream, "unless the queue is empty");
    }

    /// What `gathering` adds to a batch of one while `ends` (ms from the start, in order) are
    /// sent and `to_come` ends are expected in all; and when (ms) it returned. The end sent at
    /// 13 ms is urgent (it frees a limit's slot).
    async fn gathered(gathering: Gathering, ends: &[u64], to_come: usize) -> (Vec<u64>, u64) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let start = tokio::time::Instant::now();
        let sends: Vec<u64> = ends.to_vec();
        tokio::spawn(async move {
            for at in sends {
                tokio::time::sleep_until(start + Duration::from_millis(at)).await;
                let _ = tx.send(at);
            }
        });
        let mut batch = vec![0];
        gathering.gather(&mut rx, &mut batch, || to_come, |&at| at == 13, &CancellationToken::new()).await;
        (batch.split_off(1), start.elapsed().as_millis() as u64)
    }

    #[tokio::test(start_paused = true)]
    async fn ends_that_keep_coming_are_gathered_until_a_quiet_or_the_longest_wait() {
        let ms = Duration::from_millis;
        let stream = Gathering { quiet: ms(5), most: ms(20) };
        // An end every 3 ms: gathered until the longest wait, the rest left for the next write.
        let every_3: Vec<u64> = (1..=10).map(|i| i * 3).collect();
        assert_eq!(gathered(stream, &every_3, 100).await, (vec![3, 6, 9, 12, 15, 18], 20));
        // A quiet of 5 ms ends it, as soon as it has lasted.
        assert_eq!(gathered(stream, &[2, 4, 12], 100).await, (vec![2, 4], 9));
        // Every run's end in: no wait for more.
        assert_eq!(gathered(stream, &[2, 4, 12], 3).await, (vec![2, 4], 4));
        // An end that frees a limit's slot goes at once, with what came before it.
        assert_eq!(gathered(stream, &[3, 6, 9, 13, 15], 100).await, (vec![3, 6, 9, 13], 13));
        // A wait within a time gathers no longer, however the ends come.
        assert_eq!(gathered(Gathering::within(ms(5)), &every_3, 100).await, (vec![3], 5));
        assert_eq!(gathered(Gathering::NONE, &every_3, 100).await, (vec![], 0));
    }
}
