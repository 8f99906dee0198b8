//! The days of an iCalendar file (RFC 5545), for a calendar's `ics:` (SPEC §4a).
//!
//! The file is parsed by the `icalendar` crate and its recurrences expanded by `rrule`; what is
//! ours is which days an event covers:
//!
//! - every `VEVENT` occurrence: its `DTSTART`, its `RRULE` (`FREQ` yearly, monthly, weekly or
//!   daily, with `COUNT`/`UNTIL`; without either it is expanded up to [`EXPANDED_UNTIL`]), its
//!   `RDATE`s, less its `EXDATE`s; an event with a `RECURRENCE-ID` replaces the occurrence of
//!   its `UID` that starts then;
//! - an all-day event (`DTSTART;VALUE=DATE`) covers the days from its start to its `DTEND`,
//!   exclusive (or its `DURATION` in whole days; one day without either);
//! - a timed event covers every day it touches, read in its own zone (`TZID`, UTC for a `Z`
//!   time, as written for a floating time): from its start's day to the day of its last
//!   instant (an end at midnight does not touch the next day).
//!
//! A mistake is told with the line of the file it is on (lines as written, before unfolding).

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{Duration, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Utc};
use icalendar::parser::{Component, Property, read_calendar};
use rrule::{Frequency, RRule, Tz as RTz, Unvalidated};

/// A rule with neither `COUNT` nor `UNTIL` is expanded up to here (exclusive).
pub(crate) const EXPANDED_UNTIL: (i32, u32, u32) = (2100, 1, 1);

/// Occurrences of one event at most.
const MAX_OCCURRENCES: u16 = u16::MAX;
/// Days one event covers at most: ten years.
const MAX_EVENT_DAYS: i64 = 3660;
/// Days of all the occurrences of all the events counted at most (a day covered twice, twice).
const MAX_COVERED: usize = 1_000_000;

/// A mistake in an iCalendar file: the line it is on (1-based, as written) and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IcsError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// The days of the file's events, each with the summary of the event covering it (the one
/// starting first, then by summary, when several do).
pub(crate) fn days(text: &str) -> Result<BTreeMap<NaiveDate, String>, IcsError> {
    let (unfolded, lines) = unfold(text);
    let starts: Vec<usize> = std::iter::once(0).chain(unfolded.match_indices('\n').map(|(i, _)| i + 1)).collect();
    let line_at = |offset: usize| -> usize {
        let i = starts.partition_point(|s| *s <= offset).saturating_sub(1);
        lines.get(i).copied().unwrap_or(1)
    };
    let calendar = read_calendar(&unfolded).map_err(|e| parse_error(&e, &lines))?;
    let within = |s: &str| {
        let (p, base) = (s.as_ptr() as usize, unfolded.as_ptr() as usize);
        (base..base + unfolded.len()).contains(&p).then(|| p - base)
    };
    let line_of = |p: &Property<'_>| within(p.name.as_str()).map_or(1, line_at);
    let begin_of = |c: &Component<'_>| within(c.name.as_str()).map_or(1, line_at);
    if calendar.components.is_empty() && calendar.properties.is_empty() {
        return Err(IcsError { line: 1, message: "no BEGIN:VCALENDAR: not an iCalendar file".into() });
    }

    // Events by UID: the one without RECURRENCE-ID expands, the others replace occurrences.
    let mut events: Vec<Event> = Vec::new();
    for c in calendar.components.iter().filter(|c| c.name.as_str().eq_ignore_ascii_case("VEVENT")) {
        events.push(Event::read(c, &line_of, begin_of(c))?);
    }
    let mut covered: BTreeMap<NaiveDate, (NaiveDateTime, String)> = BTreeMap::new();
    let mut counted = 0usize;
    let mut cover = |start: NaiveDateTime, days: Vec<NaiveDate>, summary: &str, line: usize| -> Result<(), IcsError> {
        counted += days.len();
        if counted > MAX_COVERED {
            return Err(IcsError {
                line,
                message: format!("the events expand to more than {MAX_COVERED} days; bound the recurrences with COUNT or UNTIL"),
            });
        }
        for d in days {
            let entry = covered.entry(d).or_insert_with(|| (start, summary.to_string()));
            if (start, summary) < (entry.0, entry.1.as_str()) {
                *entry = (start, summary.to_string());
            }
        }
        Ok(())
    };
    for e in events.iter().filter(|e| e.recurrence_id.is_none()) {
        let replaced: Vec<NaiveDateTime> =
            events.iter().filter(|o| o.uid.is_some() && o.uid == e.uid).filter_map(|o| o.recurrence_id).collect();
        for start in e.occurrences()? {
            if !replaced.contains(&start) {
                cover(start, e.covers(start), &e.summary, e.line)?;
            }
        }
    }
    for e in events.iter().filter(|e| e.recurrence_id.is_some()) {
        cover(e.start.local, e.covers(e.start.local), &e.summary, e.line)?;
    }
    Ok(covered.into_iter().map(|(d, (_, s))| (d, s)).collect())
}

/// A start or end as written: a day, or a local time in a zone (UTC for `Z` and for a floating
/// time, whose day is the one written).
#[derive(Debug, Clone, Copy, PartialEq)]
struct When {
    local: NaiveDateTime,
    zone: chrono_tz::Tz,
    all_day: bool,
}

#[derive(Debug)]
struct Event {
    uid: Option<String>,
    summary: String,
    start: When,
    /// How long each occurrence lasts, in local (wall-clock) terms.
    length: Duration,
    rule: Option<(RRule<Unvalidated>, usize)>,
    rdates: Vec<When>,
    exdates: Vec<When>,
    recurrence_id: Option<NaiveDateTime>,
    line: usize,
}

impl Event {
    fn read(c: &Component<'_>, line_of: &dyn Fn(&Property<'_>) -> usize, line: usize) -> Result<Self, IcsError> {
        let prop = |name: &str| c.properties.iter().find(|p| p.name.as_str().eq_ignore_ascii_case(name));
        let all = |name: &'static str| c.properties.iter().filter(move |p| p.name.as_str().eq_ignore_ascii_case(name));
        let Some(dtstart) = prop("DTSTART") else {
            return Err(IcsError {
                line,
                message: "a VEVENT without DTSTART; give each event its start (DTSTART;VALUE=DATE:20261225)".into(),
            });
        };
        let start = when(dtstart, line_of)?.remove(0);
        let length = match (prop("DTEND"), prop("DURATION")) {
            (Some(end), _) => {
                let end = when(end, line_of)?.remove(0);
                let end_local = if end.zone == start.zone || start.all_day || end.all_day {
                    end.local
                } else {
                    // An end in another zone than the start: read in the start's.
                    end.zone.from_local_datetime(&end.local).earliest().map_or(end.local, |t| t.with_timezone(&start.zone).naive_local())
                };
                end_local - start.local
            }
            (None, Some(d)) => duration(d.val.as_str()).ok_or_else(|| IcsError {
                line: line_of(d),
                message: format!("DURATION \"{}\" is not an iCalendar duration; write e.g. P1D, PT3H or P1DT12H", d.val.as_str()),
            })?,
            (None, None) if start.all_day => Duration::days(1),
            (None, None) => Duration::zero(),
        };
        if length > Duration::days(MAX_EVENT_DAYS) {
            return Err(IcsError {
                line,
                message: format!(
                    "an event lasting {} days; a calendar's event covers at most {MAX_EVENT_DAYS} days (list the days, or bound it)",
                    length.num_days()
                ),
            });
        }
        let rule = match prop("RRULE") {
            None => None,
            Some(r) => {
                let l = line_of(r);
                let text = r.val.as_str();
                // RFC 5545 writes rules in ASCII (rrule 0.14 panics slicing some others).
                if !text.is_ascii() {
                    return Err(IcsError {
                        line: l,
                        message: format!(
                            "RRULE \"{text}\" has characters a recurrence rule does not (it is ASCII: FREQ=YEARLY;BYMONTH=12)"
                        ),
                    });
                }
                let parsed = unwound(|| RRule::<Unvalidated>::from_str(text))
                    .ok_or_else(|| IcsError { line: l, message: format!("RRULE \"{text}\" could not be read") })?
                    .map_err(|e| IcsError { line: l, message: format!("RRULE \"{text}\" is not a recurrence rule: {e}") })?;
                if !matches!(parsed.get_freq(), Frequency::Yearly | Frequency::Monthly | Frequency::Weekly | Frequency::Daily) {
                    return Err(IcsError {
                        line: l,
                        message: format!(
                            "RRULE \"{}\": FREQ={} is not read; a calendar is a set of days, so write FREQ=YEARLY, MONTHLY, WEEKLY or DAILY",
                            r.val.as_str(),
                            parsed.get_freq()
                        ),
                    });
                }
                Some((parsed, l))
            }
        };
        let dates = |name: &'static str| -> Result<Vec<When>, IcsError> {
            let mut out = Vec::new();
            for p in all(name) {
                out.extend(when(p, line_of)?);
            }
            Ok(out)
        };
        let (rdates, exdates) = (dates("RDATE")?, dates("EXDATE")?);
        let recurrence_id = match prop("RECURRENCE-ID") {
            Some(r) => Some(when(r, line_of)?.remove(0).local),
            None => None,
        };
        // TEXT values unescaped by the parser's own rules (RFC 5545 §3.3.11).
        let text = |name: &str| prop(name).map(|p| p.val.clone().unescape_text().as_str().to_owned());
        Ok(Self {
            uid: text("UID"),
            summary: text("SUMMARY").unwrap_or_default(),
            start,
            length,
            rule,
            rdates,
            exdates,
            recurrence_id,
            line,
        })
    }

    /// The local start of every occurrence.
    fn occurrences(&self) -> Result<Vec<NaiveDateTime>, IcsError> {
        let zone = RTz::Tz(self.start.zone);
        let at = |w: &When| -> Option<chrono::DateTime<RTz>> {
            // A date or a time written in another zone than the start is read in the start's.
            let local = if w.all_day && !self.start.all_day { w.local.date().and_time(self.start.local.time()) } else { w.local };
            let instant = w.zone.from_local_datetime(&local).earliest()?;
            Some(instant.with_timezone(&zone))
        };
        let Some(dtstart) = at(&self.start) else {
            return Err(IcsError {
                line: self.line,
                message: "DTSTART is a local time that does not exist in its zone (a daylight-saving gap)".into(),
            });
        };
        let mut out = Vec::new();
        match &self.rule {
            None => out.push(self.start.local),
            Some((rule, line)) => {
                let mut rule = rule.clone();
                if let Some(until) = rule.get_until().copied()
                    && until.timezone() != RTz::UTC
                {
                    // UNTIL as a date or a floating time: read in the event's zone (a date
                    // includes its whole day).
                    let naive = until.naive_local();
                    let naive = if naive.time() == NaiveTime::MIN && !self.start.all_day {
                        naive.checked_add_signed(Duration::seconds(86_399)).unwrap_or(naive)
                    } else {
                        naive
                    };
                    let utc =
                        self.start.zone.from_local_datetime(&naive).earliest().map_or_else(|| naive.and_utc(), |t| t.with_timezone(&Utc));
                    rule = rule.until(utc.with_timezone(&RTz::UTC));
                }
                let (y, m, d) = EXPANDED_UNTIL;
                let end = RTz::UTC.with_ymd_and_hms(y, m, d, 0, 0, 0).single().unwrap_or_else(|| RTz::UTC.timestamp_opt(0, 0).unwrap());
                let cannot = |e: String| IcsError { line: *line, message: format!("RRULE cannot be expanded: {e}") };
                let result = unwound(|| rule.build(dtstart).map(|set| set.before(end).all(MAX_OCCURRENCES)))
                    .ok_or_else(|| cannot("the recurrence library failed on it".into()))?
                    .map_err(|e| cannot(e.to_string()))?;
                if result.limited && result.dates.len() >= usize::from(MAX_OCCURRENCES) {
                    return Err(IcsError {
                        line: *line,
                        message: format!("RRULE recurs more than {MAX_OCCURRENCES} times before {y}; bound it with COUNT or UNTIL"),
                    });
                }
                out.extend(result.dates.iter().map(|t| t.naive_local()));
            }
        }
        out.extend(self.rdates.iter().filter_map(|w| at(w).map(|t| t.naive_local())));
        let excluded: Vec<NaiveDateTime> = self.exdates.iter().filter_map(|w| at(w).map(|t| t.naive_local())).collect();
        out.retain(|s| !excluded.contains(s));
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// The days an occurrence starting at local `start` covers.
    fn covers(&self, start: NaiveDateTime) -> Vec<NaiveDate> {
        let first = start.date();
        let last = if self.start.all_day {
            let days = (self.length.num_days()).max(1);
            first.checked_add_signed(Duration::days(days - 1)).unwrap_or(first)
        } else if self.length <= Duration::zero() {
            first
        } else {
            start.checked_add_signed(self.length - Duration::microseconds(1)).map_or(first, |end| end.date())
        };
        first.iter_days().take_while(|d| *d <= last).collect()
    }
}

/// The value(s) of a date property: `VALUE=DATE` days, or times with their `TZID`.
fn when(p: &Property<'_>, line_of: &dyn Fn(&Property<'_>) -> usize) -> Result<Vec<When>, IcsError> {
    let param =
        |key: &str| p.params.iter().find(|x| x.key.as_str().eq_ignore_ascii_case(key)).and_then(|x| x.val.as_ref()).map(|v| v.as_str());
    let line = line_of(p);
    let name = p.name.as_str();
    if param("VALUE").is_some_and(|v| v.eq_ignore_ascii_case("PERIOD")) {
        return Err(IcsError { line, message: format!("{name};VALUE=PERIOD is not read; list the days or times") });
    }
    let zone = match param("TZID") {
        None => None,
        Some(z) => Some(
            chrono_tz::Tz::from_str(z.trim_matches('"').trim_start_matches('/'))
                .map_err(|_| IcsError { line, message: format!("{name}: TZID \"{z}\" is not an IANA zone name (e.g. Europe/Berlin)") })?,
        ),
    };
    let mut out = Vec::new();
    for v in p.val.as_str().split(',').map(str::trim).filter(|v| !v.is_empty()) {
        let bad = || IcsError {
            line,
            message: format!("{name} \"{v}\" is not an iCalendar date or time; write e.g. 20261225 (with VALUE=DATE) or 20261225T090000"),
        };
        let w = if v.len() == 8 {
            let d = NaiveDate::parse_from_str(v, "%Y%m%d").map_err(|_| bad())?;
            When { local: d.and_time(NaiveTime::MIN), zone: chrono_tz::UTC, all_day: true }
        } else if let Some(u) = v.strip_suffix('Z').or_else(|| v.strip_suffix('z')) {
            let t = NaiveDateTime::parse_from_str(u, "%Y%m%dT%H%M%S").map_err(|_| bad())?;
            When { local: t, zone: chrono_tz::UTC, all_day: false }
        } else {
            let t = NaiveDateTime::parse_from_str(v, "%Y%m%dT%H%M%S").map_err(|_| bad())?;
            When { local: t, zone: zone.unwrap_or(chrono_tz::UTC), all_day: false }
        };
        out.push(w);
    }
    if out.is_empty() {
        return Err(IcsError { line, message: format!("{name} has no value") });
    }
    Ok(out)
}

/// `f`'s answer, or `None` when it panicked: the recurrence library is given text from a file,
/// and a panic in it must not take the worker down (it is a mistake in the file, told on its
/// line).
fn unwound<T>(f: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}

/// An RFC 5545 duration (`P1D`, `PT3H`, `-P1W`, `P1DT12H30M`), as a length of local time.
fn duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let (sign, t) = match t.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, t.strip_prefix('+').unwrap_or(t)),
    };
    let t = t.strip_prefix('P')?;
    let (date, time) = t.split_once('T').unwrap_or((t, ""));
    let mut total = Duration::zero();
    let mut read = |part: &str, units: &[(char, i64)]| -> Option<()> {
        let mut n = String::new();
        for ch in part.chars() {
            if ch.is_ascii_digit() {
                n.push(ch);
            } else {
                let secs = units.iter().find(|(u, _)| *u == ch)?.1;
                total = total.checked_add(&Duration::try_seconds(n.parse::<i64>().ok()?.checked_mul(secs)?)?)?;
                n.clear();
            }
        }
        n.is_empty().then_some(())
    };
    read(date, &[('W', 7 * 86_400), ('D', 86_400)])?;
    read(time, &[('H', 3_600), ('M', 60), ('S', 1)])?;
    if date.is_empty() && time.is_empty() {
        return None;
    }
    Some(total * sign)
}

/// The file unfolded (a line starting with a space or a tab continues the one before), lines
/// ending in CRLF, and the line each unfolded line starts on.
fn unfold(text: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len());
    let mut lines = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        match raw.strip_prefix([' ', '\t']) {
            Some(rest) if !lines.is_empty() => {
                // Continues the line before: drop its CRLF again.
                out.truncate(out.len() - 2);
                out.push_str(rest);
                out.push_str("\r\n");
            }
            _ => {
                if raw.is_empty() && i > 0 {
                    continue;
                }
                lines.push(i + 1);
                out.push_str(raw);
                out.push_str("\r\n");
            }
        }
    }
    (out, lines)
}

/// The parser's error, on the line it is about (its numbers count unfolded lines).
fn parse_error(e: &str, lines: &[usize]) -> IcsError {
    let at = e.split("at line ").nth(1).and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()).and_then(|n| n.parse::<usize>().ok());
    let line = at.and_then(|n| lines.get(n.saturating_sub(1)).copied()).unwrap_or(1);
    let first = e.lines().find(|l| !l.trim().is_empty() && !l.starts_with("error")).unwrap_or(e).trim();
    IcsError {
        line,
        message: format!(
            "not iCalendar as RFC 5545 writes it ({first}); every line is NAME:VALUE between BEGIN:VCALENDAR and END:VCALENDAR"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    fn ics(body: &str) -> String {
        format!("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//test//EN\r\n{}END:VCALENDAR\r\n", body.replace('\n', "\r\n"))
    }

    #[test]
    fn yearly_rules_exdates_ranges_and_timed_events_cover_their_days() {
        let text = ics(
            "BEGIN:VEVENT\nUID:xmas\nDTSTART;VALUE=DATE:20261225\nDTEND;VALUE=DATE:20261227\nRRULE:FREQ=YEARLY;COUNT=3\nEXDATE;VALUE=DATE:20271225\nSUMMARY:Christmas\\, both days\nEND:VEVENT\nBEGIN:VEVENT\nUID:late\nDTSTART;TZID=Europe/Berlin:20260310T220000\nDTEND;TZID=Europe/Berlin:20260311T010000\nSUMMARY:Late\nEND:VEVENT\nBEGIN:VEVENT\nUID:mid\nDTSTART:20260401T100000Z\nDURATION:PT14H\nSUMMARY:To midnight\nEND:VEVENT\n",
        );
        let d = days(&text).unwrap();
        let got: Vec<(String, &str)> = d.iter().map(|(k, v)| (k.to_string(), v.as_str())).collect();
        assert_eq!(
            got,
            [
                ("2026-03-10".into(), "Late"),
                ("2026-03-11".into(), "Late"),
                ("2026-04-01".into(), "To midnight"),
                ("2026-12-25".into(), "Christmas, both days"),
                ("2026-12-26".into(), "Christmas, both days"),
                ("2028-12-25".into(), "Christmas, both days"),
                ("2028-12-26".into(), "Christmas, both days"),
            ]
        );
        assert!(!d.contains_key(&day("2026-04-02")), "an end at midnight does not touch the next day");
    }

    #[test]
    fn mistakes_are_told_on_the_line_they_are_on() {
        let text = ics("BEGIN:VEVENT\nUID:a\nDTSTART;VALUE=DATE:20261225\nRRULE:FREQ=HOURLY;COUNT=3\nEND:VEVENT\n");
        let e = days(&text).unwrap_err();
        assert_eq!(e.line, 7, "{e:?}");
        assert!(e.message.contains("FREQ=HOURLY is not read"), "{e:?}");
        let text = ics("BEGIN:VEVENT\nUID:a\nDTSTART;VALUE=DATE:2026122\nEND:VEVENT\n");
        let e = days(&text).unwrap_err();
        assert_eq!((e.line, e.message.contains("\"2026122\" is not an iCalendar date")), (6, true), "{e:?}");
        // A folded line counts as the lines it is written on.
        let text = ics("BEGIN:VEVENT\nUID:a\nSUMMARY:A long\n  name\nDTSTART;TZID=Mars/Olympus:20261225T100000\nEND:VEVENT\n");
        let e = days(&text).unwrap_err();
        assert_eq!(e.line, 8, "{e:?}");
        assert!(e.message.contains("TZID \"Mars/Olympus\" is not an IANA zone"), "{e:?}");
        let e = days("this is not a calendar\n").unwrap_err();
        assert!(e.message.contains("not iCalendar") || e.message.contains("not an iCalendar"), "{e:?}");
        let text = ics("BEGIN:VEVENT\nUID:a\nSUMMARY:no start\nEND:VEVENT\n");
        assert_eq!(days(&text).unwrap_err().line, 4);
    }

    #[test]
    fn a_recurrence_id_replaces_its_occurrence_and_weekly_rules_keep_their_days() {
        let text = ics(
            "BEGIN:VEVENT\nUID:w\nDTSTART;VALUE=DATE:20260105\nRRULE:FREQ=WEEKLY;BYDAY=MO,WE;UNTIL=20260114\nSUMMARY:Standup\nEND:VEVENT\nBEGIN:VEVENT\nUID:w\nRECURRENCE-ID;VALUE=DATE:20260107\nDTSTART;VALUE=DATE:20260108\nSUMMARY:Moved\nEND:VEVENT\n",
        );
        let got: Vec<String> = days(&text).unwrap().iter().map(|(d, s)| format!("{d} {s}")).collect();
        assert_eq!(got, ["2026-01-05 Standup", "2026-01-08 Moved", "2026-01-12 Standup", "2026-01-14 Standup"]);
    }

    #[test]
    fn an_event_of_centuries_or_a_flood_of_days_is_refused_not_expanded() {
        let text = ics("BEGIN:VEVENT\nUID:a\nDTSTART;VALUE=DATE:20260101\nDTEND;VALUE=DATE:99991231\nEND:VEVENT\n");
        let e = days(&text).unwrap_err();
        assert!(e.message.contains("covers at most 3660 days"), "{e:?}");
        let text = ics("BEGIN:VEVENT\nUID:a\nDTSTART;VALUE=DATE:20260101\nDURATION:P3000D\nRRULE:FREQ=DAILY;COUNT=60000\nEND:VEVENT\n");
        assert!(days(&text).unwrap_err().message.contains("more than 1000000 days"));
        let text = ics("BEGIN:VEVENT\nUID:a\nDTSTART:20260101T000000\nDURATION:PT99999999999999999H\nEND:VEVENT\n");
        assert!(days(&text).unwrap_err().message.contains("is not an iCalendar duration"));
        let text = ics("BEGIN:VEVENT\nUID:a\nDTSTART:99991231T230000\nDURATION:PT5H\nEND:VEVENT\n");
        assert_eq!(days(&text).unwrap().len(), 2, "into the year 10000");
    }

    #[test]
    fn a_rule_the_recurrence_library_cannot_read_is_a_mistake_on_its_line_not_a_panic() {
        let text = ics("BEGIN:VEVENT\nUID:a\nDTSTART;VALUE=DATE:20260101\nRRULE:FREQ=WEEKLY;BYDAY=Mé\nEND:VEVENT\n");
        let e = days(&text).unwrap_err();
        assert_eq!(e.line, 7, "{e:?}");
        assert!(e.message.contains("it is ASCII"), "{e:?}");
    }

    #[test]
    fn durations_read_as_rfc_5545_writes_them() {
        assert_eq!(duration("P1D"), Some(Duration::days(1)));
        assert_eq!(duration("PT3H30M"), Some(Duration::minutes(210)));
        assert_eq!(duration("P1W"), Some(Duration::days(7)));
        assert_eq!(duration("-P1DT1S"), Some(-Duration::seconds(86_401)));
        assert_eq!(duration("P"), None);
        assert_eq!(duration("1D"), None);
        assert_eq!(duration("PT3X"), None);
    }
}
