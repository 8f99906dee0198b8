//! When a job fires: cron (5/6 fields, macros), `every:`, one-shot `at:`, in the job's time
//! zone, with the DST rules of SPEC §4 (one per kind of job; the README says where cron(8)
//! differs):
//!
//! - a *frequent* cron job (its seconds, minute or hour field starts with `*`) follows real
//!   time: it fires at every instant whose local wall-clock time matches, so it runs in both
//!   passes of a repeated autumn hour and simply continues across the spring gap;
//! - any other cron job follows RFC 5545 §3.3.5: a local time in a gap is read with the offset
//!   before the gap (02:30 → 03:30; cron(8) would run it at 03:00, right after the jump); a
//!   repeated local time means its first occurrence; two entries landing on one instant fire
//!   once.
//!
//! Cron fields are matched on *local wall-clock time* with the `cron` crate evaluated on naive
//! times; the mapping to instants is ours, because that is where the DST rules live.

use std::str::FromStr;
use std::time::Duration;

use std::sync::Arc;

use chrono::{DateTime, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

use crate::calendar::Calendar;

/// When a job fires, as written in the config.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ScheduleSpec {
    Cron(String),
    Every(String),
    At(String),
}

impl ScheduleSpec {
    /// The config key it was written under: `cron`, `every` or `at`.
    pub fn field(&self) -> &'static str {
        match self {
            ScheduleSpec::Cron(_) => "cron",
            ScheduleSpec::Every(_) => "every",
            ScheduleSpec::At(_) => "at",
        }
    }
}

impl std::fmt::Display for ScheduleSpec {
    /// `cron: 0 2 * * *`, as listings show it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ScheduleSpec::Cron(s) | ScheduleSpec::Every(s) | ScheduleSpec::At(s)) = self;
        write!(f, "{}: {s}", self.field())
    }
}

/// A parsed schedule. Computing fire times never fails. Parsed once, when the config is
/// compiled; the scheduler and the listings share it.
#[derive(Debug, Clone)]
pub struct Schedule {
    spec: ScheduleSpec,
    kind: Kind,
    tz: Tz,
    memo: NextMemo,
    /// The calendar whose days it fires on, the zone those days are read in (the job's, also
    /// for `every` and `at`), and what becomes of a fire on a day off it.
    calendar: Option<(Arc<Calendar>, Tz, Shift)>,
}

/// What becomes of a fire whose day is not a day of the job's calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Shift {
    /// It does not fire.
    #[default]
    Skip,
    /// It fires at the same local time on the last day of the calendar before its own.
    Previous,
    /// It fires at the same local time on the first day of the calendar after its own.
    Next,
}

impl Shift {
    /// `previous` or `next`, as the config writes it (`None` for a skip).
    pub fn name(self) -> Option<&'static str> {
        match self {
            Shift::Skip => None,
            Shift::Previous => Some("previous"),
            Shift::Next => Some("next"),
        }
    }
}

/// The last cron answer, `(t, next)`: the first fire after `t` is `next`, so it is also the
/// first fire after any instant in `[t, next)`. A listing asks every job for its next fire on
/// each call; between two fires the answer does not change, and walking a cron expression
/// (with its zone and DST rules) is the listing's costliest part after the database. A clone
/// starts empty.
#[derive(Debug, Default)]
struct NextMemo(std::sync::Mutex<Option<(DateTime<Utc>, DateTime<Utc>)>>);

impl Clone for NextMemo {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl NextMemo {
    fn get(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let memo = *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        memo.and_then(|(from, next)| (from <= t && t < next).then_some(next))
    }

    fn set(&self, t: DateTime<Utc>, next: DateTime<Utc>) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((t, next));
    }
}

/// Two schedules are equal when they were written the same and fire in the same zone on the
/// same calendar: the parsed form follows from those.
impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec && self.tz == other.tz && self.calendar == other.calendar
    }
}

/// How a cron job's wall-clock times become instants across DST changes (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DstRule {
    /// Every real instant whose wall-clock time matches.
    RealTime,
    /// Each wall-clock time once: its first occurrence, or shifted past a gap.
    FirstOccurrence,
}

#[derive(Debug, Clone)]
enum Kind {
    /// One or two cron schedules whose union is the job's schedule (two when both day-of-month
    /// and day-of-week are restricted: standard cron fires when *either* matches).
    Cron {
        scheds: Vec<cron::Schedule>,
        dst: DstRule,
    },
    /// Every `period`, aligned to the Unix epoch so tick identities survive restarts.
    Every(Duration),
    At(DateTime<Utc>),
}

/// A schedule that cannot be parsed, with a message saying how to write it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScheduleError(String);

const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
const MONTHS: [&str; 12] = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];

impl Schedule {
    /// A cron expression in the IANA zone `tz`.
    pub fn cron(expr: &str, tz: &str) -> Result<Self, ScheduleError> {
        Self::build(ScheduleSpec::Cron(expr.to_string()), &parse_tz(tz))
    }

    /// Parses `spec`; a cron schedule fires in `tz` (already parsed, so a bad zone is one
    /// error however many jobs use it). A cron error is reported before a zone error; `every`
    /// and `at` ignore the zone.
    pub(crate) fn build(spec: ScheduleSpec, tz: &Result<Tz, ScheduleError>) -> Result<Self, ScheduleError> {
        let (kind, tz) = match &spec {
            ScheduleSpec::Cron(expr) => {
                let (scheds, dst) = parse_cron(expr)?;
                (Kind::Cron { scheds, dst }, tz.clone()?)
            }
            ScheduleSpec::Every(e) => (Kind::Every(every(e)?), Tz::UTC),
            ScheduleSpec::At(a) => (Kind::At(at(a)?), Tz::UTC),
        };
        Ok(Self { spec, kind, tz, memo: NextMemo::default(), calendar: None })
    }

    /// The schedule's fires on the days of `calendar` only, each day read in `zone`; a fire on
    /// a day off the calendar is skipped, or moved to the same local time of the calendar's day
    /// before or after, as `shift` says. A moved fire is the fire of the day it moves to at that
    /// time: where that day fires then already, or another moved fire lands on it, it fires
    /// once (a tick is its instant, so exactly once holds as for any other fire).
    pub fn on_calendar(mut self, calendar: Arc<Calendar>, zone: Tz, shift: Shift) -> Self {
        self.calendar = Some((calendar, zone, shift));
        self.memo = NextMemo::default();
        self
    }

    /// The calendar it fires on, if any.
    pub fn calendar(&self) -> Option<&Calendar> {
        self.calendar.as_ref().map(|(c, ..)| c.as_ref())
    }

    /// What becomes of a fire on a day off its calendar.
    pub fn shift(&self) -> Shift {
        self.calendar.as_ref().map_or(Shift::Skip, |(.., s)| *s)
    }

    /// Every `spec` (a duration such as `90s`), aligned to the Unix epoch.
    pub fn every(spec: &str) -> Result<Self, ScheduleError> {
        Self::build(ScheduleSpec::Every(spec.to_string()), &Ok(Tz::UTC))
    }

    /// Once, at the RFC 3339 instant `spec`.
    pub fn at(spec: &str) -> Result<Self, ScheduleError> {
        Self::build(ScheduleSpec::At(spec.to_string()), &Ok(Tz::UTC))
    }

    /// The schedule as written.
    pub fn spec(&self) -> &ScheduleSpec {
        &self.spec
    }

    /// The zone a cron schedule fires in; UTC for `every` and `at`.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// The first fire instant strictly after `t` (on a day of its calendar, if it has one).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let remembered = self.calendar.is_some() || matches!(self.kind, Kind::Cron { .. });
        if remembered && let Some(next) = self.memo.get(t) {
            return Some(next);
        }
        let next = match &self.calendar {
            None => self.next_by_rule(t),
            Some((.., Shift::Skip)) => self.next_on_calendar(t, &mut |_, _| {}),
            Some((calendar, zone, shift)) => self.next_shifted(calendar, *zone, *shift, t),
        };
        if remembered && let Some(next) = next {
            self.memo.set(t, next);
        }
        next
    }

    /// The first fire after `t` by its rule alone, calendar aside.
    fn next_by_rule(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.kind {
            Kind::At(at) => (*at > t).then_some(*at),
            Kind::Every(d) => {
                // At most 366 days (`MAX_EVERY`), so this fits; checked all the same.
                let p = i64::try_from(d.as_millis()).ok()?.max(1);
                let ms = t.timestamp_millis();
                let next = ms.div_euclid(p).checked_add(1)?.checked_mul(p)?;
                DateTime::from_timestamp_millis(next)
            }
            Kind::Cron { scheds, dst } => scheds.iter().filter_map(|s| next_cron(s, *dst, self.tz, t)).min(),
        }
    }

    /// The first fire after `t` on a day of the calendar; `skipped` is told each day a fire
    /// was passed over on, and why. A day off the calendar is passed over whole, so the walk
    /// takes a step a day at most, and gives up after [`CALENDAR_HORIZON_DAYS`].
    fn next_on_calendar(&self, t: DateTime<Utc>, skipped: &mut dyn FnMut(NaiveDate, String)) -> Option<DateTime<Utc>> {
        let (calendar, zone, _) = self.calendar.as_ref()?;
        let mut cur = t;
        for _ in 0..CALENDAR_HORIZON_DAYS {
            let fire = self.next_by_rule(cur)?;
            let day = fire.with_timezone(zone).date_naive();
            match calendar.why_not(day) {
                None => return Some(fire),
                Some(why) => {
                    skipped(day, why);
                    cur = last_instant_of(day, *zone).max(fire);
                }
            }
        }
        None
    }

    /// The first fire after `t` with the fires on days off the calendar moved by `shift`
    /// (never [`Shift::Skip`]). A day of the calendar fires its own fires and, at their local
    /// times, those of the days off the calendar that move onto it (the days just before it
    /// for `next`, just after it for `previous`); the first such day with a fire after `t`
    /// answers.
    fn next_shifted(&self, calendar: &Calendar, zone: Tz, shift: Shift, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let t_local = t.with_timezone(&zone).naive_local();
        // The days on the calendar are walked from the one `t` is on, or (for `next`, whose
        // moved fires come from earlier days) from it all the same: a day before `t`'s has
        // only fires before `t`.
        let mut day = t_local.date();
        for _ in 0..CALENDAR_HORIZON_DAYS {
            if calendar.contains(day) {
                let mut best = self.first_on_day(day, zone, t).map(|(f, _)| f);
                let mut off = step(day, shift);
                for _ in 0..CALENDAR_HORIZON_DAYS {
                    let Some(o) = off.filter(|o| !calendar.contains(*o)) else { break };
                    if let Some(f) = self.first_moved(o, day, zone, t, (day == t_local.date()).then_some(t_local)) {
                        best = Some(best.map_or(f, |b: DateTime<Utc>| b.min(f)));
                    }
                    off = step(o, shift);
                }
                if best.is_some() {
                    return best;
                }
            }
            day = day.succ_opt()?;
        }
        None
    }

    /// The first fire by rule on local `day` after `t` (and its local time).
    fn first_on_day(&self, day: NaiveDate, zone: Tz, t: DateTime<Utc>) -> Option<(DateTime<Utc>, NaiveDateTime)> {
        let from = last_instant_of(day.pred_opt()?, zone).max(t);
        let f = self.next_by_rule(from)?;
        let local = f.with_timezone(&zone).naive_local();
        (local.date() == day).then_some((f, local))
    }

    /// The earliest fire of day `off` moved to the same local time on `to`, that falls after
    /// `t`. When `to` is `t`'s own day (`t_local`), the fires of `off` before `t`'s local time
    /// of day cannot qualify and are passed over at once (an every-second job stays cheap),
    /// less a margin on a day whose offset changes (a time in its gap fires later than its
    /// wall-clock time says).
    fn first_moved(
        &self,
        off: NaiveDate,
        to: NaiveDate,
        zone: Tz,
        t: DateTime<Utc>,
        t_local: Option<NaiveDateTime>,
    ) -> Option<DateTime<Utc>> {
        let day_start = last_instant_of(off.pred_opt()?, zone);
        let mut from = match t_local {
            Some(tl) => {
                let changes = |d: NaiveDate| {
                    let (a, b) = (last_instant_of(d.pred_opt().unwrap_or(d), zone), last_instant_of(d, zone));
                    zone.offset_from_utc_datetime(&a.naive_utc()).fix() != zone.offset_from_utc_datetime(&b.naive_utc()).fix()
                };
                let margin = if changes(off) || changes(to) { chrono::Duration::hours(3) } else { chrono::Duration::milliseconds(1) };
                local_instant(zone, off.and_time(tl.time())).map_or(day_start, |i| (i - margin).max(day_start))
            }
            None => day_start,
        };
        for _ in 0..MOVED_WALKED {
            let (f, local) = self.first_on_day(off, zone, from)?;
            let moved = local_instant(zone, to.and_time(local.time()))?;
            if moved > t {
                return Some(moved);
            }
            from = f;
        }
        None
    }

    /// The next `n` fire instants after `t`.
    pub fn upcoming(&self, t: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut cur = t;
        while out.len() < n {
            match self.next_after(cur) {
                Some(x) => {
                    out.push(x);
                    cur = x;
                }
                None => break,
            }
        }
        out
    }
}

fn every(spec: &str) -> Result<Duration, ScheduleError> {
    let d = humantime::parse_duration(spec.trim())
        .map_err(|e| ScheduleError(format!("every \"{spec}\" is not a duration ({e}); write e.g. \"90s\", \"15m\"")))?;
    if d < Duration::from_secs(1) {
        return Err(ScheduleError(format!("every \"{spec}\" is shorter than the 1 s minimum")));
    }
    if d > MAX_EVERY {
        return Err(ScheduleError(format!(
            "every \"{spec}\" is longer than the 366-day maximum; for something rarer use cron (e.g. \"0 3 1 1 *\") or at"
        )));
    }
    Ok(d)
}

/// How many days a schedule on a calendar is walked ahead for its next fire: ten years (a
/// calendar with no day in them never fires, as far as previews and the scheduler can tell).
const CALENDAR_HORIZON_DAYS: usize = 3700;

/// The neighbour of `day` whose fires, when it is off the calendar, move onto `day` (or onto
/// the day of the calendar they pass on their way): the day after for `previous`, the day
/// before for `next`.
fn step(day: NaiveDate, shift: Shift) -> Option<NaiveDate> {
    match shift {
        Shift::Previous => day.succ_opt(),
        Shift::Next => day.pred_opt(),
        Shift::Skip => None,
    }
}

/// The day of `calendar` a fire on `day` (a day off it) moves to under `shift`: the nearest
/// day of the calendar before or after, within the horizon. `None` for a skip, or when there
/// is no such day (the fire is then skipped).
fn moved_to(calendar: &Calendar, day: NaiveDate, shift: Shift) -> Option<NaiveDate> {
    let mut d = day;
    for _ in 0..CALENDAR_HORIZON_DAYS {
        d = match shift {
            Shift::Skip => return None,
            Shift::Previous => d.pred_opt()?,
            Shift::Next => d.succ_opt()?,
        };
        if calendar.contains(d) {
            return Some(d);
        }
    }
    None
}

/// Fires of one day walked at most to find the first that moves past an instant: more than
/// an every-second job's day.
const MOVED_WALKED: usize = 100_000;

/// The last millisecond of `day` in `zone`: just before the next day's first instant.
fn last_instant_of(day: NaiveDate, zone: Tz) -> DateTime<Utc> {
    let next = day.succ_opt().unwrap_or(day);
    // A zone whose clocks skip midnight starts the day at the first hour that exists.
    let start = (0..24)
        .filter_map(|h| next.and_hms_opt(h, 0, 0))
        .find_map(|local| zone.from_local_datetime(&local).earliest())
        .map_or_else(|| next.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc(), |t| t.with_timezone(&Utc));
    start - chrono::Duration::milliseconds(1)
}

/// The longest `every`: a year and a day. Longer periods are better said as cron or `at`, and
/// keep every fire-time computation far from integer overflow.
const MAX_EVERY: Duration = Duration::from_secs(366 * 86_400);

fn at(spec: &str) -> Result<DateTime<Utc>, ScheduleError> {
    let t = DateTime::parse_from_rfc3339(spec.trim())
        .map_err(|e| ScheduleError(format!("at \"{spec}\" is not an RFC 3339 instant ({e}); write e.g. \"2026-12-24T18:00:00+01:00\"")))?;
    Ok(t.with_timezone(&Utc))
}

/// The one place a zone name is parsed.
/// A schedule given on its own, not in a config (an assistant checking its translation of "every
/// weekday at 7:30 Berlin time"). An error names the field it is about: `cron`, `every`, `at`
/// or `timezone` (the zone is read for cron only, as in a job).
pub fn parse_alone(spec: ScheduleSpec, tz: &str) -> Result<Schedule, (&'static str, ScheduleError)> {
    let field = spec.field();
    let zone = match &spec {
        ScheduleSpec::Cron(_) => Some(parse_tz(tz).map_err(|e| ("timezone", e))?),
        ScheduleSpec::Every(_) | ScheduleSpec::At(_) => None,
    };
    Schedule::build(spec, &Ok(zone.unwrap_or(Tz::UTC))).map_err(|e| (field, e))
}

/// What a schedule does from an instant on, for a person to check before saving it.
#[derive(Debug, Clone, PartialEq)]
pub struct Preview {
    /// The next fire instants.
    pub fires: Vec<DateTime<Utc>>,
    /// Where those cross a daylight-saving change in the schedule's zone.
    pub notes: Vec<String>,
    /// What looks like a mistake: a schedule that fires very often, or never.
    pub warnings: Vec<String>,
    /// The days its calendar passed a fire over on before the last fire shown, and why:
    /// `2026-12-25 skipped: in calendar "holidays"`, or with a shift `2026-12-25 shifted to
    /// 2026-12-24: in calendar "holidays"`.
    pub skipped: Vec<String>,
}

/// Past this many fires in a day, a preview warns (hourly is 24; `* 7 * * *`, often meant as
/// "at 7", is 60).
const OFTEN: usize = 24;
/// Days passed over that a preview lists at most.
const SKIPPED_SHOWN: usize = 100;
/// Fires counted in a day at most (an every-second schedule is 86,400).
const COUNTED: usize = 10_000;

impl Schedule {
    /// The next `count` fires after `now`, with the daylight-saving changes they cross and a
    /// warning when the schedule fires more than [`OFTEN`] times in the day after its first
    /// fire, or never.
    pub fn preview(&self, now: DateTime<Utc>, count: usize) -> Preview {
        let fires = self.upcoming(now, count);
        let tz = self.tz;
        let mut skipped: Vec<String> = Vec::new();
        if let Some((calendar, _, shift)) = &self.calendar {
            let shift = *shift;
            // The days passed over between now and the last fire shown (or the horizon, for a
            // schedule that never fires on its calendar), each once.
            let end = fires.last().copied();
            let mut cur = now;
            let mut tell = |day: NaiveDate, why: String| {
                let line = match moved_to(calendar, day, shift) {
                    Some(to) => format!("{day} shifted to {to}: {why}"),
                    None => format!("{day} skipped: {why}"),
                };
                if skipped.len() < SKIPPED_SHOWN && skipped.last() != Some(&line) {
                    skipped.push(line);
                }
            };
            while let Some(next) = self.next_on_calendar(cur, &mut tell) {
                if end.is_none_or(|e| next >= e) {
                    break;
                }
                cur = next;
            }
        }
        let offset = |t: &DateTime<Utc>| tz.offset_from_utc_datetime(&t.naive_utc()).fix();
        let mut notes = Vec::new();
        let mut before = offset(&now);
        for f in &fires {
            let after = offset(f);
            if after != before {
                let local = f.with_timezone(&tz).format("%Y-%m-%d %H:%M");
                notes.push(format!("the fire at {local} ({tz}) comes after a daylight-saving change: UTC{before} becomes UTC{after}"));
                before = after;
            }
        }
        let mut warnings = Vec::new();
        match fires.first() {
            None => warnings.push("this schedule never fires after now".to_string()),
            Some(first) => {
                let day = *first + chrono::Duration::days(1);
                let mut n = 1;
                let mut cur = *first;
                while n <= COUNTED {
                    match self.next_after(cur) {
                        Some(t) if t < day => {
                            n += 1;
                            cur = t;
                        }
                        _ => break,
                    }
                }
                if n > OFTEN {
                    let times = if n > COUNTED { format!("more than {}", thousands(COUNTED)) } else { thousands(n) };
                    warnings.push(format!("this fires {times} times a day"));
                }
            }
        }
        Preview { fires, notes, warnings, skipped }
    }
}

/// `n` with a comma every three digits.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An IANA zone name, as a job's `timezone:` reads it (an error says how to write one).
pub fn parse_zone(tz: &str) -> Result<Tz, ScheduleError> {
    parse_tz(tz)
}

pub(crate) fn parse_tz(tz: &str) -> Result<Tz, ScheduleError> {
    Tz::from_str(tz).map_err(|_| {
        let hint = crate::diag::did_you_mean(tz, chrono_tz::TZ_VARIANTS.iter().map(|z| z.name()));
        let hint = if hint.is_empty() { " (e.g. \"Europe/Berlin\", \"UTC\")".to_string() } else { hint };
        ScheduleError(format!("time zone \"{tz}\" is not an IANA zone name{hint}"))
    })
}

/// Translates standard cron to the `cron` crate's 6-field, seconds-first form, and picks the
/// job's DST rule from its seconds, minute and hour fields.
fn parse_cron(expr: &str) -> Result<(Vec<cron::Schedule>, DstRule), ScheduleError> {
    let e = expr.trim();
    let lower = e.to_ascii_lowercase();
    let macro_fields = match lower.as_str() {
        "@yearly" | "@annually" => Some("0 0 0 1 1 *"),
        "@monthly" => Some("0 0 0 1 * *"),
        "@weekly" => Some("0 0 0 * * 0"),
        "@daily" | "@midnight" => Some("0 0 0 * * *"),
        "@hourly" => Some("0 0 * * * *"),
        m if m.starts_with('@') => {
            return Err(ScheduleError(format!(
                "cron macro \"{e}\" is not one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"
            )));
        }
        _ => None,
    };
    let mut fields: Vec<&str> = macro_fields.unwrap_or(e).split_whitespace().collect();
    match fields.len() {
        5 => fields.insert(0, "0"),
        6 => {}
        n => {
            return Err(ScheduleError(format!(
                "cron \"{e}\" has {n} fields; write 5 (minute hour day-of-month month day-of-week), 6 (seconds first) or a macro such as @daily"
            )));
        }
    }
    // fields: seconds minute hour day-of-month month day-of-week (standard numbering).
    // Every field is checked here, so that an error names the field as the user wrote it (the
    // cron crate's own messages show its six-field form and name the ranges wrongly).
    // (Day-of-week is checked as it is translated.)
    for (spec, f) in FIELDS.iter().zip(&fields[..5]) {
        check_field(spec, f).map_err(|m| ScheduleError(format!("cron \"{e}\": {m}")))?;
    }
    let dst = if fields[..3].iter().any(|f| f.starts_with('*')) { DstRule::RealTime } else { DstRule::FirstOccurrence };
    let dow = fields[5].to_string();
    let dom = fields[3];
    let month = translate_names(fields[4], &MONTHS, 1);
    let dow_restricted = !matches!(dow.as_str(), "*" | "?");
    let dom_restricted = !matches!(dom, "*" | "?");
    let dow_t =
        if dow_restricted { translate_dow(&dow).map_err(|m| ScheduleError(format!("cron \"{e}\": {m}")))? } else { "*".to_string() };
    let build = |dom: &str, dow: &str| -> Result<cron::Schedule, ScheduleError> {
        let s = format!("{} {} {} {} {} {}", fields[0], fields[1], fields[2], dom, month, dow);
        cron::Schedule::from_str(&s).map_err(|err| {
            // Not reached for what `check_field` knows; the crate's message is kept to its first
            // line (it goes on with the six-field form and a caret).
            let err = err.to_string();
            let first = err.lines().map(str::trim).rfind(|l| !l.is_empty() && !l.starts_with('^')).unwrap_or("");
            ScheduleError(format!("cron \"{e}\" is not valid: {first}"))
        })
    };
    if dom_restricted && dow_restricted {
        // Standard cron: "1 * * * MON" and "0 0 13 * FRI" fire when either day field matches.
        Ok((vec![build(dom, "*")?, build("*", &dow_t)?], dst))
    } else {
        Ok((vec![build(dom, &dow_t)?], dst))
    }
}

/// One field of a cron expression: its name, its range, and the names it may use.
struct FieldSpec {
    name: &'static str,
    lo: u32,
    hi: u32,
    names: &'static [&'static str],
    /// `?` is allowed (the day fields).
    any: bool,
}

/// The fields before day-of-week, seconds first, as [`parse_cron`] holds them.
const FIELDS: [FieldSpec; 5] = [
    FieldSpec { name: "second", lo: 0, hi: 59, names: &[], any: false },
    FieldSpec { name: "minute", lo: 0, hi: 59, names: &[], any: false },
    FieldSpec { name: "hour", lo: 0, hi: 23, names: &[], any: false },
    FieldSpec { name: "day-of-month", lo: 1, hi: 31, names: &[], any: true },
    FieldSpec { name: "month", lo: 1, hi: 12, names: &MONTHS, any: false },
];

/// Checks one field (`*`, `?`, numbers or names, ranges `a-b`, steps `/n`, lists): the first
/// part out of its range or not a number, named as `minute 61 is out of range 0–59`.
fn check_field(spec: &FieldSpec, field: &str) -> Result<(), String> {
    let FieldSpec { name, lo, hi, .. } = *spec;
    let value = |s: &str| -> Result<u32, String> {
        if let Some(i) = spec.names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(u32::try_from(i).unwrap_or(0) + lo);
        }
        let n: u32 = s.parse().map_err(|_| {
            let names = if spec.names.is_empty() {
                String::new()
            } else {
                format!(" or a name ({}–{})", spec.names[0], spec.names[spec.names.len() - 1])
            };
            format!("{name} \"{s}\" is not a number {lo}–{hi}{names}")
        })?;
        if n < lo || n > hi { Err(format!("{name} {n} is out of range {lo}–{hi}")) } else { Ok(n) }
    };
    for part in field.split(',') {
        if part.is_empty() {
            return Err(format!("{name} \"{field}\" has an empty list item"));
        }
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| format!("{name} step \"{s}\" is not a number"))?;
                if step == 0 {
                    return Err(format!("{name} step must be at least 1"));
                }
                (r, Some(step))
            }
            None => (part, None),
        };
        match range {
            "*" => {}
            "?" if spec.any => {}
            "?" => return Err(format!("{name}: \"?\" is allowed only in the day fields; write \"*\"")),
            r => match r.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (value(a)?, value(b)?);
                    if a > b {
                        return Err(format!("{name} range \"{r}\" runs backwards"));
                    }
                }
                None => {
                    value(r)?;
                }
            },
        }
        if let Some(step) = step
            && step > hi
        {
            return Err(format!("{name} step {step} is larger than the range {lo}–{hi}"));
        }
    }
    Ok(())
}

fn translate_names(field: &str, names: &[&str], base: usize) -> String {
    let mut s = field.to_ascii_uppercase();
    for (i, n) in names.iter().enumerate() {
        s = s.replace(n, &(i + base).to_string());
    }
    s
}

/// Expands a standard day-of-week field (0–7, 0 and 7 = Sunday, names, ranges, steps, lists)
/// into the `cron` crate's form, as names so numbering cannot be confused.
fn translate_dow(field: &str) -> Result<String, String> {
    let f = translate_names(field, &DAYS, 0);
    let mut days = [false; 7];
    for part in f.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<usize>().map_err(|_| format!("day-of-week step \"{s}\" is not a number"))?),
            None => (part, 1),
        };
        if step == 0 {
            return Err("day-of-week step must be at least 1".into());
        }
        let num = |s: &str| -> Result<usize, String> {
            let n: usize = s.parse().map_err(|_| format!("day-of-week \"{s}\" is not 0–7 or a day name (SUN–SAT)"))?;
            if n > 7 { Err(format!("day-of-week {n} is out of range 0–7")) } else { Ok(n) }
        };
        let (lo, hi) = match range {
            "*" | "?" => (0, 6),
            r => match r.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None if step > 1 => (num(r)?, 6),
                None => {
                    let n = num(r)?;
                    (n, n)
                }
            },
        };
        if lo > hi {
            return Err(format!("day-of-week range \"{range}\" runs backwards"));
        }
        for d in (lo..=hi).step_by(step) {
            days[d % 7] = true;
        }
    }
    Ok(days.iter().enumerate().filter(|(_, on)| **on).map(|(i, _)| DAYS[i]).collect::<Vec<_>>().join(","))
}

/// The instant a local wall-clock time of `tz` means for a once-a-day time (RFC 5545 §3.3.5,
/// as non-frequent cron jobs fire): a repeated time its first occurrence, a time in a gap read
/// with the offset before the gap (02:30 → 03:30). A shifted fire and a deadline's `finish_by`
/// are placed by it.
pub fn local_instant(tz: Tz, naive: NaiveDateTime) -> Option<DateTime<Utc>> {
    instants(tz, DstRule::FirstOccurrence, naive).next()
}

/// The instants a local wall-clock time means under `rule`: none (a gap, real time), one, or
/// two (a repeated time, real time).
fn instants(tz: Tz, rule: DstRule, naive: NaiveDateTime) -> impl Iterator<Item = DateTime<Utc>> {
    let (a, b) = match (tz.from_local_datetime(&naive), rule) {
        (LocalResult::Single(t), _) => (Some(t), None),
        (LocalResult::Ambiguous(a, b), DstRule::RealTime) => (Some(a.min(b)), Some(a.max(b))),
        (LocalResult::Ambiguous(a, b), DstRule::FirstOccurrence) => (Some(a.min(b)), None),
        (LocalResult::None, DstRule::RealTime) => (None, None),
        (LocalResult::None, DstRule::FirstOccurrence) => {
            // In a gap: read with the offset in force before it.
            let before = naive - chrono::Duration::hours(3);
            let off = match tz.from_local_datetime(&before) {
                LocalResult::Single(t) => t.offset().fix(),
                LocalResult::Ambiguous(a, _) => a.offset().fix(),
                LocalResult::None => tz.offset_from_utc_datetime(&before).fix(),
            };
            return [Some(Utc.from_utc_datetime(&(naive - chrono::Duration::seconds(off.local_minus_utc() as i64)))), None]
                .into_iter()
                .flatten();
        }
    };
    [a.map(|t| t.with_timezone(&Utc)), b.map(|t| t.with_timezone(&Utc))].into_iter().flatten()
}

/// The first fire instant of `s` strictly after `t`. Offset changes are under 3 h and never
/// closer than 3 h apart, which bounds how far wall-clock order and instant order can differ.
fn next_cron(s: &cron::Schedule, rule: DstRule, tz: Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let as_utc = |n: NaiveDateTime| Utc.from_utc_datetime(&n);
    let off = |x: DateTime<Utc>| tz.offset_from_utc_datetime(&x.naive_utc()).fix().local_minus_utc();
    let margin = chrono::Duration::hours(3);
    let steady = |x: DateTime<Utc>| off(x - margin) == off(x + margin);
    let local_now = t.naive_utc() + chrono::Duration::seconds(off(t).into());
    // Fast path: no offset change near `t` or near the candidate, so between them wall-clock
    // order is instant order and the first wall-clock match is the answer.
    let first = s.after(&as_utc(local_now)).next()?.naive_utc();
    if steady(t)
        && let Some(inst) = instants(tz, rule, first).next()
        && inst > t
        && steady(inst)
    {
        return Some(inst);
    }
    // Near a change: walk wall-clock candidates from the earliest one that can map past `t`
    // (read with the smaller of the offsets around it) and keep the earliest instant after `t`;
    // stop once wall-clock time is past the best so far by more than any change.
    let low = off(t - margin).min(off(t + margin));
    let from = t.naive_utc() + chrono::Duration::seconds(low.into()) - chrono::Duration::seconds(1);
    let mut best: Option<DateTime<Utc>> = None;
    for cand in s.after(&as_utc(from)).map(|c| c.naive_utc()) {
        if let Some(b) = best
            && cand > b.naive_utc() + chrono::Duration::seconds(off(b).into()) + margin
        {
            break;
        }
        for i in instants(tz, rule, cand) {
            if i > t && best.is_none_or(|b| i < b) {
                best = Some(i);
            }
        }
        // A schedule whose only dates are far off (29 February) still ends the walk.
        if cand > local_now + chrono::Duration::days(366 * 9) {
            break;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_schedule_alone_names_the_field_it_is_wrong_in() {
        let field = |spec, tz| parse_alone(spec, tz).err().map(|(f, _)| f);
        assert_eq!(field(ScheduleSpec::Cron("0 7 * * 1-5".into()), "Europe/Berlin"), None);
        assert_eq!(field(ScheduleSpec::Cron("0 7 * *".into()), "Europe/Berlin"), Some("cron"));
        assert_eq!(field(ScheduleSpec::Cron("0 7 * * *".into()), "Europe/Bärlin"), Some("timezone"));
        assert_eq!(field(ScheduleSpec::Every("soon".into()), "Nowhere/At All"), Some("every"), "every ignores the zone");
        assert_eq!(field(ScheduleSpec::At("tomorrow".into()), "UTC"), Some("at"));
        let (_, e) = parse_alone(ScheduleSpec::Cron("0 7 * * *".into()), "Berlin").unwrap_err();
        assert!(e.to_string().contains("IANA zone"), "{e}");
    }

    #[test]
    fn a_preview_shows_fires_dst_changes_and_warnings() {
        // Weekdays at 7:30 in Berlin, from the Friday before the spring change (2026-03-29).
        let s = parse_alone(ScheduleSpec::Cron("30 7 * * 1-5".into()), "Europe/Berlin").unwrap();
        let p = s.preview(at_utc("2026-03-27T00:00:00Z"), 3);
        let fires: Vec<String> = p.fires.iter().map(|t| t.to_rfc3339()).collect();
        assert_eq!(fires, ["2026-03-27T06:30:00+00:00", "2026-03-30T05:30:00+00:00", "2026-03-31T05:30:00+00:00"]);
        assert_eq!(
            p.notes,
            ["the fire at 2026-03-30 07:30 (Europe/Berlin) comes after a daylight-saving change: UTC+01:00 becomes UTC+02:00"]
        );
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);

        let every_minute_at_7 = parse_alone(ScheduleSpec::Cron("* 7 * * *".into()), "UTC").unwrap();
        assert_eq!(every_minute_at_7.preview(at_utc("2026-03-27T00:00:00Z"), 2).warnings, ["this fires 60 times a day"]);
        let minutely = parse_alone(ScheduleSpec::Every("1m".into()), "UTC").unwrap();
        assert_eq!(minutely.preview(at_utc("2026-03-27T00:00:00Z"), 1).warnings, ["this fires 1,440 times a day"]);
        let secondly = parse_alone(ScheduleSpec::Every("1s".into()), "UTC").unwrap();
        assert_eq!(secondly.preview(at_utc("2026-03-27T00:00:00Z"), 1).warnings, ["this fires more than 10,000 times a day"]);
        let hourly = parse_alone(ScheduleSpec::Cron("0 * * * *".into()), "UTC").unwrap();
        assert!(hourly.preview(at_utc("2026-03-27T00:00:00Z"), 1).warnings.is_empty(), "hourly is 24 a day");
        let past = parse_alone(ScheduleSpec::At("2020-01-01T00:00:00Z".into()), "UTC").unwrap();
        let p = past.preview(at_utc("2026-03-27T00:00:00Z"), 5);
        assert_eq!((p.fires.len(), p.warnings.as_slice()), (0, ["this schedule never fires after now".to_string()].as_slice()));
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn next(expr: &str, tz: &str, after: &str) -> String {
        Schedule::cron(expr, tz).unwrap().next_after(utc(after)).unwrap().to_rfc3339()
    }

    /// Found by the `schedule` fuzz target: `every` of 22,222,222,222 weeks overflowed the
    /// next-fire arithmetic. Periods are capped at 366 days, with a message that says so.
    #[test]
    fn every_has_a_maximum_and_the_longest_allowed_period_computes() {
        let e = Schedule::every("444ms22222222222w").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("366-day maximum"), "{e}");
        assert!(Schedule::every("367d").is_err());
        let s = Schedule::every("366d").unwrap();
        let t = DateTime::parse_from_rfc3339("2262-04-01T00:00:00Z").unwrap().with_timezone(&Utc);
        let next = s.next_after(t).unwrap();
        assert!(next > t && next - t <= chrono::Duration::days(366), "{next}");
    }

    #[test]
    fn a_remembered_next_fire_is_the_one_computed_afresh() {
        // Instants in every order (forwards, backwards, on a fire, just before one, across
        // Berlin's autumn hour): the remembered answer must be the fresh one (a clone starts
        // with nothing remembered).
        for (expr, tz) in [("30 2 * * *", "Europe/Berlin"), ("*/15 * * * *", "Europe/Berlin"), ("0 0 29 2 *", "UTC")] {
            let s = Schedule::cron(expr, tz).unwrap();
            let base = utc("2026-10-24T00:00:00Z");
            let offsets_s: [i64; 12] = [0, 60, 59, 3600, 90_000, 86_399, 86_400, 1, 172_800, 100, 900, 899];
            for (i, o) in offsets_s.iter().enumerate() {
                let t = base + chrono::Duration::seconds(*o) + chrono::Duration::milliseconds(i as i64 * 7);
                assert_eq!(s.next_after(t), s.clone().next_after(t), "{expr} in {tz} after {t}");
                let on_fire = s.next_after(t).unwrap();
                assert_eq!(s.next_after(on_fire), s.clone().next_after(on_fire), "{expr}: strictly after a fire");
                let just_before = on_fire - chrono::Duration::milliseconds(1);
                assert_eq!(s.next_after(just_before), Some(on_fire), "{expr}: just before a fire");
            }
        }
    }

    /// Business days in 2026/27 less a few holidays.
    fn business() -> Arc<Calendar> {
        use crate::calendar::{Written, resolve};
        let (wd, hd, none) = (
            vec!["mon..fri".to_string()],
            vec!["2026-12-24..2026-12-26".to_string(), "2027-01-01".into(), "2026-03-27".into()],
            Vec::new(),
        );
        let ex = vec!["holidays".to_string()];
        let written = std::collections::BTreeMap::from([
            ("business".to_string(), Written { weekdays: &wd, dates: &none, except: &ex, ics: None }),
            ("holidays".to_string(), Written { weekdays: &none, dates: &hd, except: &none, ics: None }),
        ]);
        resolve(&written).0["business"].clone()
    }

    #[test]
    fn shifted_fires_are_the_rule_fires_moved_to_the_calendars_days_each_instant_once() {
        // An oracle by brute force: every fire by rule over the window and beyond, each on a
        // day off the calendar moved to the same local time of the calendar's day before or
        // after, as a set (one instant fires once).
        let cal = business();
        for (expr, tz) in [
            ("30 6 * * *", "Europe/Berlin"),
            ("0 9 25 * *", "Europe/Berlin"),
            ("0 23 * * 6", "America/New_York"),
            ("*/20 * * * *", "Europe/Berlin"),
            ("30 2 * * *", "Europe/Berlin"),
        ] {
            let zone: Tz = tz.parse().unwrap();
            let rule = Schedule::cron(expr, tz).unwrap();
            for shift in [Shift::Previous, Shift::Next] {
                let s = rule.clone().on_calendar(cal.clone(), zone, shift);
                for (from, to) in [("2026-12-10T00:00:00Z", "2027-01-12T00:00:00Z"), ("2026-03-15T00:00:00Z", "2026-04-10T00:00:00Z")] {
                    let (from, to) = (utc(from), utc(to));
                    let mut expected = std::collections::BTreeSet::new();
                    let mut cur = from - chrono::Duration::days(20);
                    while let Some(f) = rule.next_after(cur).filter(|f| *f < to + chrono::Duration::days(20)) {
                        let local = f.with_timezone(&zone).naive_local();
                        let day = if cal.contains(local.date()) { Some(local.date()) } else { moved_to(&cal, local.date(), shift) };
                        if let Some(day) = day {
                            expected.insert(local_instant(zone, day.and_time(local.time())).unwrap());
                        }
                        cur = f;
                    }
                    // From many instants, mid-day ones included: the next fire is the first of
                    // the set after it.
                    let mut t = from;
                    while t < to - chrono::Duration::days(3) {
                        let want = expected.range((std::ops::Bound::Excluded(t), std::ops::Bound::Unbounded)).next().copied();
                        assert_eq!(s.clone().next_after(t), want, "{expr} in {tz}, shift {shift:?}, after {t}");
                        t += chrono::Duration::minutes(if expr.starts_with('*') { 1301 } else { 433 });
                    }
                    for f in s.upcoming(from, 30) {
                        let day = f.with_timezone(&zone).date_naive();
                        assert!(cal.contains(day), "{expr} {shift:?}: fires only on the calendar's days, not {day}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_shifted_payroll_fires_once_a_month_on_the_business_day_before_the_25th() {
        let cal = business();
        let zone: Tz = "Europe/Berlin".parse().unwrap();
        let s = Schedule::cron("0 9 25 * *", "Europe/Berlin").unwrap().on_calendar(cal.clone(), zone, Shift::Previous);
        let fires: Vec<String> = s
            .upcoming(utc("2026-09-30T00:00:00Z"), 5)
            .iter()
            .map(|f| f.with_timezone(&zone).format("%a %Y-%m-%d %H:%M").to_string())
            .collect();
        // 25 Oct 2026 is a Sunday, 25 Dec a holiday (so are 24 Dec and the weekend before).
        assert_eq!(
            fires,
            ["Fri 2026-10-23 09:00", "Wed 2026-11-25 09:00", "Wed 2026-12-23 09:00", "Mon 2027-01-25 09:00", "Thu 2027-02-25 09:00"]
        );
        let p = s.preview(utc("2026-12-01T00:00:00Z"), 2);
        assert_eq!(p.skipped, ["2026-12-25 shifted to 2026-12-23: in calendar \"holidays\""]);
        // A daily job with shift next: the weekend's two fires and Monday's own are one fire.
        let daily = Schedule::cron("30 6 * * *", "Europe/Berlin").unwrap().on_calendar(cal, zone, Shift::Next);
        let fires: Vec<String> = daily
            .upcoming(utc("2026-12-04T12:00:00Z"), 3)
            .iter()
            .map(|f| f.with_timezone(&zone).format("%a %d %H:%M").to_string())
            .collect();
        assert_eq!(fires, ["Mon 07 06:30", "Tue 08 06:30", "Wed 09 06:30"]);
        let p = daily.preview(utc("2026-12-04T12:00:00Z"), 2);
        assert_eq!(
            p.skipped,
            [
                "2026-12-05 shifted to 2026-12-07: not a day of calendar \"business\" (Saturday)",
                "2026-12-06 shifted to 2026-12-07: not a day of calendar \"business\" (Sunday)"
            ]
        );
    }

    fn local(expr: &str, tz: &str, after: &str, n: usize) -> Vec<String> {
        let s = Schedule::cron(expr, tz).unwrap();
        let z = s.timezone();
        s.upcoming(utc(after), n).iter().map(|t| t.with_timezone(&z).to_rfc3339()).collect()
    }

    #[test]
    fn five_fields_get_seconds() {
        assert_eq!(next("0 2 * * *", "UTC", "2026-01-01T00:00:00Z"), "2026-01-01T02:00:00+00:00");
        assert_eq!(next("*/15 * * * *", "UTC", "2026-01-01T00:07:00Z"), "2026-01-01T00:15:00+00:00");
    }

    #[test]
    fn six_fields_have_seconds_first() {
        assert_eq!(next("30 0 2 * * *", "UTC", "2026-01-01T00:00:00Z"), "2026-01-01T02:00:30+00:00");
        assert_eq!(next("*/5 * * * * *", "UTC", "2026-01-01T00:00:01Z"), "2026-01-01T00:00:05+00:00");
    }

    #[test]
    fn day_of_week_uses_standard_numbering() {
        // 2026-01-01 is a Thursday.
        let cases = [
            ("0 9 * * 0", "2026-01-04T09:00:00+00:00"), // Sunday
            ("0 9 * * 7", "2026-01-04T09:00:00+00:00"), // Sunday too
            ("0 9 * * 1", "2026-01-05T09:00:00+00:00"), // Monday
            ("0 9 * * 5", "2026-01-02T09:00:00+00:00"), // Friday
            ("0 9 * * 6", "2026-01-03T09:00:00+00:00"), // Saturday
            ("0 9 * * sun", "2026-01-04T09:00:00+00:00"),
            ("0 9 * * MON-FRI", "2026-01-01T09:00:00+00:00"),
            ("0 9 * * 1-5", "2026-01-01T09:00:00+00:00"),
            ("0 9 * * 6,0", "2026-01-03T09:00:00+00:00"),
            ("0 9 * * 5-7", "2026-01-02T09:00:00+00:00"),
            ("0 9 * * */3", "2026-01-03T09:00:00+00:00"), // Sun, Wed, Sat
        ];
        for (expr, want) in cases {
            assert_eq!(next(expr, "UTC", "2026-01-01T00:00:00Z"), want, "{expr}");
        }
    }

    #[test]
    fn weekday_list_over_a_week() {
        let days: Vec<String> = local("0 9 * * 1-5", "UTC", "2026-01-03T00:00:00Z", 5).iter().map(|s| s[..10].to_string()).collect();
        assert_eq!(days, ["2026-01-05", "2026-01-06", "2026-01-07", "2026-01-08", "2026-01-09"]);
    }

    #[test]
    fn day_of_month_or_day_of_week() {
        // Standard cron: the 13th OR any Friday.
        let got = local("0 0 13 * 5", "UTC", "2026-02-01T00:00:00Z", 4);
        assert_eq!(
            got,
            ["2026-02-06T00:00:00+00:00", "2026-02-13T00:00:00+00:00", "2026-02-20T00:00:00+00:00", "2026-02-27T00:00:00+00:00"]
        );
        let got = local("0 0 10 * 1", "UTC", "2026-02-01T00:00:00Z", 3);
        assert_eq!(got, ["2026-02-02T00:00:00+00:00", "2026-02-09T00:00:00+00:00", "2026-02-10T00:00:00+00:00"]);
    }

    #[test]
    fn macros() {
        let a = "2026-03-15T10:20:00Z";
        assert_eq!(next("@hourly", "UTC", a), "2026-03-15T11:00:00+00:00");
        assert_eq!(next("@daily", "UTC", a), "2026-03-16T00:00:00+00:00");
        assert_eq!(next("@midnight", "UTC", a), "2026-03-16T00:00:00+00:00");
        assert_eq!(next("@weekly", "UTC", a), "2026-03-22T00:00:00+00:00"); // a Sunday
        assert_eq!(next("@monthly", "UTC", a), "2026-04-01T00:00:00+00:00");
        assert_eq!(next("@yearly", "UTC", a), "2027-01-01T00:00:00+00:00");
        assert_eq!(next("@annually", "UTC", a), "2027-01-01T00:00:00+00:00");
    }

    #[test]
    fn bad_expressions_say_how_to_fix() {
        for (e, want) in [
            ("0 2 * *", "has 4 fields"),
            ("@fortnightly", "not one of @yearly"),
            ("0 25 * * *", "hour 25 is out of range 0–23"),
            ("61 * * * *", "minute 61 is out of range 0–59"),
            ("0 0 32 * *", "day-of-month 32 is out of range 1–31"),
            ("0 0 0 * *", "day-of-month 0 is out of range 1–31"),
            ("0 0 * 13 *", "month 13 is out of range 1–12"),
            ("0 0 * FOO *", "month \"FOO\" is not a number 1–12 or a name (JAN–DEC)"),
            ("60 0 0 * * *", "second 60 is out of range 0–59"),
            ("x * * * *", "minute \"x\" is not a number 0–59"),
            ("0 5-2 * * *", "hour range \"5-2\" runs backwards"),
            ("*/0 * * * *", "minute step must be at least 1"),
            ("0 ? * * *", "allowed only in the day fields"),
            ("0 2 * * 8", "out of range 0–7"),
            ("0 2 * * FUNDAY", "not 0–7 or a day name"),
            ("0 2 * * 5-1", "runs backwards"),
        ] {
            let err = Schedule::cron(e, "UTC").unwrap_err().to_string();
            assert!(err.contains(want), "{e}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        // The edges of each range are valid, and so are names, steps and lists.
        for ok in ["59 23 31 12 7", "0 0 1 1 0", "59 59 23 31 12 SAT", "*/59 0-23/2 1,15,31 JAN-DEC MON-FRI", "0 0 ? * MON", "0 0 L * *"] {
            if ok.contains('L') {
                assert!(Schedule::cron(ok, "UTC").unwrap_err().to_string().contains("day-of-month \"L\" is not a number"));
            } else {
                assert!(Schedule::cron(ok, "UTC").is_ok(), "{ok}");
            }
        }
        assert!(Schedule::cron("0 2 * * *", "Mars/Olympus").unwrap_err().to_string().contains("IANA"));
        assert_eq!(
            Schedule::cron("0 2 * * *", "Europe/Berln").unwrap_err().to_string(),
            "time zone \"Europe/Berln\" is not an IANA zone name (did you mean \"Europe/Berlin\"?)"
        );
        assert!(Schedule::every("soon").is_err());
        assert!(Schedule::every("10ms").is_err());
        assert!(Schedule::at("tomorrow").is_err());
    }

    #[test]
    fn berlin_spring_forward_gap_fires_after_the_gap() {
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST. 02:30 does not exist: fires at 03:30 CEST.
        assert_eq!(
            local("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 3),
            ["2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00",]
        );
        // 02:30 (→ 03:30) and 03:30 land on the same instant: fired once.
        let s = Schedule::cron("30 2,3 * * *", "Europe/Berlin").unwrap();
        let got: Vec<String> =
            s.upcoming(utc("2026-03-28T23:00:00Z"), 2).iter().map(|t| t.with_timezone(&s.timezone()).to_rfc3339()).collect();
        assert_eq!(got, ["2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00"]);
    }

    #[test]
    fn berlin_fall_back_fires_fixed_times_once_and_frequent_jobs_in_both_passes() {
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
        assert_eq!(
            local("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
        );
        // An hourly job runs at every real hour: the repeated 02:00 hour in both passes.
        let got = local("0 * * * *", "Europe/Berlin", "2026-10-24T22:30:00Z", 4);
        assert_eq!(
            got,
            ["2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00"]
        );
    }

    #[test]
    fn every_fifteen_minutes_keeps_going_through_the_repeated_hour() {
        // Issue 8: the worker listed 00:45 then 02:00 UTC, 75 real minutes without a run.
        let s = Schedule::cron("*/15 * * * *", "Europe/Berlin").unwrap();
        let got: Vec<String> = s.upcoming(utc("2026-10-24T23:50:00Z"), 10).iter().map(|t| t.format("%H:%M").to_string()).collect();
        assert_eq!(got, ["00:00", "00:15", "00:30", "00:45", "01:00", "01:15", "01:30", "01:45", "02:00", "02:15"]);
    }

    #[test]
    fn a_leap_day_schedule_is_found_from_near_a_dst_change() {
        // The slow path near a change walks wall-clock candidates; a sparse schedule must not
        // run out of walk before its next date.
        let s = Schedule::cron("0 12 29 2 *", "Europe/Berlin").unwrap();
        assert_eq!(s.next_after(utc("2026-03-29T01:00:00Z")), Some(utc("2028-02-29T11:00:00Z")));
    }

    #[test]
    fn new_york_spring_and_fall() {
        // 2026-03-08 02:00 EST → 03:00 EDT.
        assert_eq!(
            local("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 2),
            ["2026-03-08T03:30:00-04:00", "2026-03-09T02:30:00-04:00"]
        );
        // 2026-11-01 02:00 EDT → 01:00 EST; 01:30 happens twice, fired at the first.
        assert_eq!(
            local("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2),
            ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]
        );
    }

    #[test]
    fn southern_hemisphere_and_half_hour_zones() {
        // Sydney: 2026-10-04 02:00 AEST → 03:00 AEDT.
        assert_eq!(local("15 2 * * *", "Australia/Sydney", "2026-10-03T00:00:00Z", 1), ["2026-10-04T03:15:00+11:00"]);
        // Lord Howe moves by 30 minutes: 02:00 → 02:30 on 2026-10-04.
        assert_eq!(local("15 2 * * *", "Australia/Lord_Howe", "2026-10-03T00:00:00Z", 1), ["2026-10-04T02:45:00+11:00"]);
    }

    #[test]
    fn every_is_epoch_aligned() {
        let s = Schedule::every("90s").unwrap();
        assert_eq!(s.next_after(utc("1970-01-01T00:00:00Z")).unwrap(), utc("1970-01-01T00:01:30Z"));
        let t = utc("2026-05-05T10:00:01Z");
        let n = s.next_after(t).unwrap();
        assert_eq!(n.timestamp() % 90, 0);
        assert!(n > t && n - t <= chrono::Duration::seconds(90));
    }

    #[test]
    fn at_fires_once() {
        let s = Schedule::at("2026-12-24T18:00:00+01:00").unwrap();
        assert_eq!(s.next_after(utc("2026-01-01T00:00:00Z")), Some(utc("2026-12-24T17:00:00Z")));
        assert_eq!(s.next_after(utc("2026-12-24T17:00:00Z")), None);
    }
}
