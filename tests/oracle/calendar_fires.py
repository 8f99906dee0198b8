"""Independent oracle: the fire times of a cron job on a calendar of business days.

Usage: python calendar_fires.py CRON ZONE ICS FROM N

The calendar is Monday to Friday less the days of the iCalendar file ICS (as
`ics_days.py` expands them: `recurring-ical-events`); the fires are croniter's for CRON in the
IANA zone ZONE from the RFC 3339 instant FROM (exclusive), kept when their local day is a day
of the calendar. Prints the first N as a JSON list of UTC instants (`2026-12-28T05:30:00Z`).

croniter and recurring-ical-events share no code with the product (Rust `cron` crate and
`rrule`); cron expressions here should avoid local times in a DST gap or overlap, where cron
implementations legitimately differ (the product's rules are in its README).
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import sys
import zoneinfo

from croniter import croniter

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import ics_days  # noqa: E402


def main() -> int:
    expr, zone_name, ics, start, n = sys.argv[1:6]
    zone = zoneinfo.ZoneInfo(zone_name)
    start_utc = dt.datetime.fromisoformat(start.replace("Z", "+00:00"))
    days_from = (start_utc - dt.timedelta(days=2)).date()
    days_to = days_from + dt.timedelta(days=3700)
    with open(ics, "rb") as file:
        calendar = ics_days.icalendar.Calendar.from_ical(file.read())
    holidays = {d["day"] for d in ics_days.calendar_days(calendar, days_from, days_to)}
    # croniter is asked day by day, from each business day's local midnight: iterated across a
    # DST change it keeps the old offset for a while (seen here: Berlin, 1 Nov 2027, 08:00 and
    # 08:30 CET missing after the change of 31 Oct).
    out: list[str] = []
    day = start_utc.astimezone(zone).date()
    while len(out) < int(n) and day < days_to:
        if day.weekday() < 5 and day.isoformat() not in holidays:
            midnight = dt.datetime.combine(day, dt.time(), tzinfo=zone)
            it = croniter(expr, midnight - dt.timedelta(seconds=1))
            while len(out) < int(n):
                fire = it.get_next(dt.datetime)
                if fire.astimezone(zone).date() != day:
                    break
                if fire > start_utc:
                    out.append(fire.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        day += dt.timedelta(days=1)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
