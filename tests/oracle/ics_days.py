"""Independent oracle: the set of days an iCalendar (.ics) file contributes to a calendar.

Usage: python ics_days.py FILE FROM TO

FROM and TO are dates as YYYY-MM-DD; TO is exclusive. Run it with the python that
`.ci/python-ics.sh` prints (pinned `icalendar` and `recurring-ical-events`).

Prints to stdout a JSON list, sorted by day, of objects {"day": "YYYY-MM-DD", "summary": "..."},
one per day of the calendar in [FROM, TO).

The days an .ics file contributes:

- Every VEVENT occurrence in [FROM, TO), expanded with
  `recurring_ical_events.of(cal).between(FROM, TO)`: RRULE, RDATE and EXDATE are honoured as
  that library honours them (RECURRENCE-ID overrides and X-WR-TIMEZONE too). An occurrence is
  in the window when it overlaps it; FROM and TO are passed as naive midnights, which the
  library reads in the event's own zone.
  Only VEVENTs count (no VTODO, VJOURNAL, VALARM); a cancelled event is not treated specially.
- An all-day event (DTSTART as a DATE) covers the days from DTSTART to DTEND exclusive.
  DURATION instead of DTEND is added to DTSTART. No DTEND and no DURATION: one day. An end not
  after the start also gives one day (the start's).
- A timed event (DTSTART as a DATE-TIME) covers every day it touches, in the event's own zone
  (its DTSTART's TZID, or UTC for a `Z` time, or as written for a floating time): from the
  start's date to the date of (end - 1 microsecond), where the end is DTEND (moved into the
  start's zone if it has another), or DTSTART + DURATION. An event with no end, or with
  end == start, covers its start's day.
- Two behaviours come from recurring-ical-events and are kept: DTSTART + DURATION is added on
  the wall clock (PT24H over a DST change ends at the same local time, like P1D), and an end
  before the start is swapped with it (the event then runs from the end to the start).
- Only days in [FROM, TO) are printed.
- When two occurrences cover the same day, the day keeps the summary of the occurrence that
  starts first, the starts compared as wall-clock date-times each in its own zone (an all-day
  start at 00:00), then by summary alphabetically. A missing SUMMARY is "".

A file that cannot be read or parsed (by icalendar, or by recurring-ical-events while
expanding): the error goes to stderr and the exit status is 2. Bad arguments also exit 2.
"""

from __future__ import annotations

import datetime as dt
import json
import sys

import icalendar
import recurring_ical_events

ONE_DAY = dt.timedelta(days=1)
ONE_MICROSECOND = dt.timedelta(microseconds=1)


def is_date(value) -> bool:
    return isinstance(value, dt.date) and not isinstance(value, dt.datetime)


def occurrence_days(start, end) -> tuple[list[dt.date], dt.datetime]:
    """The days one occurrence covers, and its start as a wall-clock date-time (sort key)."""
    if is_date(start):
        if end is None:
            end = start + ONE_DAY
        elif isinstance(end, dt.datetime):
            # An all-day start with a time-based DURATION: the library turns the end into a
            # floating date-time; the last day is the one holding (end - 1 µs).
            end = (end - ONE_MICROSECOND).date() + ONE_DAY
        if end <= start:
            end = start + ONE_DAY
        days = []
        day = start
        while day < end:
            days.append(day)
            day += ONE_DAY
        return days, dt.datetime.combine(start, dt.time())
    # Timed.
    if end is None:
        end = start
    elif is_date(end):
        end = dt.datetime.combine(end, dt.time(), tzinfo=start.tzinfo)
    elif start.tzinfo is not None and end.tzinfo is not None:
        end = end.astimezone(start.tzinfo)
    elif start.tzinfo is not None and end.tzinfo is None:
        end = end.replace(tzinfo=start.tzinfo)
    elif start.tzinfo is None and end.tzinfo is not None:
        end = end.replace(tzinfo=None)
    first = start.date()
    last = first if end <= start else (end - ONE_MICROSECOND).date()
    days = []
    day = first
    while day <= last:
        days.append(day)
        day += ONE_DAY
    return days, start.replace(tzinfo=None)


def calendar_days(calendar, date_from: dt.date, date_to: dt.date) -> list[dict]:
    best: dict[dt.date, tuple[dt.datetime, str]] = {}
    # FROM and TO go in as naive midnights, which the library reads in each event's own zone,
    # not as `date`s: with a `date` it widens the query by the event's length with date
    # arithmetic, which drops the hours, so a timed event that starts the day before FROM and
    # runs into it (22:00-01:00) is not returned at all.
    span = (dt.datetime.combine(date_from, dt.time()), dt.datetime.combine(date_to, dt.time()))
    for event in recurring_ical_events.of(calendar).between(*span):
        start = event["DTSTART"].dt
        end_prop = event.get("DTEND")
        end = end_prop.dt if end_prop is not None else None
        if end is None and event.get("DURATION") is not None:
            end = start + event["DURATION"].dt
        summary = str(event.get("SUMMARY", ""))
        days, key = occurrence_days(start, end)
        for day in days:
            if not (date_from <= day < date_to):
                continue
            candidate = (key, summary)
            if day not in best or candidate < best[day]:
                best[day] = candidate
    return [
        {"day": day.isoformat(), "summary": best[day][1]} for day in sorted(best)
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: ics_days.py FILE FROM TO  (dates as YYYY-MM-DD, TO exclusive)", file=sys.stderr)
        return 2
    try:
        date_from = dt.date.fromisoformat(argv[2])
        date_to = dt.date.fromisoformat(argv[3])
    except ValueError as error:
        print(f"ics_days.py: bad date: {error}", file=sys.stderr)
        return 2
    if date_to < date_from:
        print("ics_days.py: TO is before FROM", file=sys.stderr)
        return 2
    try:
        with open(argv[1], "rb") as file:
            data = file.read()
        calendar = icalendar.Calendar.from_ical(data)
        days = calendar_days(calendar, date_from, date_to)
    except Exception as error:  # noqa: BLE001 - any failure to read or expand is "unparseable"
        print(f"ics_days.py: {argv[1]}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    json.dump(days, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
