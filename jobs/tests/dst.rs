//! The DST rules of SPEC §4 against an independent oracle: `fixtures/dst/expected.txt` was
//! written by `fixtures/dst/oracle.py` (Python's `zoneinfo` over the system tz database, and a
//! matcher of its own), not by the code under test. Each case lists every fire instant in a
//! window around one 2026 offset change, spring and autumn, in four zones (one of them shifting
//! by 30 minutes, one at +12:45), with ranges and both day fields (the changes fall on
//! Sundays).

use chrono::{DateTime, Utc};
use lamplighter_jobs::Schedule;

struct Case {
    expr: String,
    zone: String,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    direction: String,
    want: Vec<DateTime<Utc>>,
}

fn instant(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s.trim()).unwrap_or_else(|e| panic!("fixture instant {s:?}: {e}")).with_timezone(&Utc)
}

fn cases() -> Vec<Case> {
    let text = include_str!("fixtures/dst/expected.txt");
    let mut out: Vec<Case> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(head) = line.strip_prefix("case ") {
            let parts: Vec<&str> = head.split(" | ").collect();
            assert_eq!(parts.len(), 5, "fixture header {line:?}");
            out.push(Case {
                expr: parts[0].to_string(),
                zone: parts[1].to_string(),
                from: instant(parts[2]),
                to: instant(parts[3]),
                direction: parts[4].to_string(),
                want: Vec::new(),
            });
        } else {
            out.last_mut().expect("an instant before the first case").want.push(instant(line));
        }
    }
    out
}

#[test]
fn fire_times_match_the_oracle_in_both_directions_and_four_zones() {
    let cases = cases();
    // 9 expressions × 4 zones × 2 directions, as the fixture promises.
    assert_eq!(cases.len(), 72);
    for zone in ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Chatham"] {
        for dir in ["spring", "autumn"] {
            assert_eq!(cases.iter().filter(|c| c.zone == zone && c.direction == dir).count(), 9, "{zone} {dir}");
        }
    }
    let mut failures = Vec::new();
    for c in &cases {
        let s = Schedule::cron(&c.expr, &c.zone).unwrap();
        let mut got = Vec::new();
        let mut cur = c.from;
        while let Some(t) = s.next_after(cur).filter(|t| *t <= c.to) {
            got.push(t);
            cur = t;
        }
        if got != c.want {
            let fmt = |v: &[DateTime<Utc>]| v.iter().map(|t| t.format("%H:%M:%S").to_string()).collect::<Vec<_>>().join(" ");
            failures.push(format!(
                "{} in {} ({}, {} → {}):\n  want {}\n  got  {}",
                c.expr,
                c.zone,
                c.direction,
                c.from,
                c.to,
                fmt(&c.want),
                fmt(&got)
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ from the oracle:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn upcoming_lists_the_same_instants_as_next_after() {
    // `get_job` shows `upcoming`; it must follow the same rule as the scheduler's `next_after`.
    for c in cases().iter().filter(|c| !c.want.is_empty()) {
        let s = Schedule::cron(&c.expr, &c.zone).unwrap();
        let got = s.upcoming(c.from, c.want.len());
        assert_eq!(got, c.want, "{} in {} ({})", c.expr, c.zone, c.direction);
    }
}
