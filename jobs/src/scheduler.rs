//! The scheduler loop: keeps each job's next tick, sleeps until the earliest one (or until told
//! that something changed), fires due ticks through the database's unique tick key, applies
//! catch-up after downtime, and hands due runs to the queue. No polling: an idle scheduler
//! sleeps until its next tick.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use lamplighter_config::{JobConfig, JsonText, Overlap, Schedule};

use crate::clock::Clock;
use crate::events::{InternalEvent, Observer, TxTimings};
use crate::executor::Executor;
use crate::in_force::{InForce, JobsConfig};
use crate::retention::PruneQueue;
use crate::run::{Owner, RunStatus, Trigger};
use crate::schedule::{TickPolicy, due_ticks};
use crate::share::Share;
use crate::signals::{Receiver, Signal, Signals};
use crate::store::{Claim, DUE_BATCH, Due, Handover, JobState, JobStates, LimitPass, NewRun, Ticks};

struct Entry {
    schedule: Arc<Schedule>,
    /// The last tick processed (fired, skipped or caught up).
    last: Option<DateTime<Utc>>,
    /// The next tick and when it fires (tick + jitter).
    next: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// Taken over from another worker's share and not yet fired since: every tick that fires
    /// from this instant on (when the other may have stopped offering them) fires
    /// ([`TickPolicy::each_since`]).
    gained: Option<DateTime<Utc>>,
}

/// The scheduled jobs and when each fires next. Built whole from the config in force (and
/// again when the jobs change together: a reload, a signal missed), so a job is its place in
/// `entries`: 10,000 jobs are planned in about 1 MB, where a map by name and a set of
/// (instant, name) took 2. A change of a few named jobs (a runtime job saved, a pause) plans
/// only them again.
#[derive(Default)]
struct Plan {
    /// In the config's (name) order up to `sorted`, then as added; a job's place does not
    /// change until the plan is built again.
    entries: Vec<(String, Entry)>,
    /// When each planned job fires next, by its place in `entries`.
    order: BTreeSet<(DateTime<Utc>, usize)>,
    /// How many of `entries` are in name order: those of the last whole build.
    sorted: usize,
    /// Where each job added since the last whole build is.
    added: HashMap<String, usize>,
}

impl Plan {
    /// Job `name`'s place, if it has one.
    fn find(&self, name: &str) -> Option<usize> {
        let sorted = self.entries.get(..self.sorted).unwrap_or_default();
        sorted.binary_search_by(|(n, _)| n.as_str().cmp(name)).ok().or_else(|| self.added.get(name).copied())
    }

    /// Job `name`'s place, given to it as `entry` (a place kept, or a new one).
    fn put(&mut self, name: &str, entry: Entry) -> usize {
        if let Some(i) = self.find(name) {
            if let Some((_, Entry { next: Some((_, at)), .. })) = self.entries.get(i) {
                self.order.remove(&(*at, i));
            }
            if let Some(e) = self.entries.get_mut(i) {
                e.1 = entry;
            }
            return i;
        }
        self.entries.push((name.to_owned(), entry));
        self.added.insert(name.to_owned(), self.entries.len() - 1);
        self.entries.len() - 1
    }

    /// Job `name` is not planned (its place stays, empty).
    fn drop_job(&mut self, name: &str) {
        if let Some(i) = self.find(name)
            && let Some((_, e)) = self.entries.get_mut(i)
            && let Some((_, at)) = e.next.take()
        {
            self.order.remove(&(at, i));
        }
    }

    /// Job `name` as `from` has it (the plan the loop fired from while this one was built), in
    /// place of what this plan read before: not planned there or not in `share`, not planned.
    fn adopt(&mut self, name: &str, from: &Plan, share: &Share) {
        let theirs = from.find(name).and_then(|i| from.entries.get(i)).map(|(_, e)| e).filter(|e| e.next.is_some() && share.owns(name));
        let Some(e) = theirs else {
            self.drop_job(name);
            return;
        };
        let i = self.put(name, Entry { schedule: e.schedule.clone(), last: e.last, next: e.next, gained: e.gained });
        if let Some((_, at)) = e.next {
            self.order.insert((at, i));
        }
    }

    /// The earliest instant a job fires at, and how many fire at it.
    fn next_instant(&self) -> Option<(DateTime<Utc>, usize)> {
        let &(at, _) = self.order.first()?;
        Some((at, self.order.range((at, 0)..=(at, usize::MAX)).count()))
    }

    fn set_next(&mut self, i: usize, cfg: &JobConfig, from: DateTime<Utc>) {
        let next = self.entries.get(i).and_then(|(_, e)| e.schedule.next_after(from));
        self.set_next_tick(i, cfg, next);
    }

    /// Plans `tick` (already computed) as job `i`'s next one.
    fn set_next_tick(&mut self, i: usize, cfg: &JobConfig, tick: Option<DateTime<Utc>>) {
        let Some((_, e)) = self.entries.get_mut(i) else {
            return;
        };
        if let Some((_, at)) = e.next.take() {
            self.order.remove(&(at, i));
        }
        e.next = fires(cfg, &e.schedule, tick);
        if let Some((_, at)) = e.next {
            self.order.insert((at, i));
        }
    }

    /// The takeover catch-ups this plan holds, for a whole plan built off the loop. A plan
    /// holds none but after a takeover: only then are its names copied.
    fn catch_ups(&self) -> CatchUps {
        if !self.entries.iter().any(|(_, e)| e.gained.is_some()) {
            return CatchUps::default();
        }
        CatchUps { all: self.entries.iter().filter_map(|(n, e)| Some((n.clone(), e.gained?))).collect(), walked: 0 }
    }

    /// A whole plan of `entries`, each with its next tick already set: the order is built in
    /// one go from the sorted instants (a million jobs inserted one by one into the set took
    /// about 0.4 s of the scheduler's loop, sorted and built in bulk a fraction of it).
    fn whole(entries: Vec<(String, Entry)>) -> Plan {
        let order = entries.iter().enumerate().filter_map(|(i, (_, e))| Some((e.next?.1, i))).collect();
        Plan { sorted: entries.len(), entries, order, added: HashMap::new() }
    }
}

/// An old plan's takeover catch-ups, asked for job by job in name order as a whole plan is
/// built: walked beside the jobs, not searched for each (a million searches by name cost a
/// third of a second).
#[derive(Default)]
struct CatchUps {
    all: Vec<(String, DateTime<Utc>)>,
    /// How many of them were walked past.
    walked: usize,
}

impl CatchUps {
    /// In name order, to be walked.
    fn sorted(mut self) -> Self {
        self.all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        self
    }

    /// Job `name`'s catch-up; names are asked for in order, and may skip others.
    fn of(&mut self, name: &str) -> Option<DateTime<Utc>> {
        while self.all.get(self.walked).is_some_and(|(n, _)| n.as_str() < name) {
            self.walked += 1;
        }
        let (_, at) = self.all.get(self.walked).filter(|(n, _)| n == name)?;
        self.walked += 1;
        Some(*at)
    }
}

/// `tick` (a job's next) and the instant it fires at (the tick plus its jitter).
fn fires(cfg: &JobConfig, schedule: &Schedule, tick: Option<DateTime<Utc>>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    tick.map(|tick| (tick, TickPolicy::of(cfg, schedule).fire_at(tick)))
}

/// What the scheduler is handed by the engine that composes it: narrow handles, no engine.
pub(crate) struct SchedulerEnv {
    pub(crate) ticks: Arc<dyn Ticks>,
    pub(crate) states: Arc<dyn JobStates>,
    pub(crate) handover: Arc<dyn Handover>,
    /// Where ticks no worker fired on time are told.
    pub(crate) missed: Arc<dyn crate::store::Missed>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) observer: Arc<Observer>,
    pub(crate) signals: Arc<dyn Signals>,
    pub(crate) config: Arc<InForce>,
    /// Where fired ticks' runs start.
    pub(crate) executor: Arc<Executor>,
    pub(crate) retention: Arc<PruneQueue>,
    /// This worker's name, which its claims record.
    pub(crate) worker: String,
    /// Where storage faults met while firing ticks are reported.
    pub(crate) health: Arc<crate::health::Health>,
    /// The jobs this worker plans and offers (on a shared database, its share of them).
    pub(crate) share: watch::Receiver<Share>,
    /// The longest a share can go unserved: a member's lease runs out (L after its last
    /// renewal) and the others read it (within L/4), with room to spare. A job taken over fires
    /// each tick from this long before its takeover.
    pub(crate) takeover_within: chrono::Duration,
}

/// The scheduler: its handles, and what it tells of its passes (readiness, the watchdog,
/// background work keeping out of the way of ticks). The plan itself lives in its loop.
pub(crate) struct Scheduler {
    env: SchedulerEnv,
    alive: AtomicBool,
    /// When the scheduler wakes next (ms since the epoch; `i64::MAX`: nothing planned).
    next_wake_ms: AtomicI64,
    /// The clock instant of the last completed pass.
    passes: watch::Sender<DateTime<Utc>>,
    /// The instant whose tick transaction is ready and held for it, if any.
    held: watch::Sender<Option<DateTime<Utc>>>,
    /// The last hand-over held runs back (`overlap: queue`, a backfill's) or stopped at its
    /// batch limit: only then may a run's end let one go, and wake a pass. Without it, every
    /// batch of ends woke a pass that read the due runs for nothing (220 passes a second in a
    /// drain; on PostgreSQL 7 % of the server's time, `postgres -- drain` with
    /// `pg_stat_statements`).
    holding: AtomicBool,
    /// One hand-over at a time, so that `holding` is the latest one's.
    handing_over: tokio::sync::Mutex<()>,
    /// Runs may be waiting for a limit's slot: the next hand-over looks for them. True at
    /// start (runs may have waited while the worker was down).
    limit_waiters: AtomicBool,
    /// The config may have changed the limits (at start, and at each replan): the next
    /// hand-over looks for waiters whatever limits are configured.
    limits_changed: AtomicBool,
    /// Whole-plan builds tell it once they read the states, then wait for the hold (a test
    /// holds it to see the loop fire meanwhile).
    #[cfg(test)]
    builds_read: tokio::sync::Notify,
    #[cfg(test)]
    builds_held: Arc<tokio::sync::RwLock<()>>,
}

impl Scheduler {
    pub(crate) fn new(env: SchedulerEnv) -> Arc<Self> {
        Arc::new(Self {
            env,
            alive: AtomicBool::new(false),
            next_wake_ms: AtomicI64::new(i64::MAX),
            passes: watch::Sender::new(DateTime::<Utc>::MIN_UTC),
            held: watch::Sender::new(None),
            holding: AtomicBool::new(false),
            handing_over: tokio::sync::Mutex::new(()),
            limit_waiters: AtomicBool::new(true),
            limits_changed: AtomicBool::new(true),
            #[cfg(test)]
            builds_read: tokio::sync::Notify::new(),
            #[cfg(test)]
            builds_held: Arc::default(),
        })
    }

    /// The loop is running.
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// When the loop wakes next, in ms since the epoch (`i64::MAX`: nothing planned).
    pub(crate) fn next_wake_ms(&self) -> i64 {
        self.next_wake_ms.load(Ordering::SeqCst)
    }

    /// The clock instant of each completed pass, as it happens; not of those made from the old
    /// plan while a new one is built (the config in force is not planned yet).
    pub(crate) fn passes(&self) -> watch::Receiver<DateTime<Utc>> {
        self.passes.subscribe()
    }

    /// The instant whose tick transaction is ready and held for it, as it changes.
    pub(crate) fn held(&self) -> watch::Receiver<Option<DateTime<Utc>>> {
        self.held.subscribe()
    }

    /// A pass through `now` is complete (`planned`: with the config in force planned); the loop
    /// wakes next at `next` (none: nothing planned).
    fn pass_done(&self, now: DateTime<Utc>, next: Option<DateTime<Utc>>, planned: bool) {
        self.next_wake_ms.store(next.map_or(i64::MAX, |t| t.timestamp_millis()), Ordering::SeqCst);
        if planned {
            self.passes.send_replace(now);
        }
    }
}

/// How often a scheduler looks for runs waiting for a limit's slot while some wait, besides the
/// signals that free slots (a lost cross-worker signal delays a start by this much at most).
const LIMIT_WAITERS_CHECKED_EVERY: chrono::Duration = chrono::Duration::seconds(2);

pub(crate) async fn run(s: Arc<Scheduler>, mut signals: Receiver, stop: CancellationToken) {
    let mut plan = Plan::default();
    let mut replan = true;
    // Jobs to plan again, when the whole plan is not.
    let mut changed: BTreeSet<String> = BTreeSet::new();
    // The earliest due run or end of a wait seen by the last pass (at start: anything, since
    // waits may have ended while the worker was down).
    let mut due_seen = Some(DateTime::<Utc>::MIN_UTC);
    let mut lead = Lead::default();
    let mut shares = s.env.share.clone();
    // The share the plan was built for (none before the first build), and when this worker
    // joined the group it is of (a little before its first pass).
    let mut planned_for: Option<Share> = None;
    let joined = s.env.clock.now() - chrono::Duration::seconds(1);
    // A whole plan being built off the loop, if any.
    let mut building: Option<Building> = None;
    loop {
        if !replan && !changed.is_empty() {
            let share = planned_for.clone().unwrap_or_else(Share::everything);
            replan = !plan_jobs(&s, &mut plan, &changed, &share).await;
            s.limits_changed.store(true, Ordering::SeqCst);
            if let Some(b) = &mut building {
                b.touched.extend(changed.iter().cloned());
            }
        }
        changed.clear();
        // One build at a time, each put in: a replan asked for meanwhile starts once it is (a
        // build aborted for each new ask could be outrun by them for good).
        if replan && building.is_none() {
            let share = shares.borrow_and_update().clone();
            let build = Build { share, before: planned_for.clone(), catch_ups: plan.catch_ups(), joined };
            building = Some(build.start(&s));
            replan = false;
        }
        // The first plan is waited for: there is none to fire from meanwhile.
        if let Some(mut b) = building.take_if(|b| planned_for.is_none() || b.handle.is_finished()) {
            let built = (&mut b.handle).await;
            put_in(&s, &mut plan, &mut planned_for, b, built);
            if replan {
                continue;
            }
        }
        let now = s.env.clock.now();
        // Nothing due yet, but the next instant is within its lead: its tick transaction is
        // done now and committed at the instant.
        let ahead = plan.next_instant().and_then(|(at, n)| {
            let l = lead.of(at, n)?;
            (at > now && at - now <= l).then_some(Ahead { at, lead: l, stop: &stop })
        });
        if let Some(took) = fire_due(&s, &mut plan, now, ahead.as_ref(), building.as_mut().map(|b| &mut b.touched)).await {
            lead.took(took);
        }
        let resumed = due_seen.is_some_and(|t| t <= now);
        if resumed {
            resume_waits_over(&s, now).await;
        }
        // A backlog larger than one batch: hand over the next batch at once.
        let more = s.dispatch_due(now).await;
        s.alive.store(true, Ordering::SeqCst);
        let next_instant = plan.next_instant();
        due_seen = s.env.handover.next_due().await.ok().flatten();
        // Something came due while this pass ran (a wait recorded with its end already past):
        // another pass at once; if this one tried and it is still due (the write failed), a
        // second later.
        let overdue = due_seen.is_some_and(|t| t <= now);
        let next_due = if overdue { resumed.then(|| now + chrono::Duration::seconds(1)) } else { due_seen };
        // A tick's pass begins its lead before the instant: background writes keep clear of
        // that (`Engine::clear_of_ticks`), not of the instant only.
        let tick_wake = next_instant.map(|(t, n)| lead.of(t, n).map_or(t, |l| t - l));
        // While runs wait for a limit's slot, a pass at least every few seconds: a slot freed
        // on another worker whose signal was lost is found all the same.
        let waiters_check = s.limit_waiters.load(Ordering::SeqCst).then(|| now + LIMIT_WAITERS_CHECKED_EVERY);
        let wake_at = [tick_wake, next_due, waiters_check].into_iter().flatten().min();
        // A pass from the old plan while the new one is built does not count as one through
        // `now`: the config in force is not yet planned.
        s.pass_done(now, wake_at, building.is_none());
        if more || (overdue && !resumed) {
            continue;
        }
        let sleep = match wake_at {
            Some(t) => s.env.clock.sleep_until(t),
            None => Box::pin(std::future::pending()),
        };
        tokio::select! {
            () = sleep => {}
            // Another worker joined or left: the plan is of the new share.
            Ok(()) = shares.changed() => replan = true,
            built = finished(&mut building) => {
                if let Some(b) = building.take() {
                    put_in(&s, &mut plan, &mut planned_for, b, built);
                }
            }
            woken = next_for_scheduler(&mut signals, &s.holding) => match woken {
                Some(r) => {
                    r.into(&mut replan, &mut changed);
                    // A wake or a run's end may have freed (or added) a slot anywhere.
                    s.look_for_waiters();
                }
                None => break,
            },
            () = stop.cancelled() => break,
        }
        // Every signal so far is covered by the next pass.
        for x in signals.drain() {
            if let Some(r) = for_scheduler(&x, s.holding.load(Ordering::SeqCst)) {
                r.into(&mut replan, &mut changed);
            }
        }
    }
    if let Some(b) = building {
        b.handle.abort();
    }
    s.alive.store(false, Ordering::SeqCst);
}

/// The plan being built, once it is (never, when none is).
async fn finished(building: &mut Option<Building>) -> Result<Plan, tokio::task::JoinError> {
    match building {
        Some(b) => (&mut b.handle).await,
        None => std::future::pending().await,
    }
}

/// Puts a plan built off the loop in force, with the jobs the loop fired or planned again
/// meanwhile as the old plan has them now (their last tick recorded, a change applied); the old
/// plan is freed off the loop.
fn put_in(s: &Scheduler, plan: &mut Plan, planned_for: &mut Option<Share>, b: Building, built: Result<Plan, tokio::task::JoinError>) {
    let Building { share, touched, .. } = b;
    let mut built = match built {
        Ok(built) => built,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the scheduler's plan; the plan in force stays until the next change");
            *planned_for = Some(share);
            return;
        }
    };
    for name in &touched {
        built.adopt(name, plan, &share);
    }
    // The old plan (a million jobs' names) is freed off the loop that fires ticks.
    let old = std::mem::replace(plan, built);
    tokio::task::spawn_blocking(move || drop(old));
    s.env.observer.set_schedule_share(plan.entries.len(), share.members().len().max(1));
    s.limits_changed.store(true, Ordering::SeqCst);
    *planned_for = Some(share);
}

/// Why a signal wakes the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Woken {
    /// Its plan must be rebuilt first.
    Replan,
    /// These jobs must be planned again first.
    Jobs(Vec<String>),
    /// A pass may hand something over.
    Pass,
}

impl Woken {
    /// Adds what this asks of the next pass to what it asks already.
    fn into(self, replan: &mut bool, changed: &mut BTreeSet<String>) {
        match self {
            Woken::Replan => *replan = true,
            Woken::Jobs(jobs) => changed.extend(jobs),
            Woken::Pass => {}
        }
    }
}

/// Whether a signal concerns the scheduler: a job changed (its plan is rebuilt), a wake, or a
/// run's end while the last hand-over held runs back (the end may let one go). Runs it started
/// itself, queue pushes and stops are not its business.
fn for_scheduler(s: &Signal, holding: bool) -> Option<Woken> {
    match s {
        Signal::JobChanged | Signal::Lagged => Some(Woken::Replan),
        Signal::JobsChanged(jobs) => Some(Woken::Jobs(jobs.clone())),
        Signal::Wake => Some(Woken::Pass),
        Signal::RunFinished(_) => holding.then_some(Woken::Pass),
        // A changed runtime job is read again first; `JobsChanged` follows.
        Signal::TasksPushed
        | Signal::RunsChanged
        | Signal::RunProgress(_)
        | Signal::CancelRequested { .. }
        | Signal::DefinitionChanged(_)
        // The share is read by the lease keeper, which tells the scheduler when it changed.
        | Signal::WorkersChanged => None,
    }
}

/// The next signal that concerns the scheduler (see [`for_scheduler`]); `None` once the
/// signals are gone.
async fn next_for_scheduler(signals: &mut Receiver, holding: &AtomicBool) -> Option<Woken> {
    loop {
        let signal = signals.recv().await?;
        if let Some(woken) = for_scheduler(&signal, holding.load(Ordering::SeqCst)) {
            return Some(woken);
        }
    }
}

/// Whether the config in force schedules `job` (its pause state aside, which the tick's own
/// transaction reads): enabled, and not disabled for want of something it needs.
pub(crate) fn schedulable(config: &JobsConfig, job: &str, cfg: &JobConfig) -> bool {
    cfg.enabled && !config.unavailable.contains_key(job)
}

/// A whole plan being built off the loop, which fires from the plan it has meanwhile (a million
/// jobs take a third of a second of CPU to plan).
struct Building {
    handle: tokio::task::JoinHandle<Plan>,
    /// The share it plans.
    share: Share,
    /// The jobs the loop fired or planned again meanwhile: the new plan takes them as the old
    /// one has them once it is in.
    touched: BTreeSet<String>,
}

/// What a whole plan is built from, besides the config in force and the stored states: the
/// plan of the jobs in `share`. Taken over from another worker: those not in `before` (the
/// share of the last plan), those the last plan took over and has not fired since
/// (`catch_ups`), and at a start beside other workers (no `before`) every job, from a
/// takeover's span before `joined`.
struct Build {
    share: Share,
    before: Option<Share>,
    catch_ups: CatchUps,
    joined: DateTime<Utc>,
}

impl Build {
    /// Reads the stored states, then plans every job on the blocking pool: the loop is free to
    /// fire ticks meanwhile.
    fn start(self, s: &Arc<Scheduler>) -> Building {
        let share = self.share.clone();
        let s = s.clone();
        let handle = tokio::spawn(async move {
            let snapshot = s.env.config.get();
            let states = match s.env.states.job_states().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read job state; scheduling from now");
                    HashMap::new()
                }
            };
            let (now, within) = (s.env.clock.now(), s.env.takeover_within);
            #[cfg(test)]
            s.builds_read.notify_one();
            #[cfg(test)]
            let held = s.builds_held.clone();
            #[cfg(test)]
            let _held = held.read().await;
            // A panic in the planning is the build's (the loop logs it); none when shutting down.
            crate::off_the_runtime(move || self.plan(&snapshot, &states, now, within)).await.unwrap_or_default()
        });
        Building { handle, share, touched: BTreeSet::new() }
    }

    fn plan(self, snapshot: &JobsConfig, states: &HashMap<String, JobState>, now: DateTime<Utc>, within: chrono::Duration) -> Plan {
        let Build { share, before, catch_ups, joined } = self;
        let mut catch_ups = catch_ups.sorted();
        let mut entries = Vec::new();
        for (name, cfg) in snapshot.jobs.iter() {
            let paused = states.get(name).is_some_and(|s| s.paused);
            if paused || !schedulable(snapshot, name, cfg) {
                continue;
            }
            let Some(schedule) = cfg.schedule.clone() else { continue };
            if !share.owns(name) {
                continue;
            }
            let gained = match &before {
                Some(b) if !b.owns(name) => Some(now - within),
                Some(_) => catch_ups.of(name),
                // A start beside other workers: they offered the job until they read the join,
                // or left it to this worker's name (a restart within the lease of a process
                // that died).
                None if share.members().len() > 1 => Some(joined - within),
                None => None,
            };
            let last = states.get(name).and_then(|s| s.last_tick);
            let next = fires(cfg, &schedule, schedule.next_after(last.unwrap_or(now).min(now)));
            entries.push((name.clone(), Entry { schedule, last, next, gained }));
        }
        Plan::whole(entries)
    }
}

/// Plans the jobs named again, each as the config in force and its stored state have it now
/// (gone, paused or unscheduled: not planned). `false`: a state could not be read (the whole
/// plan is built again).
async fn plan_jobs(s: &Scheduler, plan: &mut Plan, names: &BTreeSet<String>, share: &Share) -> bool {
    let snapshot = s.env.config.get();
    let now = s.env.clock.now();
    for name in names.iter().filter(|n| share.owns(n)) {
        let state = match s.env.states.job_state(name).await {
            Ok(state) => state,
            Err(e) => {
                tracing::error!(job = %name, error = %e, "cannot read the job's state; planning every job again");
                return false;
            }
        };
        let cfg = snapshot.jobs.get(name).filter(|cfg| !state.paused && schedulable(&snapshot, name, cfg));
        let Some((cfg, schedule)) = cfg.and_then(|cfg| Some((cfg, cfg.schedule.clone()?))) else {
            plan.drop_job(name);
            continue;
        };
        // A takeover not yet fired keeps its catch-up.
        let gained = plan.find(name).and_then(|i| plan.entries.get(i)).and_then(|(_, e)| e.gained);
        let i = plan.put(name, Entry { schedule, last: state.last_tick, next: None, gained });
        plan.set_next(i, cfg, state.last_tick.unwrap_or(now).min(now));
    }
    true
}

/// Most jobs whose due ticks one transaction records: a burst larger than this is fired in
/// several transactions, one after the other, which bounds what one transaction holds (the
/// single writer, the memory of its statements). Not smaller: measured on a thousand jobs due
/// at once on two cores (`cargo bench … runcore -- burst`, BENCHMARKS.md), four transactions of
/// 250 started the first runs at 6 ms instead of 15, but the last ones 20 ms later than one
/// transaction of a thousand did: the runs started early take the cores the next
/// transactions need.
const TICKS_PER_TRANSACTION: usize = 2000;

/// A tick transaction done ahead of its instant, committed at it.
struct Ahead<'a> {
    at: DateTime<Utc>,
    lead: chrono::TimeDelta,
    stop: &'a CancellationToken,
}

/// How long before an instant the scheduler begins the tick transaction of the jobs due at it:
/// twice what the last one of about as many ticks took to be ready to commit, so that at the
/// instant only the commit is left. Measured by the burst's size (1, 10, 100, … ticks), since
/// a few ticks cost mostly the wake-up and a thousand mostly their rows.
#[derive(Default)]
struct Lead {
    /// By decade of the batch's size: (ticks, µs from the pass's start to ready to commit).
    seen: [Option<(usize, u64)>; 7],
    /// No lead for instants up to this one: a held transaction was let go before it (the
    /// clock stood still or stepped back), so it is fired when it is due.
    off_until: Option<DateTime<Utc>>,
}

/// The lead's bounds. Within it the single writer is held for the tick, idle once the
/// statements are done: the upper bound is what other writes wait for a tick. A clock that
/// stands still or steps back holds them for the lead and [`HOLD_SLACK`] once.
const LEAD_MIN: chrono::TimeDelta = chrono::TimeDelta::milliseconds(2);
const LEAD_MAX: chrono::TimeDelta = chrono::TimeDelta::milliseconds(200);
/// A held transaction is let go (rolled back, fired again when due) when the instant has not
/// come this long after its lead (measured on the monotonic clock): the clock stepped back.
const HOLD_SLACK: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a tick's pass lets the runs it launched start before it goes on with its own
/// work: at most this, and only as long as some have not started.
const LAUNCH_FIRST: std::time::Duration = std::time::Duration::from_millis(100);

impl Lead {
    fn decade(n: usize) -> usize {
        (n.max(1).ilog10() as usize).min(6)
    }

    /// The lead for `n` ticks due at `at`; `None`: none (fired when due). Only the first
    /// transaction of a burst is held, so a burst counts up to [`TICKS_PER_TRANSACTION`].
    fn of(&self, at: DateTime<Utc>, n: usize) -> Option<chrono::TimeDelta> {
        if self.off_until.is_some_and(|t| at <= t) {
            return None;
        }
        let n = n.min(TICKS_PER_TRANSACTION);
        // Before any measure, what a process's first burst took on a slow hour of a 2-core
        // VM (everything cold: a thousand ticks were ready in 73 ms): 10 ms and 100 µs a
        // tick, so that only a burst of more than a thousand waits for its commit.
        let us = match self.seen[Self::decade(n)] {
            Some((m, took)) => took.saturating_mul(n as u64) / m.max(1) as u64,
            None => 10_000 + 100 * n as u64,
        };
        Some(chrono::TimeDelta::microseconds(2 * us.min(i64::MAX as u64 / 4) as i64).clamp(LEAD_MIN, LEAD_MAX))
    }

    fn took(&mut self, took: Took) {
        match took {
            Took::Ready { ticks, us } => self.seen[Self::decade(ticks)] = Some((ticks, us)),
            Took::LetGo(at) => self.off_until = Some(at),
        }
    }
}

/// Tells each job's ticks no worker fired on time, once (`Missed::tell_missed`), before the
/// batch that fires what catch-up keeps of them: a pass repeated after a crash, or another
/// worker's, sees the same first tick and records nothing new. A failure to record is logged
/// and the ticks fire all the same.
async fn tell_missed(
    s: &Scheduler,
    config: &crate::in_force::JobsConfig,
    missed: &[(String, crate::schedule::MissedTicks)],
    now: DateTime<Utc>,
) {
    let with_notifications: Vec<_> = missed
        .iter()
        .map(|(job, m)| {
            let rules = config.notify_rules(job).unwrap_or_default();
            let policy = config.jobs.get(job.as_str()).map(|j| j.catch_up);
            (job.clone(), *m, crate::notify::missed_notifications(job, m, policy, &rules))
        })
        .collect();
    match s.env.missed.tell_missed(&with_notifications, now).await {
        Ok(told) => {
            for (job, m) in told {
                tracing::warn!(
                    job = %job, first = %m.first, last = %m.last, count = m.count, caught_up = m.caught_up, skipped = m.skipped,
                    outside_window = m.outside_window, "ticks missed: no worker fired them on time"
                );
                s.env.observer.ticks_missed(&job, m.count);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot record missed ticks; their catch-up goes on"),
    }
}

/// What a pass that fired ticks tells the lead.
enum Took {
    /// `ticks` were ready to commit `us` after the pass began.
    Ready { ticks: usize, us: u64 },
    /// The transaction held for `at` was let go.
    LetGo(DateTime<Utc>),
}

/// Fires the ticks due at `now`, or with `ahead`, those due at its instant (nothing is due
/// now then): their transaction is done at once and committed at the instant. The jobs fired
/// are added to `touched`, when given.
async fn fire_due(
    s: &Scheduler,
    plan: &mut Plan,
    now: DateTime<Utc>,
    ahead: Option<&Ahead<'_>>,
    mut touched: Option<&mut BTreeSet<String>>,
) -> Option<Took> {
    let (began, woke) = (std::time::Instant::now(), s.env.clock.now());
    let config = s.env.config.get();
    let jobs = &config.jobs;
    let now = ahead.map_or(now, |a| a.at);
    let mut due: Vec<usize> = Vec::new();
    while let Some(&(at, i)) = plan.order.first() {
        if at > now {
            break;
        }
        plan.order.remove(&(at, i));
        due.push(i);
    }
    let _firing = (!due.is_empty()).then(|| s.env.executor.firing());
    let mut took = None;
    for (c, chunk) in due.chunks(TICKS_PER_TRANSACTION).enumerate() {
        // Only the first transaction is done ahead; the instant has come when the next begin.
        let ahead = ahead.filter(|_| c == 0);
        // Every tick due now of these jobs goes to the database in one transaction.
        let mut batch: Vec<(NewRun, Overlap)> = Vec::new();
        // Jobs whose last processed tick was skipped (catch-up), so no run records it.
        let mut skipped_last: Vec<(String, DateTime<Utc>)> = Vec::new();
        // Ticks no worker fired on time, by job, told before the batch fires what is kept.
        let mut missed: Vec<(String, crate::schedule::MissedTicks)> = Vec::new();
        // Each fired job's last and next tick, planned once the runs are handed over (off the
        // hot path). The plan is not touched before: a transaction let go leaves it as it was.
        let mut planned: Vec<Planned<'_>> = Vec::new();
        for &i in chunk {
            let Some((job, entry)) = plan.entries.get_mut(i) else {
                continue;
            };
            // A job gone from the config, no longer scheduled by it, or on another schedule now
            // (a plan not yet rebuilt after a change, or being rebuilt) is not fired nor
            // planned again: the new plan fires it.
            let in_force = |cfg: &&JobConfig| {
                schedulable(&config, job, cfg)
                    && cfg.schedule.as_ref().is_some_and(|now| Arc::ptr_eq(now, &entry.schedule) || **now == *entry.schedule)
            };
            let Some(cfg) = jobs.get(job.as_str()).filter(in_force) else {
                entry.next = None;
                continue;
            };
            // A takeover whose catch-up could not be fired for long (writes failing, the
            // process stopped): what is older than a takeover and the minute is the job's
            // `catch_up`'s, as after downtime.
            let each_since = entry.gained.map(|g| g.max(now - s.env.takeover_within - crate::schedule::ON_TIME));
            let policy = TickPolicy { each_since, ..TickPolicy::of(cfg, &entry.schedule) };
            let due = due_ticks(&policy, entry.next.map(|(t, _)| t), entry.last, now);
            if due.missed > 0 {
                let caught_up = due.fire.iter().filter(|(_, _, tr)| *tr == Trigger::CatchUp).count();
                tracing::info!(job = %job, missed = due.missed, caught_up, policy = ?cfg.catch_up, "missed ticks");
            }
            if let Some(l) = due.skipped_last {
                skipped_last.push((job.clone(), l));
            }
            if let Some(m) = due.missed_ticks {
                missed.push((job.clone(), m));
            }
            for (t, at, trigger) in due.fire {
                batch.push((new_tick_run(&config, cfg, t, at, trigger), due.overlap));
            }
            planned.push(Planned { i, cfg, last: due.last, next: due.next });
        }
        if !missed.is_empty() {
            tell_missed(s, &config, &missed, now).await;
        }
        let mut fired = Fired::Committed { committed: std::time::Instant::now(), ready: None, timings: None };
        if !batch.is_empty() {
            // The stages of the pass, in µs after the earliest tick's instant (the bench reads
            // them; a pass ahead of its instant begins before it).
            let tick = batch.iter().map(|(r, _)| r.scheduled_at.unwrap_or(r.due_at)).min().unwrap_or(now);
            let after_tick = |d: std::time::Duration| (woke - tick).num_microseconds().unwrap_or(0) + d.as_micros() as i64;
            let planned_us = after_tick(began.elapsed());
            let n = batch.len();
            fired = fire_batch(s, batch, now, ahead).await;
            let (committed, ready, transaction) = match &fired {
                Fired::Committed { committed, ready, timings } => (Some(*committed), *ready, *timings),
                Fired::LetGo | Fired::Failed => (None, None, None),
            };
            if let Some(ready) = ready {
                took = Some(Took::Ready { ticks: n, us: (ready - began).as_micros() as u64 });
            }
            s.env.observer.emit(InternalEvent::TickBurst {
                ticks: n,
                tick_ms: tick.timestamp_millis(),
                woke_us: after_tick(std::time::Duration::ZERO),
                planned_us,
                ready_us: ready.map(|d| after_tick(d - began)),
                committed_us: committed.map(|d| after_tick(d - began)),
                launched_us: after_tick(began.elapsed()),
                transaction,
            });
        }
        match fired {
            Fired::Committed { .. } => {}
            Fired::LetGo => {
                // Nothing was recorded, and the plan is as it was: every job due is due again
                // at its instant, and fired then without a lead.
                for &i in &due {
                    if let Some((_, Entry { next: Some((_, at)), .. })) = plan.entries.get(i) {
                        plan.order.insert((*at, i));
                    }
                }
                return ahead.map(|a| Took::LetGo(a.at));
            }
            // The database refused: the plan is rebuilt from the stored last ticks (the failed
            // batch asked for it), which covers the jobs not reached either.
            Fired::Failed => return took,
        }
        for p in planned {
            if let Some((job, e)) = plan.entries.get_mut(p.i) {
                if let Some(t) = touched.as_deref_mut() {
                    t.insert(job.clone());
                }
                e.last = p.last;
                // Its catch-up of the takeover is recorded.
                e.gained = None;
            }
            plan.set_next_tick(p.i, p.cfg, p.next);
        }
        // Only once the chunk's ticks are recorded: a failed chunk is planned again from the
        // stored last ticks, and its caught-up tick must still be due then.
        for (job, tick) in skipped_last {
            if let Err(e) = s.env.states.set_last_tick(&job, tick).await {
                tracing::error!(job = %job, error = %e, "cannot save the last tick");
            }
        }
    }
    took
}

/// A fired job's last processed tick and its next one, for its plan entry (`i`).
struct Planned<'a> {
    i: usize,
    cfg: &'a JobConfig,
    last: Option<DateTime<Utc>>,
    next: Option<DateTime<Utc>>,
}

fn new_tick_run(jobs: &JobsConfig, cfg: &JobConfig, tick: DateTime<Utc>, due: DateTime<Utc>, trigger: Trigger) -> NewRun {
    NewRun {
        owner: Owner::Job(cfg.name.clone()),
        trigger,
        status: RunStatus::Queued,
        scheduled_at: Some(tick),
        due_at: due,
        attempt: 1,
        input: cfg.input.as_deref().cloned(),
        parameters: cfg.parameters.as_ref().map(JsonText::value),
        error: None,
        idempotency_key: None,
        retry_of: None,
        root_id: None,
        snapshot: Some(jobs.snapshot_of(cfg)),
        requested_by: None,
        in_line: cfg.overlap != Overlap::Queue,
    }
}

/// How a batch's tick transaction ended.
enum Fired {
    /// Committed at `committed`; `ready`: when a held transaction was ready to commit;
    /// `timings`: where the transaction's time went.
    Committed {
        committed: std::time::Instant,
        ready: Option<std::time::Instant>,
        timings: Option<TxTimings>,
    },
    /// Held, and let go before its instant: nothing recorded.
    LetGo,
    Failed,
}

/// Fires a batch of ticks in one transaction and starts the runs it claimed. With `ahead`,
/// the transaction is done now and committed at its instant: until then the single writer
/// waits on it, and what it read (pause state, the jobs' active runs) is what decides the
/// ticks. Let go if the worker stops first, or if the instant has not come [`HOLD_SLACK`]
/// after the lead (the clock stepped back).
async fn fire_batch(s: &Scheduler, batch: Vec<(NewRun, Overlap)>, now: DateTime<Utc>, ahead: Option<&Ahead<'_>>) -> Fired {
    let keys: Vec<(String, DateTime<Utc>)> = batch.iter().map(|(r, _)| (r.owner.to_string(), r.scheduled_at.unwrap_or(r.due_at))).collect();
    // Runs that wait in their limits' lines from the insert: the next hand-over looks there.
    let lined = batch.iter().any(|(r, _)| r.in_line && r.snapshot.as_ref().is_some_and(|s| !s.limits.is_empty()));
    // Free slots now: that many of the runs are claimed in the tick's own transaction and
    // start right after its commit.
    let tickets = s.env.executor.tickets(batch.len());
    let claim = Claim { worker: &s.env.worker, slots: tickets.len() };
    // Held to its instant: the claimed runs' tasks are made now, so that the commit is followed
    // only by handing each its run.
    let tasks = if ahead.is_some() { s.env.executor.ready(tickets.len()) } else { Default::default() };
    let ready = std::sync::OnceLock::new();
    let hold = ahead.map(|a| {
        let (ready, at, stop, held) = (&ready, a.at, a.stop, &s.held);
        let instant = s.env.clock.sleep_until(at);
        let slack = a.lead.to_std().unwrap_or_default() + HOLD_SLACK;
        Box::pin(async move {
            let _ = ready.set(std::time::Instant::now());
            held.send_replace(Some(at));
            // The instant first: a worker stopping once it has come commits what it holds.
            let commit = tokio::select! {
                biased;
                () = instant => true,
                () = tokio::time::sleep(slack) => {
                    tracing::warn!(%at, "the clock did not reach a held tick's instant in time; its ticks are fired when due");
                    false
                }
                () = stop.cancelled() => false,
            };
            held.send_replace(None);
            commit
        }) as crate::store::Hold<'_>
    });
    let outcomes = s.env.ticks.fire_ticks_held(batch, claim, now, hold).await;
    let committed = std::time::Instant::now();
    let (outcomes, timings) = match outcomes {
        Ok(Some(o)) => {
            s.env.health.storage_ok();
            o
        }
        Ok(None) => return Fired::LetGo,
        Err(e) => {
            s.env.health.storage_failed(&e);
            // Nothing was recorded: rebuild the plan from the stored last ticks, so these
            // ticks are fired again (or caught up) once the database answers.
            tracing::error!(ticks = keys.len(), error = %e, "cannot fire ticks; retrying in 1 s");
            drop((tickets, tasks));
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            s.env.signals.publish(Signal::JobChanged);
            return Fired::Failed;
        }
    };
    if lined {
        s.look_for_waiters();
    }
    let mut handed = Vec::new();
    let mut later = Vec::new();
    let mut pushed = false;
    for ((job, tick), outcome) in keys.into_iter().zip(outcomes) {
        let Some(o) = outcome else {
            tracing::debug!(job = %job, %tick, "tick already fired");
            continue;
        };
        handed.extend(o.handed);
        pushed |= o.pushed;
        later.push((job, tick, o.run_id, o.status, o.replaced));
    }
    // Started before anything else is looked at.
    let launched = !handed.is_empty();
    let starting = s.env.executor.launch_ready(tasks, handed, tickets);
    // What is left here (the ticks' metrics, then planning the jobs' next ticks) waits until
    // the runs have started: on a worker of few cores it would otherwise take a core from them.
    if launched {
        let _ = tokio::time::timeout(LAUNCH_FIRST, starting.all_started()).await;
    } else {
        // Queued or skipped runs were created all the same.
        s.env.signals.publish(Signal::RunsChanged);
    }
    if pushed {
        s.env.signals.publish(Signal::TasksPushed);
    }
    for (job, tick, run_id, status, replaced) in later {
        if status != RunStatus::Skipped {
            s.env.observer.tick_fired(&job, tick, &run_id);
        } else {
            s.env.observer.tick_skipped(&job, tick, &run_id);
            // A skipped tick is a finished run too: a paused job's history is kept bounded.
            s.env.retention.prune_soon(&job, now, 1);
        }
        for old in replaced {
            s.env.executor.stop_run(&old, format!("replaced by run {run_id} (overlap: replace)"), now).await;
        }
    }
    Fired::Committed { committed, ready: ready.get().copied(), timings: Some(timings) }
}

/// Runs waiting for an approval whose timeout passed are queued again; the workflow applies the
/// step's `on_timeout` when it resumes.
async fn resume_waits_over(s: &Scheduler, now: DateTime<Utc>) {
    match s.env.handover.wake_waiting(now).await {
        Ok(ids) => {
            for id in &ids {
                tracing::info!(run = %id, "approval wait is over; the run resumes to apply on_timeout");
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot resume runs whose approval wait is over"),
    }
}

impl Scheduler {
    /// Hands due queued runs over (claimed into free slots, the rest through the queue), holding
    /// back runs of `overlap: queue` jobs while an earlier run of the same job is going. Returns
    /// true when it stopped at its batch limit and more may be due (or wait for a limit a
    /// reload removed).
    ///
    /// Tells whether it holds runs back ([`Scheduler::holding`]). When it starts to, it wakes
    /// a pass: a run that ended between its read and then was not waited for.
    pub(crate) async fn dispatch_due(&self, now: DateTime<Utc>) -> bool {
        let _one = self.handing_over.lock().await;
        let due = match self.env.handover.due_undispatched(now).await {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "cannot read due runs");
                // Unknown: a run's end may let one go.
                self.holding.store(true, Ordering::SeqCst);
                return false;
            }
        };
        let more = due.len() >= DUE_BATCH;
        let config = self.env.config.get();
        let mut one_at_a_time: Vec<String> = Vec::new();
        let mut held_back = false;
        let mut ready: Vec<String> = Vec::with_capacity(due.len());
        let mut limited: Vec<Due> = Vec::new();
        for d in due {
            // A backfill's runs go one at a time, in tick order, whatever the job's overlap.
            let queue_policy = d.trigger == Trigger::Backfill || config.jobs.get(&d.job).is_some_and(|j| j.overlap == Overlap::Queue);
            if queue_policy {
                if one_at_a_time.contains(&d.job) || self.env.handover.has_dispatched_active(&d.job).await.unwrap_or(false) {
                    one_at_a_time.push(d.job);
                    held_back = true;
                    continue;
                }
                one_at_a_time.push(d.job.clone());
            }
            if d.pools.is_empty() { ready.push(d.id) } else { limited.push(d) }
        }
        // Runs that wait for a slot are looked for on every pass that may free one: while some
        // wait, and after anything that wakes a pass; with no limit configured, only after a
        // change of the config (a reload that removed the limits frees their waiters).
        let waiters = (self.limit_waiters.swap(false, Ordering::SeqCst) && !config.limits.is_empty())
            | self.limits_changed.swap(false, Ordering::SeqCst);
        let mut tickets = Vec::new();
        let mut queued = Vec::new();
        if !ready.is_empty() || !limited.is_empty() || waiters {
            // Looking at the lines, as many free slots as there are: the runs admitted from
            // them are claimed into these (a burst's runs wait in line from their insert).
            let waiting_room = if waiters { usize::MAX } else { 0 };
            tickets = self.env.executor.tickets((ready.len() + limited.len()).saturating_add(waiting_room));
            queued = ready.split_off(tickets.len().min(ready.len()));
        }
        let mut waiting = 0;
        let mut more_waiters = false;
        if !ready.is_empty() || !queued.is_empty() || !limited.is_empty() || waiters {
            let pass = LimitPass { due: &limited, sizes: &config.limits, waiters, freed: &[], spare: tickets.len() - ready.len() };
            match self.env.handover.hand_over(&ready, &queued, pass, &self.env.worker, now).await {
                Ok(done) => {
                    waiting = done.waiting;
                    if done.unserved {
                        self.limits_changed.store(true, Ordering::SeqCst);
                        more_waiters = true;
                    }
                    for (limit, waited) in &done.waited {
                        self.env.observer.limit_waited(limit, *waited);
                    }
                    self.env.executor.launch(done.claimed, tickets);
                    if done.pushed > 0 {
                        self.env.signals.publish(Signal::TasksPushed);
                    }
                }
                Err(e) => {
                    tracing::error!(runs = ready.len() + queued.len() + limited.len(), error = %e, "cannot hand runs over");
                    // Look again next pass.
                    waiting = usize::from(!limited.is_empty() || waiters);
                }
            }
        }
        // Runs still wait: the ends that free their slots admit them (the recorder's, on the
        // worker that ran the holder), a takeover wakes a pass, and a pass every few seconds
        // looks all the same.
        if waiting > 0 {
            self.limit_waiters.store(true, Ordering::SeqCst);
        }
        let holding = held_back || more;
        let was_holding = self.holding.swap(holding, Ordering::SeqCst);
        if holding && !was_holding {
            self.env.signals.publish(Signal::Wake);
        }
        more || more_waiters
    }

    /// Runs may wait for a slot: the next pass looks (a signal from another worker, a
    /// takeover that freed slots).
    pub(crate) fn look_for_waiters(&self) {
        self.limit_waiters.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: i64) -> chrono::TimeDelta {
        chrono::TimeDelta::milliseconds(n)
    }

    /// The jobs' config with `jobs` (name, schedule) saving a file each, loaded from `dir`.
    fn per_second_config(dir: &std::path::Path, jobs: &[(&str, &str)]) -> lamplighter_config::Config {
        let jobs: String = jobs
            .iter()
            .map(|(name, cron)| format!("    {name}:\n      cron: \"{cron}\"\n      type: plugin\n      plugin: file-save\n      action: save\n      parameters: {{path: {name}.txt, content: x}}\n"))
            .collect();
        let path = dir.join("lamplighter.yaml");
        std::fs::write(&path, format!("framework:\n  data_dir: {}\nscheduling:\n  jobs:\n{jobs}", dir.join("data").display()))
            .expect("write config");
        let opts = lamplighter_config::LoadOptions { path: Some(path), cwd: Some(dir.to_path_buf()), ..Default::default() };
        lamplighter_config::load(&opts).map(|l| l.config).unwrap_or_else(|e| panic!("test config invalid: {e}"))
    }

    /// Each run's job and tick, in that order.
    async fn ticks_run(engine: &crate::Engine) -> Vec<(String, DateTime<Utc>)> {
        let filter = crate::RunFilter { limit: Some(100), ..Default::default() };
        let mut runs: Vec<_> = engine
            .service()
            .list_runs(filter)
            .await
            .expect("list runs")
            .runs
            .into_iter()
            .map(|r| (r.job, r.scheduled_at.expect("a tick's run")))
            .collect();
        runs.sort();
        runs
    }

    /// A reload's plan is built off the loop: ticks due meanwhile fire from the plan in force,
    /// except a job whose schedule the reload changed; no pass counts as through the clock's
    /// time until the new plan is in; then the jobs fired meanwhile go on from their last tick
    /// (not offered twice) and a job the reload added fires its first tick since the reload,
    /// late if the plan was.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_loop_fires_from_the_old_plan_while_a_reloads_plan_is_built() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t0 = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).expect("instant");
        let clock = Arc::new(crate::ManualClock::new(t0));
        let registry = Arc::new(lamplighter_plugins::Registry::builtin());
        let observer = Observer::none();
        let mut events = observer.internal_events();
        let opts = crate::EngineOptions {
            worker_name: "test".into(),
            clock: clock.clone(),
            targets: Arc::new(crate::BuiltinTargets::new(registry.clone())),
            observer,
            registry,
        };
        let every_second = "* * * * * *";
        let first = per_second_config(dir.path(), &[("changed", every_second), ("kept", every_second)]);
        let engine = crate::Engine::start(&first, opts).await.expect("engine starts");
        let within = std::time::Duration::from_secs(10);
        tokio::time::timeout(within, engine.scheduled_through_now()).await.expect("the first pass");
        let passes = engine.scheduler().passes();
        // The first plan's build told it read the states (and was waited for).
        engine.scheduler().builds_read.notified().await;

        let held = engine.scheduler().builds_held.clone().write_owned().await;
        let hourly = "0 0 * * * *";
        engine
            .reload(&per_second_config(dir.path(), &[("added", every_second), ("changed", hourly), ("kept", every_second)]))
            .expect("reload");
        // The new plan's build read the states at t0, before `kept` fires at t1.
        tokio::time::timeout(within, engine.scheduler().builds_read.notified()).await.expect("the reload's build to read the states");
        let t1 = t0 + chrono::Duration::seconds(1);
        clock.set(t1);
        let mut changes = engine.service().watch(crate::Interest::Anything);
        let fired = loop {
            let runs = ticks_run(&engine).await;
            if !runs.is_empty() {
                break runs;
            }
            tokio::time::timeout(within, changes.changed()).await.expect("a tick fired while the new plan is built");
        };
        // `changed` was due in the same pass, from the old plan: left to the new one.
        assert_eq!(fired, [("kept".to_owned(), t1)], "only the job the reload left as it was fires from the old plan");
        assert!(*passes.borrow() < t1, "a pass counted as through {t1} before the reload's plan was in");

        drop(held);
        tokio::time::timeout(within, engine.scheduled_through_now()).await.expect("a pass once the plan is built");
        // The added job's first tick after the reload (t0) is t1: fired late, once its plan is in.
        let (added, kept) = (|t| ("added".to_owned(), t), |t| ("kept".to_owned(), t));
        assert_eq!(ticks_run(&engine).await, [added(t1), kept(t1)], "the new plan fires the added job's first tick, and not kept's again");
        let t2 = t1 + chrono::Duration::seconds(1);
        clock.set(t2);
        tokio::time::timeout(within, engine.scheduled_through_now()).await.expect("a pass through the next second");
        assert_eq!(
            ticks_run(&engine).await,
            [added(t1), added(t2), kept(t1), kept(t2)],
            "the new plan: each job on from its last tick, the changed one hourly"
        );
        // The new plan read the states before `kept` fired at t1: it takes `kept` as the old
        // plan has it, rather than offering its tick again (which the tick's key would refuse).
        let mut offered = Vec::new();
        while let Ok(e) = events.try_recv() {
            if let InternalEvent::TickBurst { ticks, tick_ms, .. } = e {
                offered.push((tick_ms, ticks));
            }
        }
        let (t1, t2) = (t1.timestamp_millis(), t2.timestamp_millis());
        assert_eq!(offered, [(t1, 1), (t1, 1), (t2, 2)], "kept's at t1 from the old plan, added's at t1 from the new one, both at t2");
        engine.shutdown(within).await;
    }

    /// A run's end wakes a pass only while the last hand-over held runs back: otherwise
    /// there is nothing it could let go.
    #[test]
    fn a_runs_end_wakes_a_pass_only_while_runs_are_held_back() {
        let end = Signal::RunFinished("r".into());
        assert_eq!(for_scheduler(&end, true), Some(Woken::Pass));
        assert_eq!(for_scheduler(&end, false), None);
        for holding in [true, false] {
            assert_eq!(for_scheduler(&Signal::Wake, holding), Some(Woken::Pass));
            assert_eq!(for_scheduler(&Signal::JobChanged, holding), Some(Woken::Replan));
            assert_eq!(for_scheduler(&Signal::Lagged, holding), Some(Woken::Replan));
            assert_eq!(for_scheduler(&Signal::TasksPushed, holding), None);
        }
    }

    /// A plan built whole orders its jobs as planning each in turn does: every job with a next
    /// tick, by instant, then place; none without one (an `at` already past).
    #[test]
    fn a_whole_plan_orders_its_jobs_as_planning_each_in_turn_does() {
        use lamplighter_config::{ScheduleSpec, parse_alone};
        let from = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).expect("instant");
        let specs = [
            ScheduleSpec::Cron("0 * * * *".into()),
            ScheduleSpec::Cron("*/7 * * * *".into()),
            ScheduleSpec::Every("90s".into()),
            ScheduleSpec::At("2020-01-01T00:00:00Z".into()),
            ScheduleSpec::Cron("0 * * * *".into()),
        ];
        let entries: Vec<(String, Entry)> = (0..40)
            .map(|i| {
                let schedule = Arc::new(parse_alone(specs[i % specs.len()].clone(), "Asia/Tokyo").expect("a schedule"));
                let next = schedule.next_after(from).map(|tick| (tick, tick));
                (format!("job-{i:02}"), Entry { schedule, last: None, next, gained: None })
            })
            .collect();
        let mut in_turn = Plan::default();
        for (i, (name, e)) in entries.iter().enumerate() {
            in_turn.entries.push((name.clone(), Entry { schedule: e.schedule.clone(), last: None, next: e.next, gained: None }));
            if let Some((_, at)) = e.next {
                in_turn.order.insert((at, i));
            }
        }
        let whole = Plan::whole(entries);
        assert_eq!(whole.order, in_turn.order);
        assert_eq!(whole.order.len(), 32, "the eight past `at`s are not planned");
        assert_eq!(whole.next_instant(), in_turn.next_instant());
        assert_eq!(whole.next_instant().map(|(_, n)| n), Some(8), "the eight `every: 90s` jobs first");
        assert_eq!(whole.find("job-17"), Some(17), "a whole plan is in name order");
        assert_eq!(whole.sorted, 40);
    }

    /// The old plan's catch-ups are found walking them in name order: the sorted entries', a
    /// job added since, none for a job the plan does not have.
    #[test]
    fn a_takeovers_catch_up_is_found_in_the_old_plan_walked_in_name_order() {
        use lamplighter_config::{ScheduleSpec, parse_alone};
        let at = |s| DateTime::<Utc>::from_timestamp(s, 0).expect("instant");
        let schedule = Arc::new(parse_alone(ScheduleSpec::Every("1m".into()), "UTC").expect("a schedule"));
        let entry = |gained| Entry { schedule: schedule.clone(), last: None, next: None, gained };
        let mut old = Plan::whole(vec![("b".into(), entry(Some(at(1)))), ("d".into(), entry(None)), ("f".into(), entry(Some(at(3))))]);
        old.put("a-added", entry(Some(at(9))));
        let mut gained = old.catch_ups().sorted();
        let found: Vec<_> = ["a", "a-added", "b", "c", "d", "e", "f", "g"].into_iter().map(|n| (n, gained.of(n))).collect();
        assert_eq!(
            found,
            [
                ("a", None),
                ("a-added", Some(at(9))),
                ("b", Some(at(1))),
                ("c", None),
                ("d", None),
                ("e", None),
                ("f", Some(at(3))),
                ("g", None)
            ]
        );
        let mut skipping = old.catch_ups().sorted();
        assert_eq!((skipping.of("f"), skipping.of("g")), (Some(at(3)), None), "names asked for may skip others");
        let none = Plan::whole(vec![("b".into(), entry(None))]).catch_ups();
        assert!(none.all.is_empty(), "a plan without catch-ups copies no names");
    }

    #[test]
    fn the_lead_is_twice_what_as_many_ticks_took_within_its_bounds() {
        let at = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).expect("instant");
        let mut lead = Lead::default();
        // Nothing measured yet: 10 ms and 100 µs a tick, twice.
        assert_eq!(lead.of(at, 500), Some(ms(120)));
        assert_eq!(lead.of(at, 1), Some(chrono::TimeDelta::microseconds(20_200)));
        // A thousand ticks were ready in 12 ms: twice that for a thousand, scaled within the
        // decade, and the other sizes keep their own.
        lead.took(Took::Ready { ticks: 1000, us: 12_000 });
        assert_eq!(lead.of(at, 1000), Some(ms(24)));
        assert_eq!(lead.of(at, 2000), Some(ms(48)));
        assert_eq!(lead.of(at, 5), Some(chrono::TimeDelta::microseconds(21_000)));
        // Only a burst's first transaction is held: a larger burst counts as one of
        // `TICKS_PER_TRANSACTION`.
        assert_eq!(lead.of(at, 100_000), lead.of(at, TICKS_PER_TRANSACTION));
        assert_eq!(lead.of(at, 100_000), Some(ms(48)));
        // Bounded both ways: the writer is never held longer than the upper bound.
        lead.took(Took::Ready { ticks: TICKS_PER_TRANSACTION, us: 500_000 });
        assert_eq!(lead.of(at, 100_000), Some(LEAD_MAX));
        lead.took(Took::Ready { ticks: 1, us: 100 });
        assert_eq!(lead.of(at, 1), Some(LEAD_MIN));
        // A transaction let go: no lead up to its instant, the usual one after it.
        lead.took(Took::LetGo(at));
        assert_eq!(lead.of(at, 1000), None);
        assert_eq!(lead.of(at - ms(1), 1000), None);
        assert_eq!(lead.of(at + ms(1), 1000), Some(LEAD_MAX));
    }
}
