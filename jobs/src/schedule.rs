//! Runtime schedule policy, as pure functions: which of a job's ticks are due, which of them
//! fire (on time, or caught up after downtime), and each tick's jitter. The schedules
//! themselves are parsed once, by the config crate; the scheduler loop keeps the plan and
//! records what these decide.

use std::time::Duration;

use chrono::{DateTime, Utc};

use lamplighter_config::{CatchUp, JobConfig, Overlap, Schedule};

use crate::run::Trigger;

/// A tick later than this is "missed" and follows the job's catch-up policy.
pub(crate) const ON_TIME: chrono::Duration = chrono::Duration::seconds(60);
/// At most this many missed ticks are looked at per job (`catch_up: all` is bounded by it).
pub(crate) const MAX_MISSED: usize = 1000;

/// The parts of a job's config that decide when its ticks fire.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TickPolicy<'a> {
    pub(crate) job: &'a str,
    pub(crate) schedule: &'a Schedule,
    pub(crate) jitter: Option<Duration>,
    pub(crate) catch_up: CatchUp,
    pub(crate) catch_up_window: Duration,
    pub(crate) overlap: Overlap,
    /// Every due tick that fires at or after this instant fires, one after another, whatever
    /// `catch_up` says: the job was just taken over from a worker that may have stopped
    /// offering its ticks then (its lease ran out, it left the group), and what it did not fire
    /// was not missed by the schedule. Those later than [`ON_TIME`] are still told as missed,
    /// and fire as caught up.
    pub(crate) each_since: Option<DateTime<Utc>>,
}

impl<'a> TickPolicy<'a> {
    pub(crate) fn of(cfg: &'a JobConfig, schedule: &'a Schedule) -> Self {
        Self {
            job: &cfg.name,
            schedule,
            jitter: cfg.jitter,
            catch_up: cfg.catch_up,
            catch_up_window: cfg.catch_up_window,
            overlap: cfg.overlap,
            each_since: None,
        }
    }

    /// When `tick` fires: the tick plus its jitter.
    pub(crate) fn fire_at(&self, tick: DateTime<Utc>) -> DateTime<Utc> {
        tick + chrono::Duration::from_std(self.jitter.map(|j| jitter_for(self.job, tick, j)).unwrap_or_default()).unwrap_or_default()
    }
}

/// What a job's due ticks come to at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DueTicks {
    /// The ticks that fire, in order: (tick, when it fires, why).
    pub(crate) fire: Vec<(DateTime<Utc>, DateTime<Utc>, Trigger)>,
    /// How many of the due ticks were missed (more than [`ON_TIME`] late).
    pub(crate) missed: usize,
    /// What became of them, when there were any.
    pub(crate) missed_ticks: Option<MissedTicks>,
    /// The last tick processed (fired or passed over); it only moves forward.
    pub(crate) last: Option<DateTime<Utc>>,
    /// The last due tick when it did not fire: no run records it, so it is saved on its own.
    pub(crate) skipped_last: Option<DateTime<Utc>>,
    /// The job's next tick after these.
    pub(crate) next: Option<DateTime<Utc>>,
    /// The overlap policy the fired ticks apply: caught-up ticks run one after another, and the
    /// on-time tick after them (under `forbid` or `replace` they would otherwise skip or cancel
    /// each other at once).
    pub(crate) overlap: Overlap,
}

/// Ticks of a job that no worker fired on time (more than [`ON_TIME`] late: none was up, or
/// the database was away), seen together by one pass, and what its catch-up did with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MissedTicks {
    pub(crate) first: DateTime<Utc>,
    pub(crate) last: DateTime<Utc>,
    /// How many (at least: past [`MAX_MISSED`], `latest` and `skip` do not walk them all).
    pub(crate) count: usize,
    /// Fired late, as `catch_up` runs.
    pub(crate) caught_up: usize,
    /// Passed over by the job's `catch_up` policy (`latest` fires the newest only, `skip` none).
    pub(crate) skipped: usize,
    /// Older than `catch_up_window`: never fired.
    pub(crate) outside_window: usize,
}

/// A job's ticks due at `now`, from its planned next tick (`planned`) on, after the last one
/// processed (`last`). After a suspend or downtime there can be many: on-time ones always
/// fire; missed ones as the job's `catch_up` and `catch_up_window` say.
pub(crate) fn due_ticks(p: &TickPolicy<'_>, planned: Option<DateTime<Utc>>, last: Option<DateTime<Utc>>, now: DateTime<Utc>) -> DueTicks {
    let mut ticks = Vec::new();
    let mut cur = planned;
    while let Some(t) = cur {
        let fire_at = p.fire_at(t);
        if fire_at > now || ticks.len() >= MAX_MISSED {
            break;
        }
        ticks.push((t, fire_at));
        cur = p.schedule.next_after(t);
    }
    // Past MAX_MISSED, `latest` and `skip` need only the newest due tick, however far on (a
    // per-second job away for an hour has 3,600): it is found looking back from now. `all`
    // fires the oldest it looked at, and the rest on the passes after.
    if ticks.len() >= MAX_MISSED
        && p.catch_up != CatchUp::All
        && cur.is_some_and(|t| p.fire_at(t) <= now)
        && let Some(newest) = newest_due(p, ticks.last().map(|(t, _)| *t), now)
    {
        ticks.push(newest);
        cur = p.schedule.next_after(newest.0);
    }
    let fire = choose(p, &ticks, now);
    let missed = ticks.iter().filter(|(_, at)| now - *at > ON_TIME).count();
    let window_start = now - chrono::Duration::from_std(p.catch_up_window).unwrap_or(chrono::Duration::days(1));
    let mut missed_ticks: Option<MissedTicks> = None;
    for (t, _) in ticks.iter().filter(|(_, at)| now - *at > ON_TIME) {
        let m = missed_ticks.get_or_insert(MissedTicks { first: *t, last: *t, count: 0, caught_up: 0, skipped: 0, outside_window: 0 });
        m.last = *t;
        m.count += 1;
        if fire.iter().any(|(f, _, _)| f == t) {
            m.caught_up += 1;
        } else if *t < window_start {
            m.outside_window += 1;
        } else {
            m.skipped += 1;
        }
    }
    let due_last = ticks.last().map(|(t, _)| *t);
    let skipped_last = due_last.filter(|l| fire.last().map(|(t, _, _)| t) != Some(l));
    let catching_up = fire.iter().any(|(_, _, tr)| *tr == Trigger::CatchUp) || (p.each_since.is_some() && fire.len() > 1);
    let overlap = if catching_up && p.overlap != Overlap::Allow { Overlap::Queue } else { p.overlap };
    let last = due_last.or(last);
    // `cur` is the first tick after the last one taken: the job's next tick.
    let next = if ticks.is_empty() { p.schedule.next_after(last.unwrap_or(now)) } else { cur };
    DueTicks { fire, missed, missed_ticks, last, skipped_last, next, overlap }
}

/// The newest tick after `after` that is due at `now` (its fire time, jitter included, not
/// after `now`): looking back from `now` over a span that doubles until one is found, so a
/// frequent schedule is walked over seconds, not over the whole time away.
fn newest_due(p: &TickPolicy<'_>, after: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let jitter = chrono::Duration::from_std(p.jitter.unwrap_or_default()).unwrap_or_default();
    let floor = after.unwrap_or(DateTime::<Utc>::MIN_UTC);
    let mut back = chrono::Duration::seconds(1);
    loop {
        let from = now.checked_sub_signed(back + jitter).unwrap_or(floor).max(floor);
        let mut newest = None;
        let mut cur = p.schedule.next_after(from);
        while let Some(t) = cur.filter(|t| *t <= now) {
            let at = p.fire_at(t);
            if at <= now {
                newest = Some((t, at));
            }
            cur = p.schedule.next_after(t);
        }
        if newest.is_some() || from <= floor {
            return newest;
        }
        back = back.checked_mul(2)?;
    }
}

/// Which of the due ticks `(tick, fire at)` fire. Several ticks due at once mean the worker was
/// away (down, suspended, its clock stepped) or behind, and the catch-up policy decides for all
/// of them together; a tick inside its grace ([`ON_TIME`]) is one of them, not a run apart:
/// - `latest`: exactly one run, for the newest due tick (as `cron` when it is inside its grace,
///   as `catch_up` when later but inside `catch_up_window`);
/// - `all`: every due tick once (the late ones inside the window);
/// - `skip`: no late tick; the newest, when it is inside its grace, fires as the schedule's.
fn choose(
    p: &TickPolicy<'_>,
    ticks: &[(DateTime<Utc>, DateTime<Utc>)],
    now: DateTime<Utc>,
) -> Vec<(DateTime<Utc>, DateTime<Utc>, Trigger)> {
    let on_time = |at: &DateTime<Utc>| now - *at <= ON_TIME;
    let window_start = now - chrono::Duration::from_std(p.catch_up_window).unwrap_or(chrono::Duration::days(1));
    let mut chosen = by_catch_up(p, ticks, on_time, window_start);
    if let Some(since) = p.each_since {
        for (t, at) in ticks.iter().filter(|(_, at)| *at >= since) {
            if !chosen.iter().any(|(c, _, _)| c == t) {
                chosen.push((*t, *at, if on_time(at) { Trigger::Cron } else { Trigger::CatchUp }));
            }
        }
        chosen.sort_by_key(|(t, _, _)| *t);
    }
    chosen
}

/// The ticks of `ticks` the job's `catch_up` fires.
fn by_catch_up(
    p: &TickPolicy<'_>,
    ticks: &[(DateTime<Utc>, DateTime<Utc>)],
    on_time: impl Fn(&DateTime<Utc>) -> bool,
    window_start: DateTime<Utc>,
) -> Vec<(DateTime<Utc>, DateTime<Utc>, Trigger)> {
    match p.catch_up {
        CatchUp::Skip => ticks.last().filter(|(_, at)| on_time(at)).map(|(t, at)| (*t, *at, Trigger::Cron)).into_iter().collect(),
        CatchUp::Latest => match ticks.last() {
            Some((t, at)) if on_time(at) => vec![(*t, *at, Trigger::Cron)],
            Some((t, at)) if *t >= window_start => vec![(*t, *at, Trigger::CatchUp)],
            _ => Vec::new(),
        },
        CatchUp::All => ticks
            .iter()
            .filter(|(t, at)| on_time(at) || *t >= window_start)
            .map(|(t, at)| (*t, *at, if on_time(at) { Trigger::Cron } else { Trigger::CatchUp }))
            .collect(),
    }
}

/// A delay in `[0, max)` that depends only on the job and the tick, so a tick keeps its jitter
/// across restarts and on every worker.
pub fn jitter_for(job: &str, tick: DateTime<Utc>, max: Duration) -> Duration {
    let ms = max.as_millis() as u64;
    if ms == 0 {
        return Duration::ZERO;
    }
    let h = crate::share::fnv1a(job.bytes().chain(tick.timestamp_millis().to_le_bytes()));
    Duration::from_millis(h % ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn minutely() -> Schedule {
        Schedule::cron("* * * * *", "UTC").unwrap()
    }

    fn hourly() -> Schedule {
        Schedule::cron("0 * * * *", "UTC").unwrap()
    }

    fn policy(schedule: &Schedule, catch_up: CatchUp, window_mins: u64, overlap: Overlap) -> TickPolicy<'_> {
        TickPolicy {
            job: "j",
            schedule,
            jitter: None,
            catch_up,
            catch_up_window: Duration::from_secs(window_mins * 60),
            overlap,
            each_since: None,
        }
    }

    /// `(tick, trigger)` of what fires, with times as `HH:MM`.
    fn fired(d: &DueTicks) -> Vec<(String, Trigger)> {
        d.fire.iter().map(|(t, _, tr)| (t.format("%H:%M").to_string(), *tr)).collect()
    }

    fn hm(d: Option<DateTime<Utc>>) -> Option<String> {
        d.map(|t| t.format("%H:%M").to_string())
    }

    #[test]
    fn due_ticks_by_the_table() {
        use CatchUp::{All, Latest, Skip};
        use Trigger::{CatchUp as Caught, Cron};
        let (m, h) = (minutely(), hourly());
        let day = 24 * 60;
        // (schedule, catch_up, window (min), overlap, planned, now) => fired, missed, next, skipped last, overlap applied
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&Schedule, CatchUp, u64, Overlap, &str, &str, Vec<(&str, Trigger)>, usize, &str, Option<&str>, Overlap)> = vec![
            // On time (5 s late): fires as cron.
            (&m, Latest, day, Overlap::Forbid, "10:00:00", "10:00:05", vec![("10:00", Cron)], 0, "10:01", None, Overlap::Forbid),
            // 59 s late is still on time.
            (&m, Skip, day, Overlap::Forbid, "10:00:00", "10:00:59", vec![("10:00", Cron)], 0, "10:01", None, Overlap::Forbid),
            // Five minutes down: `latest` is exactly one run, the newest due tick (here inside its
            // grace, so as the schedule's).
            (&m, Latest, day, Overlap::Forbid, "10:00:00", "10:05:10", vec![("10:05", Cron)], 5, "10:06", None, Overlap::Forbid),
            // Restarted 41 s after the 23:04 tick, the 23:03 tick missed: one run, not two in one
            // second (issue 33).
            (&m, Latest, day, Overlap::Forbid, "23:03:00", "23:04:41", vec![("23:04", Cron)], 1, "23:05", None, Overlap::Forbid),
            (&m, Skip, day, Overlap::Forbid, "23:03:00", "23:04:41", vec![("23:04", Cron)], 1, "23:05", None, Overlap::Forbid),
            (
                &m,
                All,
                day,
                Overlap::Forbid,
                "23:03:00",
                "23:04:41",
                vec![("23:03", Caught), ("23:04", Cron)],
                1,
                "23:05",
                None,
                Overlap::Queue,
            ),
            // The grace's edge: 60 s late is inside it, 61 s is not.
            (&m, Skip, day, Overlap::Forbid, "10:00:00", "10:01:00", vec![("10:01", Cron)], 0, "10:02", None, Overlap::Forbid),
            (&h, Skip, day, Overlap::Forbid, "10:00:00", "10:01:00", vec![("10:00", Cron)], 0, "11:00", None, Overlap::Forbid),
            (&h, Skip, day, Overlap::Forbid, "10:00:00", "10:01:01", vec![], 1, "11:00", Some("10:00"), Overlap::Forbid),
            (&h, Latest, day, Overlap::Forbid, "10:00:00", "10:01:01", vec![("10:00", Caught)], 1, "11:00", None, Overlap::Queue),
            // `skip` fires only the newest tick, inside its grace.
            (&m, Skip, day, Overlap::Forbid, "10:00:00", "10:05:10", vec![("10:05", Cron)], 5, "10:06", None, Overlap::Forbid),
            // `all` within a 3-minute window.
            (
                &m,
                All,
                3,
                Overlap::Replace,
                "10:00:00",
                "10:05:10",
                vec![("10:03", Caught), ("10:04", Caught), ("10:05", Cron)],
                5,
                "10:06",
                None,
                Overlap::Queue,
            ),
            // `allow` stays `allow` while catching up.
            (
                &m,
                All,
                3,
                Overlap::Allow,
                "10:00:00",
                "10:05:10",
                vec![("10:03", Caught), ("10:04", Caught), ("10:05", Cron)],
                5,
                "10:06",
                None,
                Overlap::Allow,
            ),
            // Every due tick missed and `skip`: nothing fires; the last one is recorded on its own.
            (&h, Skip, day, Overlap::Forbid, "10:00:00", "12:30:00", vec![], 3, "13:00", Some("12:00"), Overlap::Forbid),
            (&h, Latest, day, Overlap::Forbid, "10:00:00", "12:30:00", vec![("12:00", Caught)], 3, "13:00", None, Overlap::Queue),
            // Missed ticks outside the window are not caught up.
            (&h, Latest, 20, Overlap::Forbid, "10:00:00", "12:30:00", vec![], 3, "13:00", Some("12:00"), Overlap::Forbid),
            // Nothing due yet: the next tick after now.
            (&m, Latest, day, Overlap::Forbid, "10:01:00", "10:00:30", vec![], 0, "10:01", None, Overlap::Forbid),
        ];
        for (i, (schedule, catch_up, window, overlap, planned, now, want, missed, next, skipped, applied)) in cases.into_iter().enumerate()
        {
            let p = policy(schedule, catch_up, window, overlap);
            let d = due_ticks(&p, Some(utc(&format!("2026-03-01T{planned}Z"))), None, utc(&format!("2026-03-01T{now}Z")));
            let want: Vec<(String, Trigger)> = want.into_iter().map(|(t, tr)| (t.to_string(), tr)).collect();
            assert_eq!(fired(&d), want, "case {i}");
            assert_eq!(d.missed, missed, "case {i}: missed");
            assert_eq!(hm(d.next).as_deref(), Some(next), "case {i}: next");
            assert_eq!(hm(d.skipped_last).as_deref(), skipped, "case {i}: skipped last");
            assert_eq!(d.overlap, applied, "case {i}: overlap");
        }
    }

    /// The ticks no worker fired on time, as one pass sees them: what catch-up did with each.
    #[test]
    fn missed_ticks_say_what_catch_up_did_with_them() {
        let h = hourly();
        let at = |s: &str| utc(&format!("2026-03-01T{s}Z"));
        let missed = |catch_up, window| {
            due_ticks(&policy(&h, catch_up, window, Overlap::Forbid), Some(at("07:00:00")), None, at("12:30:00")).missed_ticks
        };
        let m = |caught_up, skipped, outside_window| {
            Some(MissedTicks { first: at("07:00:00"), last: at("12:00:00"), count: 6, caught_up, skipped, outside_window })
        };
        // 07:00 … 12:00 missed; a window of 3 h 10 min keeps 09:30 on.
        assert_eq!(missed(CatchUp::Latest, 190), m(1, 2, 3));
        assert_eq!(missed(CatchUp::All, 190), m(3, 0, 3));
        assert_eq!(missed(CatchUp::Skip, 190), m(0, 3, 3));
        assert_eq!(missed(CatchUp::Latest, 20), m(0, 0, 6));
        // On time: nothing missed.
        assert_eq!(
            due_ticks(&policy(&h, CatchUp::Latest, 60, Overlap::Forbid), Some(at("12:00:00")), None, at("12:00:30")).missed_ticks,
            None
        );
    }

    /// Catch-up reads the same schedule as the ticks: on a calendar, the ticks of days off it
    /// were never due, so a weekend away has nothing to catch up from Saturday and Sunday.
    #[test]
    fn catch_up_keeps_to_the_calendar() {
        let config = "scheduling:\n  calendars:\n    business: {weekdays: [mon..fri]}\n  jobs:\n    j: {cron: \"0 6 * * *\", calendar: business, type: plugin, plugin: file-save, action: save}\n";
        let dir = std::env::temp_dir().join(format!("ll-catchup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("lamplighter.yaml"), config).unwrap();
        let opts =
            lamplighter_config::LoadOptions { path: Some(dir.join("lamplighter.yaml")), cwd: Some(dir.clone()), ..Default::default() };
        let loaded = lamplighter_config::load_with_env(&opts, |_| None).expect("loads").config;
        let s = loaded.jobs["j"].schedule.clone().unwrap();
        // Away from Friday 07:00 to Monday 07:00 (4 Dec 2026 is a Friday): Monday's tick only.
        let p = policy(&s, CatchUp::All, 7 * 24 * 60, Overlap::Allow);
        let d = due_ticks(&p, s.next_after(utc("2026-12-04T07:00:00Z")), None, utc("2026-12-07T07:00:00Z"));
        assert_eq!(
            d.fire.iter().map(|(t, _, tr)| (t.to_rfc3339(), *tr)).collect::<Vec<_>>(),
            [("2026-12-07T06:00:00+00:00".to_string(), Trigger::CatchUp)]
        );
        assert_eq!(d.missed_ticks.map(|m| m.count), Some(1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A long downtime looks at [`MAX_MISSED`] ticks and plans the next from there.
    #[test]
    fn missed_ticks_are_bounded() {
        let m = minutely();
        let p = policy(&m, CatchUp::All, 10 * 24 * 60, Overlap::Allow);
        let planned = utc("2026-03-01T00:00:00Z");
        let d = due_ticks(&p, Some(planned), None, planned + chrono::Duration::minutes(5000));
        assert_eq!((d.fire.len(), d.missed), (MAX_MISSED, MAX_MISSED));
        assert_eq!(d.next, Some(planned + chrono::Duration::minutes(MAX_MISSED as i64)));
        assert_eq!(d.last, Some(planned + chrono::Duration::minutes(MAX_MISSED as i64 - 1)));
    }

    /// A job taken over from a worker that stopped offering its ticks fires each tick due since
    /// its last one within the grace, one after another, whatever its `catch_up`; older ticks
    /// are its `catch_up`'s, as after downtime.
    #[test]
    fn a_job_taken_over_fires_each_tick_its_last_owner_left() {
        let every_second = Schedule::cron("* * * * * *", "UTC").unwrap();
        let planned = utc("2026-03-01T10:00:00Z");
        let now = planned + chrono::Duration::seconds(4);
        let seconds = |from: i64, to: i64| (from..=to).map(|s| planned + chrono::Duration::seconds(s)).collect::<Vec<_>>();
        let since = Some(planned);
        for catch_up in [CatchUp::Skip, CatchUp::Latest, CatchUp::All] {
            let p = TickPolicy { each_since: since, ..policy(&every_second, catch_up, 24 * 60, Overlap::Forbid) };
            let d = due_ticks(&p, Some(planned), None, now);
            let fired: Vec<DateTime<Utc>> = d.fire.iter().map(|(t, _, _)| *t).collect();
            assert_eq!(fired, seconds(0, 4), "{catch_up:?}");
            assert!(d.fire.iter().all(|(_, _, tr)| *tr == Trigger::Cron), "{catch_up:?}: {:?}", d.fire);
            assert_eq!((d.missed, d.overlap), (0, Overlap::Queue), "{catch_up:?}: run one after another, none skipped");
            // Without the takeover, `skip` and `latest` fire the newest only.
            let own = due_ticks(&policy(&every_second, catch_up, 24 * 60, Overlap::Forbid), Some(planned), None, now);
            assert_eq!(own.fire.len(), if catch_up == CatchUp::All { 5 } else { 1 }, "{catch_up:?}");
        }
        // Two minutes behind, taken over from 100 s ago (a long lease): those from then fire,
        // the ones more than a minute late as caught up (and told as missed); the older ones
        // are the job's `skip`'s.
        let now = planned + chrono::Duration::seconds(120);
        let p = TickPolicy {
            each_since: Some(planned + chrono::Duration::seconds(20)),
            ..policy(&every_second, CatchUp::Skip, 24 * 60, Overlap::Allow)
        };
        let d = due_ticks(&p, Some(planned), None, now);
        assert_eq!(d.fire.iter().map(|(t, _, _)| *t).collect::<Vec<_>>(), seconds(20, 120));
        assert!(
            d.fire.iter().all(|(t, _, tr)| (*tr == Trigger::CatchUp) == (*t < planned + chrono::Duration::seconds(60))),
            "{:?}",
            d.fire
        );
        assert_eq!(d.overlap, Overlap::Allow);
        let m = d.missed_ticks.expect("told");
        assert_eq!((m.count, m.caught_up, m.skipped), (60, 40, 20));
        // One tick due: as it would be anyway.
        let d = due_ticks(&p, Some(planned), None, planned + chrono::Duration::milliseconds(300));
        assert_eq!((d.fire.len(), d.overlap), (1, Overlap::Allow));
    }

    /// An hour away (the clock stepped, the machine suspended) is 3,600 ticks of a per-second
    /// job: `latest` and `skip` still give exactly one run, the newest due tick; `all` the
    /// oldest [`MAX_MISSED`], the rest on later passes.
    #[test]
    fn an_hour_of_per_second_ticks_is_one_run_for_latest_and_skip() {
        let every_second = Schedule::cron("* * * * * *", "UTC").unwrap();
        let planned = utc("2026-03-01T10:00:00Z");
        let now = planned + chrono::Duration::hours(1);
        for catch_up in [CatchUp::Latest, CatchUp::Skip] {
            let p = policy(&every_second, catch_up, 24 * 60, Overlap::Forbid);
            let d = due_ticks(&p, Some(planned), None, now);
            assert_eq!(d.fire, vec![(now, now, Trigger::Cron)], "{catch_up:?}");
            assert_eq!((d.last, d.next), (Some(now), Some(now + chrono::Duration::seconds(1))), "{catch_up:?}");
        }
        let p = policy(&every_second, CatchUp::All, 24 * 60, Overlap::Forbid);
        let d = due_ticks(&p, Some(planned), None, now);
        assert_eq!((d.fire.len(), d.fire[0].0), (MAX_MISSED, planned));
        // With jitter, the newest tick whose jittered time has come.
        let p = TickPolicy { jitter: Some(Duration::from_millis(900)), ..policy(&every_second, CatchUp::Latest, 24 * 60, Overlap::Forbid) };
        let d = due_ticks(&p, Some(planned), None, now);
        assert_eq!(d.fire.len(), 1);
        assert!(d.fire[0].1 <= now && d.fire[0].0 >= now - chrono::Duration::seconds(1), "{:?}", d.fire);
    }

    /// A tick fires at its jitter, not before.
    #[test]
    fn a_tick_waits_for_its_jitter() {
        let m = minutely();
        let p = TickPolicy { jitter: Some(Duration::from_secs(50)), ..policy(&m, CatchUp::Latest, 60, Overlap::Allow) };
        let tick = utc("2026-03-01T10:00:00Z");
        let at = p.fire_at(tick);
        assert!(at > tick && at < tick + chrono::Duration::seconds(50), "{at}");
        let before = due_ticks(&p, Some(tick), None, at - chrono::Duration::milliseconds(1));
        assert!(before.fire.is_empty());
        let then = due_ticks(&p, Some(tick), None, at);
        assert_eq!(then.fire, vec![(tick, at, Trigger::Cron)]);
    }

    #[test]
    fn jitter_is_stable_per_tick_and_bounded() {
        let t = utc("2026-01-01T02:00:00Z");
        let max = Duration::from_secs(60);
        let a = jitter_for("nightly", t, max);
        assert_eq!(a, jitter_for("nightly", t, max));
        assert!(a < max);
        let spread: std::collections::HashSet<_> = (0..50).map(|i| jitter_for("nightly", t + chrono::Duration::days(i), max)).collect();
        assert!(spread.len() > 40, "jitter should vary between ticks");
        assert_eq!(jitter_for("x", t, Duration::ZERO), Duration::ZERO);
    }
}
