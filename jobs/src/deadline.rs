//! Deadlines (SPEC §4a): which deadline of a run that still waits or runs has passed, and the
//! watcher that tells each miss once, from the database, on any live worker.
//!
//! Measured from the tick — the scheduled instant of the run identity's first attempt — for a
//! run a tick started (`cron`, which is also `every` and `at`, and `catch_up`); from when it
//! was asked for (the first attempt's enqueue) for any other (`manual`, `api`, `after`,
//! `backfill`): a backfilled tick of last week is not a week late. Retries are the same
//! identity, so they count towards `finish_within` and `finish_by`, and a miss is told once
//! per identity and deadline. `start_within` is about ticks only: a run asked for by hand has
//! none, and it is met once the first attempt started.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use lamplighter_config::{Deadline, JobConfig, NotifyOn, OnMiss};

use crate::clock::Clock;
use crate::events::Observer;
use crate::executor::Executor;
use crate::in_force::InForce;
use crate::notify::{self, NewNotification};
use crate::run::{Run, RunStatus, Trigger};
use crate::store::{Deadlines, StoreError};

/// Which deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Which {
    StartWithin,
    FinishWithin,
    FinishBy,
}

impl Which {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::StartWithin => "start_within",
            Self::FinishWithin => "finish_within",
            Self::FinishBy => "finish_by",
        }
    }
}

impl std::str::FromStr for Which {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        [Self::StartWithin, Self::FinishWithin, Self::FinishBy].into_iter().find(|w| w.as_str() == s).ok_or(())
    }
}

/// What a deadline is measured from: the run identity's first attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Root {
    pub(crate) trigger: Trigger,
    /// When it was enqueued (asked for).
    pub(crate) asked_at: DateTime<Utc>,
    /// Whether it started.
    pub(crate) started: bool,
}

/// A deadline a run identity missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Miss {
    pub(crate) root_id: String,
    /// The attempt that was waiting or running when it was seen.
    pub(crate) run_id: String,
    pub(crate) job: String,
    pub(crate) which: Which,
    /// The tick it is measured from, for a run a tick started.
    pub(crate) tick: Option<DateTime<Utc>>,
    pub(crate) due_at: DateTime<Utc>,
    /// When it was told (`None` before).
    pub(crate) told_at: Option<DateTime<Utc>>,
    /// The run is stopped (`on_miss: cancel`, a finish deadline).
    pub(crate) cancel: bool,
}

/// When each of `deadline`'s deadlines falls for `run` (with `root`, its first attempt), the
/// job's zone being `zone`: those that apply to it now (a started identity has no start
/// deadline left).
pub(crate) fn due(run: &Run, root: &Root, deadline: &Deadline, zone: Tz) -> Vec<(Which, DateTime<Utc>)> {
    let ticked = matches!(root.trigger, Trigger::Cron | Trigger::CatchUp);
    let from = match (ticked, run.scheduled_at) {
        (true, Some(tick)) => tick,
        _ => root.asked_at,
    };
    let mut out = Vec::new();
    if let Some(d) = deadline.start_within
        && ticked
        && !root.started
        && run.status == RunStatus::Queued
        && run.retry_of.is_none()
    {
        out.push((Which::StartWithin, from + chrono::Duration::from_std(d).unwrap_or(chrono::TimeDelta::MAX)));
    }
    if let Some(d) = deadline.finish_within {
        out.push((Which::FinishWithin, from + chrono::Duration::from_std(d).unwrap_or(chrono::TimeDelta::MAX)));
    }
    if let Some(t) = deadline.finish_by
        && let Some(at) = next_local(from, t, zone)
    {
        out.push((Which::FinishBy, at));
    }
    out
}

/// The first instant after `from` whose local time in `zone` is `t` (a time in a DST gap:
/// the instant just after the gap, read with the offset before it).
pub(crate) fn next_local(from: DateTime<Utc>, t: NaiveTime, zone: Tz) -> Option<DateTime<Utc>> {
    let day = from.with_timezone(&zone).date_naive();
    for d in day.iter_days().take(3) {
        let local = d.and_time(t);
        let at = match zone.from_local_datetime(&local) {
            chrono::LocalResult::Single(a) => a.with_timezone(&Utc),
            chrono::LocalResult::Ambiguous(a, _) => a.with_timezone(&Utc),
            chrono::LocalResult::None => {
                let before = zone.offset_from_utc_datetime(&(local - chrono::Duration::hours(3)));
                use chrono::Offset;
                Utc.from_utc_datetime(&(local - chrono::Duration::seconds(i64::from(before.fix().local_minus_utc()))))
            }
        };
        if at > from {
            return Some(at);
        }
    }
    None
}

/// What one pass finds: the misses to tell, and when the next deadline of a watched run falls.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Found {
    pub(crate) misses: Vec<Miss>,
    pub(crate) next_due: Option<DateTime<Utc>>,
}

/// The deadlines of `runs` passed at `now` and not yet told (`told`), each once per identity.
pub(crate) fn find(
    runs: &[(Run, Root)],
    told: &HashSet<(String, Which)>,
    deadline_of: &dyn Fn(&str) -> Option<(Deadline, Tz)>,
    now: DateTime<Utc>,
) -> Found {
    let mut found = Found::default();
    let mut seen: HashSet<(&str, Which)> = HashSet::new();
    for (run, root) in runs {
        let job = run.owner.to_string();
        let Some((deadline, zone)) = deadline_of(&job) else { continue };
        for (which, at) in due(run, root, &deadline, zone) {
            if told.contains(&(run.root_id.clone(), which)) || !seen.insert((run.root_id.as_str(), which)) {
                continue;
            }
            if at <= now {
                found.misses.push(Miss {
                    root_id: run.root_id.clone(),
                    run_id: run.id.clone(),
                    job: job.clone(),
                    which,
                    tick: run.scheduled_at.filter(|_| matches!(root.trigger, Trigger::Cron | Trigger::CatchUp)),
                    due_at: at,
                    told_at: None,
                    cancel: deadline.on_miss == OnMiss::Cancel && which != Which::StartWithin,
                });
            } else {
                found.next_due = Some(found.next_due.map_or(at, |n| n.min(at)));
            }
        }
    }
    found
}

/// The notification each of `rules` that is about missed deadlines records for `miss` of `run`.
pub(crate) fn notifications(miss: &Miss, run: &Run, rules: &[lamplighter_config::NotifyRule], now: DateTime<Utc>) -> Vec<NewNotification> {
    rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.on == NotifyOn::DeadlineMissed)
        .map(|(i, r)| {
            let key = notify::key(&miss.root_id, NotifyOn::DeadlineMissed, Some(miss.which.as_str()), i);
            let mut payload = notify::payload(NotifyOn::DeadlineMissed, &key, run, 0, None);
            payload["deadline"] = json!(miss.which.as_str());
            payload["due_at"] = json!(miss.due_at);
            payload["tick"] = json!(miss.tick);
            payload["late_seconds"] = json!((now - miss.due_at).num_seconds().max(0));
            payload["on_miss"] = json!(if miss.cancel { "cancel" } else { "notify" });
            NewNotification {
                key,
                job: miss.job.clone(),
                run_id: run.id.clone(),
                root_id: miss.root_id.clone(),
                event: NotifyOn::DeadlineMissed,
                target: r.to.describe(),
                target_id: notify::target_id(&r.to),
                payload,
            }
        })
        .collect()
}

/// The longest a watcher sleeps between passes while some job has a deadline: a run enqueued
/// meanwhile is looked at within it.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// And while none has.
const IDLE: Duration = Duration::from_secs(5);
/// Up to this many jobs with deadlines, a pass asks for their runs by name.
const NAMED_AT_MOST: usize = 200;

/// What the watcher is handed.
pub(crate) struct WatcherEnv {
    pub(crate) deadlines: Arc<dyn Deadlines>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: Arc<InForce>,
    pub(crate) observer: Arc<Observer>,
    /// Stops a run past a deadline with `on_miss: cancel` (here or on its worker).
    pub(crate) executor: Arc<Executor>,
}

/// The deadline and zone of a job, if it has a deadline.
fn deadline_of(job: &JobConfig) -> Option<(Deadline, Tz)> {
    let d = *job.deadline()?;
    let zone = job.timezone.parse::<Tz>().unwrap_or(Tz::UTC);
    Some((d, zone))
}

/// Watches the deadlines of every job that has one, until `stop`: a pass a second while any
/// has (and at the next deadline), each miss told once across workers.
pub(crate) async fn watch(env: WatcherEnv, stop: CancellationToken) {
    let mut failures = 0u32;
    let mut watched = Watching::default();
    loop {
        let wait = match pass(&env, &mut watched).await {
            Ok(Some(next)) => {
                failures = 0;
                let until = (next - env.clock.now()).to_std().unwrap_or_default();
                until.min(LOOK_EVERY)
            }
            Ok(None) => {
                failures = 0;
                IDLE
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(30) {
                    tracing::warn!(error = %e, failures, "cannot watch deadlines; trying again");
                }
                LOOK_EVERY
            }
        };
        tokio::select! {
            () = env.clock.sleep_until(env.clock.now() + chrono::Duration::from_std(wait).unwrap_or_default()) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// The jobs with a deadline, found once per set of jobs in force (a million jobs are not
/// walked every second).
#[derive(Default)]
struct Watching {
    of: Option<crate::in_force::JobMap>,
    names: Vec<String>,
}

/// One pass: `None` when no job has a deadline, else when to look again at the latest.
async fn pass(env: &WatcherEnv, watching: &mut Watching) -> Result<Option<DateTime<Utc>>, StoreError> {
    let config = env.config.get();
    let jobs = config.jobs.clone();
    if watching.of.as_ref().is_none_or(|of| !of.same(&jobs)) {
        // Every job is looked at, off the runtime's threads. (The jobs of before, which this
        // lets go of, are freed by the config's reaper.)
        let of = jobs.clone();
        let found = crate::off_the_runtime(move || of.values().filter(|j| j.deadline().is_some()).map(|j| j.name.clone()).collect());
        let Some(names) = found.await else { return Ok(None) };
        watching.names = names;
        watching.of = Some(jobs.clone());
    }
    if watching.names.is_empty() {
        return Ok(None);
    }
    let watched_jobs: Vec<&str> = watching.names.iter().map(String::as_str).collect();
    // Many jobs with deadlines (`scheduling.deadline` gives every job one): every run not
    // ended is read, rather than a list of names as long as the config.
    let watched = env.deadlines.watched((watched_jobs.len() <= NAMED_AT_MOST).then_some(&watched_jobs[..])).await?;
    let now = env.clock.now();
    let found = find(&watched.runs, &watched.told, &|job| jobs.get(job).and_then(deadline_of), now);
    let next = found.next_due.unwrap_or(now + chrono::Duration::from_std(LOOK_EVERY).unwrap_or_default());
    if found.misses.is_empty() {
        return Ok(Some(next));
    }
    let by_id: std::collections::HashMap<&str, &Run> = watched.runs.iter().map(|(r, _)| (r.id.as_str(), r)).collect();
    let with_notifications: Vec<(Miss, Vec<NewNotification>)> = found
        .misses
        .into_iter()
        .map(|m| {
            let rules = config.notify_rules(&m.job).unwrap_or_default();
            let n = by_id.get(m.run_id.as_str()).map(|run| notifications(&m, run, &rules, now)).unwrap_or_default();
            (m, n)
        })
        .collect();
    for m in env.deadlines.tell_misses(&with_notifications, now).await? {
        let late = (now - m.due_at).num_seconds().max(0);
        tracing::warn!(job = %m.job, run = %m.run_id, deadline = m.which.as_str(), due_at = %m.due_at, late_seconds = late, cancel = m.cancel, "deadline missed");
        env.observer.deadline_missed(&m.job, m.which.as_str());
        if m.cancel {
            let why = format!(
                "cancelled: missed its deadline {} (due {})",
                m.which.as_str(),
                m.due_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            if !env.executor.stop_run(&m.run_id, why, now).await {
                tracing::warn!(job = %m.job, run = %m.run_id, "a run past its deadline could not be stopped (it may have just ended)");
            }
        }
    }
    Ok(Some(next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Owner;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn run(id: &str, root: &str, trigger: Trigger, status: RunStatus, tick: Option<&str>) -> Run {
        Run {
            scheduled_at: tick.map(t),
            root_id: root.into(),
            retry_of: (root != id).then(|| root.into()),
            follow_up: crate::run::FollowUp::None,
            ..Run::for_tests(id, Owner::Job("etl".into()), trigger, status, t("2026-12-04T01:00:00Z"))
        }
    }

    fn deadline(start: Option<u64>, finish: Option<u64>, by: Option<&str>, cancel: bool) -> Deadline {
        Deadline {
            start_within: start.map(Duration::from_secs),
            finish_within: finish.map(Duration::from_secs),
            finish_by: by.map(|b| NaiveTime::parse_from_str(b, "%H:%M").unwrap()),
            on_miss: if cancel { OnMiss::Cancel } else { OnMiss::Notify },
        }
    }

    #[test]
    fn a_tick_is_measured_from_its_instant_and_a_manual_run_from_when_it_was_asked_for() {
        let d = deadline(Some(300), Some(3600), Some("06:00"), false);
        let root = Root { trigger: Trigger::Cron, asked_at: t("2026-12-04T02:00:05Z"), started: false };
        let tick = run("a", "a", Trigger::Cron, RunStatus::Queued, Some("2026-12-04T02:00:00Z"));
        assert_eq!(
            due(&tick, &root, &d, Tz::Europe__Berlin),
            [
                (Which::StartWithin, t("2026-12-04T02:05:00Z")),
                (Which::FinishWithin, t("2026-12-04T03:00:00Z")),
                (Which::FinishBy, t("2026-12-04T05:00:00Z")),
            ]
        );
        // By hand: no start deadline, the others from when it was asked for.
        let manual = Root { trigger: Trigger::Manual, asked_at: t("2026-12-04T05:30:00Z"), started: false };
        let m = run("m", "m", Trigger::Manual, RunStatus::Queued, None);
        assert_eq!(
            due(&m, &manual, &d, Tz::Europe__Berlin),
            [(Which::FinishWithin, t("2026-12-04T06:30:00Z")), (Which::FinishBy, t("2026-12-05T05:00:00Z"))]
        );
        // A backfilled tick of last week is measured from now, not from last week.
        let backfill = Root { trigger: Trigger::Backfill, asked_at: t("2026-12-04T05:30:00Z"), started: false };
        let b = run("b", "b", Trigger::Backfill, RunStatus::Queued, Some("2026-11-27T02:00:00Z"));
        assert_eq!(due(&b, &backfill, &d, Tz::UTC)[0], (Which::FinishWithin, t("2026-12-04T06:30:00Z")));
    }

    #[test]
    fn a_retry_counts_towards_finish_and_each_miss_is_found_once_per_identity() {
        let d = deadline(Some(60), Some(600), None, true);
        let root = Root { trigger: Trigger::Cron, asked_at: t("2026-12-04T02:00:00Z"), started: true };
        // The first attempt failed; its retry waits: started, so no start deadline; the
        // finish deadline is the tick's.
        let retry = run("a2", "a", Trigger::Retry, RunStatus::Queued, Some("2026-12-04T02:00:00Z"));
        let runs = vec![(retry.clone(), root), (run("a3", "a", Trigger::Retry, RunStatus::Running, Some("2026-12-04T02:00:00Z")), root)];
        let of = |_: &str| Some((d, Tz::UTC));
        let found = find(&runs, &HashSet::new(), &of, t("2026-12-04T02:10:01Z"));
        assert_eq!(found.misses.len(), 1, "{found:?}");
        let m = &found.misses[0];
        assert_eq!((m.which, m.run_id.as_str(), m.due_at, m.cancel), (Which::FinishWithin, "a2", t("2026-12-04T02:10:00Z"), true));
        assert_eq!(m.tick, Some(t("2026-12-04T02:00:00Z")));
        // Told already: nothing; before it is due: nothing, and when to look again.
        let told = HashSet::from([("a".to_string(), Which::FinishWithin)]);
        assert!(find(&runs, &told, &of, t("2026-12-04T02:20:00Z")).misses.is_empty());
        let early = find(&runs, &HashSet::new(), &of, t("2026-12-04T02:05:00Z"));
        assert_eq!((early.misses.len(), early.next_due), (0, Some(t("2026-12-04T02:10:00Z"))));
        // A start deadline never cancels.
        let waiting = run("w", "w", Trigger::Cron, RunStatus::Queued, Some("2026-12-04T02:00:00Z"));
        let wroot = Root { trigger: Trigger::Cron, asked_at: t("2026-12-04T02:00:00Z"), started: false };
        let found = find(&[(waiting, wroot)], &HashSet::new(), &of, t("2026-12-04T02:01:30Z"));
        assert_eq!(found.misses.iter().map(|m| (m.which, m.cancel)).collect::<Vec<_>>(), [(Which::StartWithin, false)]);
    }

    #[test]
    fn finish_by_is_the_next_such_local_time_across_midnight_and_dst() {
        let six = NaiveTime::from_hms_opt(6, 0, 0).unwrap();
        assert_eq!(next_local(t("2026-12-04T22:00:00Z"), six, Tz::UTC), Some(t("2026-12-05T06:00:00Z")));
        assert_eq!(next_local(t("2026-12-04T06:00:00Z"), six, Tz::UTC), Some(t("2026-12-05T06:00:00Z")), "strictly after");
        // 02:30 does not exist in Berlin on 29 March 2026: just after the gap.
        let half_two = NaiveTime::from_hms_opt(2, 30, 0).unwrap();
        assert_eq!(next_local(t("2026-03-28T23:00:00Z"), half_two, Tz::Europe__Berlin), Some(t("2026-03-29T01:30:00Z")));
    }
}
