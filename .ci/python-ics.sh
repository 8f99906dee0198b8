#!/usr/bin/env bash
# Installs the Python iCalendar stack (PyPI `icalendar`, `recurring-ical-events`, pinned) into a
# venv, once per machine, and prints the venv's python. The calendar tests run the independent
# oracles `tests/oracle/ics_days.py` and `tests/oracle/calendar_fires.py` (with `croniter`) with it; `holidays` (pinned too) is only there for
# `tests/data/ics/generate.py`, which makes the public-holiday .ics files. pip's own cache keeps a
# second machine's install offline-fast.
set -euo pipefail
DIR=${LAMPLIGHTER_PYTHON_ICS:-$HOME/.cache/lamplighter-python-ics}
ICALENDAR_VERSION=7.3.2
RECURRING_VERSION=3.8.2
HOLIDAYS_VERSION=0.109
CRONITER_VERSION=6.0.0
VERSION="icalendar==$ICALENDAR_VERSION recurring-ical-events==$RECURRING_VERSION holidays==$HOLIDAYS_VERSION croniter==$CRONITER_VERSION"
if [ ! -x "$DIR/venv/bin/python" ] || [ "$(cat "$DIR/version" 2>/dev/null)" != "$VERSION" ]; then
  mkdir -p "$DIR"
  exec 8>"$DIR/.lock"
  flock 8
  if [ ! -x "$DIR/venv/bin/python" ] || [ "$(cat "$DIR/version" 2>/dev/null)" != "$VERSION" ]; then
    rm -rf "$DIR/venv"
    python3 -m venv "$DIR/venv" >&2
    # shellcheck disable=SC2086 # $VERSION is the list of pinned requirements
    "$DIR/venv/bin/pip" install -q $VERSION >&2
    echo "$VERSION" >"$DIR/version"
  fi
fi
echo "$DIR/venv/bin/python"
