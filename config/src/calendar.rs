//! Calendars (SPEC §4a): named sets of days a job fires on, in the job's zone.
//!
//! A calendar's own days are the union of its `weekdays`, its `dates` and the days of its
//! `ics` file (every day when it has none of them); a day of any calendar it names under
//! `except` is not one of its days. A
//! job's `calendar:` keeps the fires of its schedule whose local day is in the calendar.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{Datelike, NaiveDate, Weekday};

/// An inclusive range of days.
type DayRange = (NaiveDate, NaiveDate);

/// One calendar, with the calendars it excepts resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    name: String,
    /// A bit per weekday, Monday the lowest.
    weekdays: u8,
    /// Inclusive ranges of days.
    dates: Vec<DayRange>,
    /// The days of its iCalendar file, with the summary of the event on each.
    ics: Option<Arc<BTreeMap<NaiveDate, String>>>,
    except: Vec<Arc<Calendar>>,
}

impl Calendar {
    /// The calendar's name in `scheduling.calendars`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether `day` is a day of the calendar.
    pub fn contains(&self, day: NaiveDate) -> bool {
        self.why_not(day).is_none()
    }

    /// Why `day` is not a day of the calendar, for a person reading a preview: `not a day of
    /// calendar "business" (Saturday)`, or `in calendar "holidays"`; `None` when it is one.
    pub fn why_not(&self, day: NaiveDate) -> Option<String> {
        if !self.own(day) {
            return Some(format!("not a day of calendar \"{}\" ({})", self.name, weekday_name(day.weekday())));
        }
        self.except.iter().find(|e| e.contains(day)).map(|e| match e.event_on(day) {
            Some(summary) => format!("in calendar \"{}\" ({summary})", e.name),
            None => format!("in calendar \"{}\"", e.name),
        })
    }

    /// The summary of the iCalendar event that makes `day` one of its days, if one does.
    fn event_on(&self, day: NaiveDate) -> Option<&str> {
        self.ics.as_ref()?.get(&day).map(String::as_str).filter(|s| !s.is_empty())
    }

    fn own(&self, day: NaiveDate) -> bool {
        if self.weekdays == 0 && self.dates.is_empty() && self.ics.is_none() {
            return true;
        }
        self.weekdays & (1 << day.weekday().num_days_from_monday()) != 0
            || self.dates.iter().any(|(a, b)| *a <= day && day <= *b)
            || self.ics.as_ref().is_some_and(|d| d.contains_key(&day))
    }
}

/// A calendar as written: its weekdays, dates and ranges, and the calendars it excepts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Written<'a> {
    pub(crate) weekdays: &'a [String],
    pub(crate) dates: &'a [String],
    pub(crate) except: &'a [String],
    /// The days of its `ics` file, read.
    pub(crate) ics: Option<Arc<BTreeMap<NaiveDate, String>>>,
}

/// A problem with one calendar: the field it is about (`weekdays`, `dates`, `except`, with
/// the entry's index where it is one entry) and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) calendar: String,
    pub(crate) field: Vec<String>,
    pub(crate) message: String,
}

/// Every calendar of `written` resolved, and every problem found (a calendar with one is left
/// out, and so is any that excepts it).
pub(crate) fn resolve(written: &BTreeMap<String, Written<'_>>) -> (BTreeMap<String, Arc<Calendar>>, Vec<Problem>) {
    let mut problems = Vec::new();
    type Own = (u8, Vec<DayRange>, Option<Arc<BTreeMap<NaiveDate, String>>>);
    let mut own: BTreeMap<&str, Own> = BTreeMap::new();
    for (name, w) in written {
        let problem = |field: &str, i: usize, message: String| Problem {
            calendar: name.clone(),
            field: vec![field.to_string(), i.to_string()],
            message: format!("calendar \"{name}\": {message}"),
        };
        let mut ok = true;
        let mut weekdays = 0u8;
        for (i, w) in w.weekdays.iter().enumerate() {
            match weekday_set(w) {
                Ok(days) => weekdays |= days,
                Err(e) => {
                    problems.push(problem("weekdays", i, e));
                    ok = false;
                }
            }
        }
        let mut dates = Vec::new();
        for (i, d) in w.dates.iter().enumerate() {
            match date_range(d) {
                Ok(range) => dates.push(range),
                Err(e) => {
                    problems.push(problem("dates", i, e));
                    ok = false;
                }
            }
        }
        for (i, e) in w.except.iter().enumerate() {
            if !written.contains_key(e) {
                let hint = crate::diag::did_you_mean(e, written.keys().map(String::as_str));
                problems.push(problem("except", i, format!("excepts calendar \"{e}\", which scheduling.calendars does not define{hint}")));
                ok = false;
            } else if e == name {
                problems.push(problem("except", i, "excepts itself".to_string()));
                ok = false;
            }
        }
        if ok {
            own.insert(name, (weekdays, dates, w.ics.clone()));
        }
    }
    // Resolved in dependency order; what is left unresolved after that is a cycle or depends
    // on a calendar with a problem.
    let mut done: BTreeMap<String, Arc<Calendar>> = BTreeMap::new();
    loop {
        let ready: Vec<&str> =
            own.keys().copied().filter(|n| !done.contains_key(*n) && written[*n].except.iter().all(|e| done.contains_key(e))).collect();
        if ready.is_empty() {
            break;
        }
        for name in ready {
            let (weekdays, dates, ics) = own[name].clone();
            let except = written[name].except.iter().map(|e| done[e].clone()).collect();
            done.insert(name.to_string(), Arc::new(Calendar { name: name.to_string(), weekdays, dates, ics, except }));
        }
    }
    for name in own.keys().filter(|n| !done.contains_key(**n)) {
        if let Some(cycle) = cycle_from(name, written) {
            problems.push(Problem {
                calendar: name.to_string(),
                field: vec!["except".into()],
                message: format!(
                    "calendar \"{name}\": its except makes a cycle ({}); a calendar cannot except itself through others",
                    cycle.join(" → ")
                ),
            });
        }
    }
    (done, problems)
}

/// The cycle of `except` through `start`, if there is one: `a → b → a`.
fn cycle_from(start: &str, written: &BTreeMap<String, Written<'_>>) -> Option<Vec<String>> {
    fn walk(at: &str, start: &str, written: &BTreeMap<String, Written<'_>>, path: &mut Vec<String>) -> bool {
        for e in written.get(at).map_or(&[][..], |w| w.except) {
            if e == start {
                path.push(e.clone());
                return true;
            }
            if path.contains(e) || !written.contains_key(e) {
                continue;
            }
            path.push(e.clone());
            if walk(e, start, written, path) {
                return true;
            }
            path.pop();
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(start, start, written, &mut path).then_some(path)
}

const WEEKDAYS: [(&str, &str, Weekday); 7] = [
    ("mon", "monday", Weekday::Mon),
    ("tue", "tuesday", Weekday::Tue),
    ("wed", "wednesday", Weekday::Wed),
    ("thu", "thursday", Weekday::Thu),
    ("fri", "friday", Weekday::Fri),
    ("sat", "saturday", Weekday::Sat),
    ("sun", "sunday", Weekday::Sun),
];

fn weekday_name(d: Weekday) -> &'static str {
    ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"][d.num_days_from_monday() as usize]
}

fn weekday(text: &str) -> Result<Weekday, String> {
    let t = text.trim().to_ascii_lowercase();
    WEEKDAYS.iter().find(|(short, long, _)| t == *short || t == *long).map(|(.., d)| *d).ok_or_else(|| {
        format!("weekday \"{text}\" is not a day of the week; write mon, tue, wed, thu, fri, sat or sun (or a range such as \"mon..fri\")")
    })
}

/// `mon`, or an inclusive range `mon..fri` (which may wrap: `fri..mon`), as a bit set.
fn weekday_set(text: &str) -> Result<u8, String> {
    let bit = |d: Weekday| 1u8 << d.num_days_from_monday();
    match text.split_once("..") {
        None => weekday(text).map(bit),
        Some((a, b)) => {
            let (mut d, last) = (weekday(a)?, weekday(b)?);
            let mut set = bit(d);
            while d != last {
                d = d.succ();
                set |= bit(d);
            }
            Ok(set)
        }
    }
}

fn date(text: &str) -> Result<NaiveDate, String> {
    NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d")
        .map_err(|e| format!("date \"{}\" is not a day ({e}); write e.g. \"2026-12-24\"", text.trim()))
}

/// `2026-12-24`, or an inclusive range `2027-04-01..2027-04-02`.
fn date_range(text: &str) -> Result<DayRange, String> {
    match text.split_once("..") {
        None => date(text).map(|d| (d, d)),
        Some((a, b)) => {
            let (a, b) = (date(a)?, date(b)?);
            if b < a {
                return Err(format!("the range \"{text}\" ends before it starts; write the earlier day first"));
            }
            Ok((a, b))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn business_days_except_holidays() {
        let (wd, hd, none) = (strings(&["mon..fri"]), strings(&["2026-12-24..2026-12-26", "2027-01-01"]), Vec::new());
        let ex = strings(&["holidays"]);
        let written = BTreeMap::from([
            ("business".to_string(), Written { weekdays: &wd, dates: &none, except: &ex, ics: None }),
            ("holidays".to_string(), Written { weekdays: &none, dates: &hd, except: &none, ics: None }),
            ("always".to_string(), Written::default()),
        ]);
        let (cals, problems) = resolve(&written);
        assert!(problems.is_empty(), "{problems:?}");
        let b = &cals["business"];
        assert!(b.contains(day("2026-12-23")), "a Wednesday");
        assert_eq!(b.why_not(day("2026-12-24")).as_deref(), Some("in calendar \"holidays\""));
        assert_eq!(b.why_not(day("2026-12-27")).as_deref(), Some("not a day of calendar \"business\" (Sunday)"));
        assert!(!b.contains(day("2027-01-01")) && b.contains(day("2027-01-04")));
        assert!(cals["always"].contains(day("2026-12-27")), "no weekdays and no dates: every day");
        assert!(cals["holidays"].contains(day("2026-12-25")) && !cals["holidays"].contains(day("2026-12-27")));
    }

    #[test]
    fn wrapping_weekday_ranges_and_full_names() {
        assert_eq!(weekday_set("fri..mon"), Ok(0b1110001));
        assert_eq!(weekday_set("Saturday"), Ok(0b0100000));
        assert!(weekday_set("funday").unwrap_err().contains("write mon, tue"));
    }

    #[test]
    fn bad_entries_unknown_and_cyclic_excepts_are_told_each() {
        let (bad_day, bad_range, none) = (strings(&["mon", "someday"]), strings(&["2026-02-30", "2026-12-31..2026-01-01"]), Vec::new());
        let (to_b, to_a, typo) = (strings(&["b"]), strings(&["a"]), strings(&["holiday"]));
        let written = BTreeMap::from([
            ("a".to_string(), Written { weekdays: &none, dates: &none, except: &to_b, ics: None }),
            ("b".to_string(), Written { weekdays: &none, dates: &none, except: &to_a, ics: None }),
            ("c".to_string(), Written { weekdays: &bad_day, dates: &bad_range, except: &typo, ics: None }),
            ("holidays".to_string(), Written::default()),
        ]);
        let (cals, problems) = resolve(&written);
        assert_eq!(cals.keys().collect::<Vec<_>>(), ["holidays"]);
        let told: Vec<(String, String)> = problems.iter().map(|p| (p.field.join("."), p.message.clone())).collect();
        assert_eq!(told.len(), 6, "{told:#?}");
        assert!(told.contains(&("weekdays.1".into(), "calendar \"c\": weekday \"someday\" is not a day of the week; write mon, tue, wed, thu, fri, sat or sun (or a range such as \"mon..fri\")".into())));
        assert!(told.iter().any(|(f, m)| f == "dates.0" && m.contains("\"2026-02-30\" is not a day")));
        assert!(told.iter().any(|(f, m)| f == "dates.1" && m.contains("ends before it starts")));
        assert!(
            told.iter().any(|(f, m)| f == "except.0" && m.contains("\"holiday\"") && m.contains("did you mean \"holidays\"")),
            "{told:#?}"
        );
        assert!(told.contains(&(
            "except".into(),
            "calendar \"a\": its except makes a cycle (a → b → a); a calendar cannot except itself through others".into()
        )));
        assert!(told.iter().any(|(f, m)| f == "except" && m.contains("(b → a → b)")));
    }
}
