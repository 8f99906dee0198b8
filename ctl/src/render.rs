//! What people read: aligned tables, key-value blocks, and times in local time with a
//! relative hint ("in 3h", "5m ago"). Each view takes the contract type its tool answers with
//! (`lamplighter-contract`, the types the worker serializes); `-o json` shows the answer as sent.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Local, TimeDelta, Utc};
use lamplighter_contract::{
    AgentList, AgentUsage, ApprovalList, Backfill, CallKind, Decision, FireTime, JobChange, JobDeleted, JobDetail, JobOrigin, JobSaved,
    JobSummary, LimitList, NotificationStatus, OutputLine, PluginList, ReloadSummary, Run, RunBrief, RunDetail, RunPage, RunStatus,
    SchedulePreview, StepOutline, StepStatus, StepView, TagChange, TagTriggered, TriggerOutcome, WorkerStatus, WorkflowList,
};
use rmcp::model::Tool;
use serde_json::Value;

/// Shown for a field the worker did not send.
pub(crate) const NONE: &str = "-";
/// The widest a table cell gets before it is cut with "…".
const MAX_CELL: usize = 60;
/// The widest a JSON value gets inside a key-value line.
const MAX_INLINE_JSON: usize = 200;

// ---------------------------------------------------------------------------------------
// Building blocks

/// Columns aligned with two spaces between them; the last column is not padded.
#[derive(Debug)]
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Self {
        Self { header: header.iter().map(|title| (*title).to_owned()).collect(), rows: Vec::new() }
    }

    /// Adds a row; control characters (a newline in a description) become spaces so that
    /// one row stays one line.
    pub(crate) fn push(&mut self, row: Vec<String>) {
        self.rows.push(row.into_iter().map(|cell| clean(&cell)).collect());
    }

    pub(crate) fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|title| chars(title)).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(chars(cell));
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (index, width) in widths.iter().enumerate() {
                let cell = row.get(index).map_or(NONE, String::as_str);
                if index > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                if index + 1 < columns {
                    line.extend(std::iter::repeat_n(' ', width.saturating_sub(chars(cell))));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `key:  value` lines with the values aligned.
#[derive(Debug, Default)]
pub(crate) struct Pairs(Vec<(String, String)>);

impl Pairs {
    pub(crate) fn add(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), clean(&value)));
    }

    /// Adds the line only when there is something to show.
    pub(crate) fn add_some(&mut self, key: &str, value: Option<String>) {
        if let Some(value) = value {
            self.add(key, value);
        }
    }

    pub(crate) fn render(&self) -> String {
        let width = self.0.iter().map(|(key, _)| chars(key)).max().unwrap_or(0) + 1;
        let mut out = String::new();
        for (key, value) in &self.0 {
            let label = format!("{key}:");
            out.push_str(format!("{label:<width$}  {value}").trim_end());
            out.push('\n');
        }
        out
    }
}

fn chars(text: &str) -> usize {
    text.chars().count()
}

fn clean(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

fn truncate(text: &str, max: usize) -> String {
    if chars(text) <= max {
        text.to_owned()
    } else {
        let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|line| if line.is_empty() { "\n".to_owned() } else { format!("  {line}\n") }).collect()
}

// ---------------------------------------------------------------------------------------
// Times

/// "in 3h", "5m ago", "now": one unit, rounded toward zero.
pub(crate) fn relative(then: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (then - now).num_seconds();
    if seconds == 0 {
        return "now".to_owned();
    }
    let span = span(seconds.unsigned_abs());
    if seconds > 0 { format!("in {span}") } else { format!("{span} ago") }
}

/// A span in its largest whole unit: "45s", "5m", "3h", "12d".
pub(crate) fn span(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3_600 => format!("{}m", seconds / 60),
        3_600..86_400 => format!("{}h", seconds / 3_600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// A length of time in two units: "45s", "1m30s", "3h5m", "2d4h".
pub(crate) fn duration(seconds: u64) -> String {
    let two = |big: u64, big_unit: &str, small: u64, small_unit: &str| {
        if small == 0 { format!("{big}{big_unit}") } else { format!("{big}{big_unit}{small}{small_unit}") }
    };
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3_600 => two(seconds / 60, "m", seconds % 60, "s"),
        3_600..86_400 => two(seconds / 3_600, "h", seconds % 3_600 / 60, "m"),
        _ => two(seconds / 86_400, "d", seconds % 86_400 / 3_600, "h"),
    }
}

fn whole_seconds(delta: TimeDelta) -> u64 {
    u64::try_from(delta.num_seconds()).unwrap_or(0)
}

/// For tables: local time as short as is unambiguous ("14:05", "May 04 02:00",
/// "2027-01-02 02:00") and the relative hint.
fn when_short(time: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let local = time.with_timezone(&Local);
    let today = now.with_timezone(&Local);
    let format = if local.date_naive() == today.date_naive() {
        "%H:%M"
    } else if local.year() == today.year() {
        "%b %d %H:%M"
    } else {
        "%Y-%m-%d %H:%M"
    };
    format!("{} ({})", local.format(format), relative(time, now))
}

/// For details: full local time with its offset, and the relative hint.
fn when_full(time: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!("{} ({})", time.with_timezone(&Local).format("%Y-%m-%d %H:%M:%S %:z"), relative(time, now))
}

// ---------------------------------------------------------------------------------------
// Views, one per command. Each reads the contract's type for the tool it shows, so a field
// the worker renamed is a compile error here, not a "-" in a table.

/// `-o json`: the tool's structured content, pretty.
pub(crate) fn json(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// `tools call`: text as it is, anything else as pretty JSON.
pub(crate) fn raw(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{}\n", text.trim_end()),
        other => json(other),
    }
}

fn or_none(text: Option<&str>) -> String {
    text.filter(|t| !t.is_empty()).map_or_else(|| NONE.to_owned(), str::to_owned)
}

fn time_short(time: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    time.map_or_else(|| NONE.to_owned(), |time| when_short(time, now))
}

fn time_full(time: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    time.map_or_else(|| NONE.to_owned(), |time| when_full(time, now))
}

/// A value on one line: strings as they are, anything else as compact JSON.
fn compact(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => truncate(&serde_json::to_string(other).unwrap_or_default(), MAX_INLINE_JSON),
    }
}

fn joined(names: &[String]) -> String {
    if names.is_empty() { NONE.to_owned() } else { names.join(", ") }
}

/// `status`.
pub(crate) fn status(s: &WorkerStatus, now: DateTime<Utc>) -> String {
    let mut pairs = Pairs::default();
    pairs.add("worker", s.worker.clone());
    pairs.add("version", s.version.clone());
    pairs.add("started", when_full(s.started_at, now));
    pairs.add("uptime", duration(u64::try_from(s.uptime_seconds).unwrap_or(0)));
    pairs.add("jobs", s.jobs.to_string());
    pairs.add("running", s.running.to_string());
    pairs.add("queue depth", s.queue_depth.to_string());
    pairs.add("storage", s.storage.clone());
    let mut out = pairs.render();
    // The workers sharing the database (one on SQLite) and what each runs.
    if !s.workers.is_empty() {
        let mut table = Table::new(&["WORKER", "HOST", "PID", "HEARTBEAT", "RUNNING"]);
        for w in &s.workers {
            table.push(vec![
                w.name.clone(),
                w.host.clone(),
                w.pid.to_string(),
                when_short(w.heartbeat_at, now),
                w.running.len().to_string(),
            ]);
        }
        out.push('\n');
        out.push_str(&table.render());
    }
    out
}

/// `jobs list`.
pub(crate) fn jobs(jobs: &[JobSummary], now: DateTime<Utc>) -> String {
    if jobs.is_empty() {
        return "no jobs\n".to_owned();
    }
    // A column for tags only where some job has them.
    let tagged = jobs.iter().any(|j| !j.tags.is_empty());
    let mut header = vec!["NAME", "TARGET", "SCHEDULE", "STATE", "NEXT FIRE", "LAST RUN"];
    if tagged {
        header.push("TAGS");
    }
    let mut table = Table::new(&header);
    for job in jobs {
        let mut row = vec![
            job.name.clone(),
            truncate(&job.target, MAX_CELL),
            schedule(job),
            job_state(job).to_owned(),
            time_short(job.next_fire, now),
            last_run(job.last_run.as_ref(), now),
        ];
        if tagged {
            row.push(job.tags.join(","));
        }
        table.push(row);
    }
    table.render()
}

/// A job's schedule; a job without one fires only when triggered.
fn schedule(job: &JobSummary) -> String {
    job.schedule.clone().unwrap_or_else(|| "manual".to_owned())
}

fn job_state(job: &JobSummary) -> &'static str {
    // The worker cannot run it (e.g. its plugin did not load): the strongest state.
    if job.disabled.is_some() {
        "unavailable"
    } else if job.paused {
        "paused"
    } else if !job.enabled {
        "disabled"
    } else {
        "active"
    }
}

/// "succeeded 5m ago", from a run summary.
fn last_run(run: Option<&RunBrief>, now: DateTime<Utc>) -> String {
    match run {
        None => NONE.to_owned(),
        Some(run) => format!("{} {}", run.status, relative(run.finished_at.unwrap_or(run.enqueued_at), now)),
    }
}

/// Where a job is defined, in a line.
fn origin(origin: &JobOrigin, now: DateTime<Utc>) -> String {
    match origin {
        JobOrigin::File { location: Some(at) } => format!("in the config files, {at}"),
        JobOrigin::File { location: None } => "in the config files".to_owned(),
        JobOrigin::Runtime { version, created_by, created_at, updated_by, updated_at } => {
            let mut text = format!("at runtime, version {version}: created by {created_by} {}", relative(*created_at, now));
            if *version > 1 {
                text.push_str(&format!(", changed by {updated_by} {}", relative(*updated_at, now)));
            }
            text
        }
        JobOrigin::Deleted { version, deleted_by, deleted_at } => {
            format!("at runtime, deleted by {deleted_by} {} (version {version})", relative(*deleted_at, now))
        }
    }
}

/// `jobs create` and `jobs edit`.
pub(crate) fn saved(s: &JobSaved, now: DateTime<Utc>) -> String {
    let mut out = if s.saved {
        format!("job \"{}\" saved, version {}; every worker schedules it now\n", s.name, s.version)
    } else {
        format!("dry run: job \"{}\" is valid and would be saved as version {} (nothing was saved)\n", s.name, s.version)
    };
    let mut pairs = Pairs::default();
    pairs.add("target", s.job.target.clone());
    pairs.add("schedule", format!("{} ({})", schedule(&s.job), s.job.timezone));
    pairs.add("state", job_state_detail(&s.job, now));
    out.push_str(&pairs.render());
    for w in &s.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    if let Some(p) = &s.preview {
        out.push_str("\nnext fires:\n");
        out.push_str(&indent(&fires_table(&p.next_fires, &p.timezone, now)));
        for note in &p.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        for warning in &p.warnings {
            out.push_str(&format!("warning: {warning}\n"));
        }
    }
    out
}

/// `jobs delete`.
pub(crate) fn deleted(d: &JobDeleted) -> String {
    let mut out = format!("job \"{}\" deleted (version {}); it no longer fires; its runs and history stay\n", d.name, d.version);
    if !d.cancelled_runs.is_empty() {
        out.push_str(&format!("asked {} runs to stop: {}\n", d.cancelled_runs.len(), d.cancelled_runs.join(", ")));
    }
    out
}

/// `jobs backfill`.
pub(crate) fn backfill(b: &Backfill, now: DateTime<Utc>) -> String {
    let mut table = Table::new(&["TICK (JOB'S ZONE)", "UTC", "WHEN", "RUN"]);
    for t in &b.ticks {
        let run = match (&t.run_id, t.existing) {
            (Some(id), _) => id.clone(),
            (None, true) => "already ran".to_owned(),
            (None, false) if b.dry_run => "would run".to_owned(),
            (None, false) => NONE.to_owned(),
        };
        table.push(vec![zoned(&t.local), t.scheduled_at.format("%Y-%m-%d %H:%M UTC").to_string(), relative(t.scheduled_at, now), run]);
    }
    let existing = b.ticks.iter().filter(|t| t.existing).count();
    let head = if b.dry_run {
        format!("dry run: {} ticks of job \"{}\" would run, {existing} already ran (nothing was created)\n", b.created, b.name)
    } else {
        format!("{} runs of job \"{}\" queued, one at a time in tick order; {existing} ticks already ran\n", b.created, b.name)
    };
    if b.ticks.is_empty() { format!("job \"{}\" has no tick in that window\n", b.name) } else { format!("{head}{}", table.render()) }
}

/// `jobs history`.
pub(crate) fn history(detail: &JobDetail, now: DateTime<Utc>) -> String {
    if detail.history.is_empty() {
        return format!("job \"{}\" is defined in the config files; its changes are in their history, not here\n", detail.summary.name);
    }
    let mut table = Table::new(&["VERSION", "ACTION", "BY", "WHEN", "CHANGED"]);
    for h in &detail.history {
        table.push(vec![h.version.to_string(), h.action.clone(), h.actor.clone(), when_short(h.at, now), changed_keys(h)]);
    }
    table.render()
}

/// The top-level keys a change added, removed or changed.
fn changed_keys(h: &JobChange) -> String {
    let empty = serde_json::Map::new();
    let before = h.before.as_ref().and_then(Value::as_object).unwrap_or(&empty);
    let after = h.after.as_ref().and_then(Value::as_object).unwrap_or(&empty);
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    let changed: Vec<&str> = keys.into_iter().filter(|k| before.get(*k) != after.get(*k)).map(String::as_str).collect();
    if changed.is_empty() { NONE.to_owned() } else { changed.join(", ") }
}

/// Runtime jobs as the files write them: `scheduling.jobs`, in block YAML. Strings are written
/// as JSON strings (valid YAML double-quoted scalars), so nothing needs YAML's quoting rules.
pub(crate) fn export(jobs: &[(String, Value)]) -> String {
    let mut out = String::from(
        "# Runtime jobs, exported by lampctl. Move them into the config files, then delete them at runtime.\nscheduling:\n  jobs:\n",
    );
    if jobs.is_empty() {
        return "# No runtime jobs.\nscheduling:\n  jobs: {}\n".to_owned();
    }
    for (name, definition) in jobs {
        out.push_str(&format!("    {}:", yaml_key(name)));
        yaml_block(&mut out, definition, 6);
    }
    out
}

/// A key as written: plain when YAML reads it back as the same string (a word that is not a
/// number, a boolean or a null), else double-quoted.
fn yaml_key(k: &str) -> String {
    let word = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let keyword = ["true", "false", "null", "yes", "no", "on", "off", "y", "n"].iter().any(|w| k.eq_ignore_ascii_case(w));
    if word && !keyword { k.to_owned() } else { yaml_string(k) }
}

/// A string as a YAML double-quoted scalar: JSON's escapes, plus those of the characters YAML
/// refuses or folds (DEL, the C1 controls, NEL and the Unicode line and paragraph separators).
fn yaml_string(s: &str) -> String {
    let json = Value::from(s).to_string();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c) || c == '\u{2028}' || c == '\u{2029}' {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes `v` after a key (`key:` already written), indented by `indent` on its own lines.
fn yaml_block(out: &mut String, v: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(o) if !o.is_empty() => {
            out.push('\n');
            for (k, v) in o {
                out.push_str(&format!("{pad}{}:", yaml_key(k)));
                yaml_block(out, v, indent + 2);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            for v in a {
                out.push_str(&format!("{pad}-"));
                match v {
                    Value::Object(o) if !o.is_empty() => {
                        // The first key on the dash's line, the rest under it.
                        let mut first = true;
                        for (k, v) in o {
                            if first {
                                out.push_str(&format!(" {}:", yaml_key(k)));
                                first = false;
                            } else {
                                out.push_str(&format!("{pad}  {}:", yaml_key(k)));
                            }
                            yaml_block(out, v, indent + 4);
                        }
                    }
                    _ => yaml_block(out, v, indent + 2),
                }
            }
        }
        Value::String(text) => out.push_str(&format!(" {}\n", yaml_string(text))),
        // Other scalars, `{}` and `[]`: JSON is YAML.
        scalar => out.push_str(&format!(" {scalar}\n")),
    }
}

/// `jobs show`.
pub(crate) fn job(detail: &JobDetail, now: DateTime<Utc>) -> String {
    let job = &detail.summary;
    let mut pairs = Pairs::default();
    pairs.add("name", job.name.clone());
    pairs.add_some("description", job.description.clone());
    pairs.add("target", job.target.clone());
    pairs.add("schedule", format!("{} ({})", schedule(job), job.timezone));
    pairs.add("defined", origin(&job.origin, now));
    pairs.add("state", job_state_detail(job, now));
    pairs.add("next fire", time_full(job.next_fire, now));
    pairs.add("catch-up", detail.catch_up.clone());
    pairs.add("overlap", detail.overlap.clone());
    pairs.add("timeout", detail.timeout_seconds.map_or_else(|| "none".to_owned(), duration));
    pairs.add("max retries", detail.max_retries.to_string());
    pairs.add("runs", counts(&detail.counts));
    pairs.add("last run", last_run(job.last_run.as_ref(), now));
    if !job.tags.is_empty() {
        pairs.add("tags", job.tags.join(", "));
    }
    if let Some(after) = &detail.after {
        let waiting = if after.waiting_for.is_empty() {
            "a run is due: every upstream job has an outcome".to_owned()
        } else {
            format!("waits for {}", after.waiting_for.join(", "))
        };
        pairs.add("upstream", waiting);
        for p in &after.pending {
            let expires = p.expires_at.map(|e| format!(", counts until {}", time_full(Some(e), now))).unwrap_or_default();
            pairs.add("  pending", format!("{} run {} {} {}{expires}", p.job, p.run_id, p.status, relative(p.finished_at, now)));
        }
        for p in &after.expired {
            let what =
                format!("{} run {} {} {}: waited out its window, nothing ran", p.job, p.run_id, p.status, relative(p.finished_at, now));
            pairs.add("  expired", what);
        }
    }
    if !detail.downstream.is_empty() {
        pairs.add("downstream", detail.downstream.join(", "));
    }
    if let Some(m) = &detail.last_missed {
        let span = if m.count == 1 {
            time_full(Some(m.last_tick), now)
        } else {
            format!("{} to {}", time_full(Some(m.first_tick), now), time_full(Some(m.last_tick), now))
        };
        pairs.add(
            "last missed",
            format!(
                "{} tick(s) {span}, no worker fired them on time: {} caught up, {} skipped by catch_up, {} outside catch_up_window (told {})",
                m.count,
                m.caught_up,
                m.skipped,
                m.outside_window,
                relative(m.told_at, now)
            ),
        );
    }
    let mut out = pairs.render();
    if !detail.next_fires.is_empty() {
        out.push_str("\nnext fires:\n");
        out.push_str(&indent(&fires_table(&detail.next_fires, &job.timezone, now)));
        for day in &detail.calendar_days {
            out.push_str(&format!("note: {day}\n"));
        }
    }
    if !detail.recent_runs.is_empty() {
        out.push_str("\nrecent runs:\n");
        out.push_str(&indent(&brief_runs_table(&detail.recent_runs, now)));
    }
    out
}

fn job_state_detail(job: &JobSummary, now: DateTime<Utc>) -> String {
    let state = job_state(job);
    if let Some(reason) = &job.disabled {
        return format!("{state}: {reason}");
    }
    if !job.paused {
        return state.to_owned();
    }
    let mut text = state.to_owned();
    if let Some(since) = job.paused_at {
        text.push_str(&format!(" {}", relative(since, now)));
    }
    if let Some(reason) = &job.pause_reason {
        text.push_str(&format!(": {reason}"));
    }
    text
}

/// `{"succeeded": 12, "failed": 1}` as "failed 1, succeeded 12".
fn counts(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none yet".to_owned();
    }
    counts.iter().map(|(status, count)| format!("{status} {count}")).collect::<Vec<_>>().join(", ")
}

/// Upcoming fire times: in the job's own zone (named, each time with its offset), in UTC, and
/// relative. Not in the reader's local time: lampctl's machine is often not the worker's.
fn fires_table(fires: &[FireTime], timezone: &str, now: DateTime<Utc>) -> String {
    let zone = format!("IN {timezone}");
    let mut table = Table::new(&[zone.as_str(), "UTC", "WHEN"]);
    for fire in fires {
        table.push(vec![zoned(&fire.local), fire.utc.format("%Y-%m-%d %H:%M UTC").to_string(), relative(fire.utc, now)]);
    }
    table.render()
}

/// An RFC 3339 time in a job's zone as `Mon 2026-03-30 07:30 +02:00` (as given when it does
/// not parse).
fn zoned(local: &str) -> String {
    DateTime::parse_from_rfc3339(local).map_or_else(|_| local.to_owned(), |time| time.format("%a %Y-%m-%d %H:%M %:z").to_string())
}

/// `jobs next`.
pub(crate) fn next_fires(detail: &JobDetail, job: &str, now: DateTime<Utc>) -> String {
    if detail.next_fires.is_empty() {
        return format!("job \"{job}\" has no upcoming fire times ({})\n", job_state(&detail.summary));
    }
    fires_table(&detail.next_fires, &detail.summary.timezone, now)
}

/// `schedule preview`.
pub(crate) fn schedule_preview(p: &SchedulePreview, now: DateTime<Utc>) -> String {
    let mut out = format!("{} ({})\n", p.schedule, p.timezone);
    if p.next_fires.is_empty() {
        out.push_str("no upcoming fire times\n");
    } else {
        out.push_str(&fires_table(&p.next_fires, &p.timezone, now));
    }
    for note in &p.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    for warning in &p.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

fn brief_runs_table(runs: &[RunBrief], now: DateTime<Utc>) -> String {
    let mut table = Table::new(&["ID", "STATUS", "TRIGGER", "ENQUEUED", "FINISHED"]);
    for run in runs {
        table.push(vec![
            run.id.clone(),
            run.status.to_string(),
            run.trigger.as_str().to_owned(),
            when_short(run.enqueued_at, now),
            time_short(run.finished_at, now),
        ]);
    }
    table.render()
}

/// `jobs pause`.
pub(crate) fn paused(job: &JobSummary) -> String {
    let name = &job.name;
    let reason = job.pause_reason.as_ref().map(|reason| format!(" ({reason})")).unwrap_or_default();
    format!("job \"{name}\" paused{reason}; it stays paused across restarts\nresume it with: lampctl jobs resume {name}\n")
}

/// `jobs resume`.
pub(crate) fn resumed(job: &JobSummary, now: DateTime<Utc>) -> String {
    match job.next_fire {
        Some(next) => format!("job \"{}\" resumed; next fire {}\n", job.name, when_full(next, now)),
        None => format!("job \"{}\" resumed\n", job.name),
    }
}

/// `jobs pause --tag` and `jobs resume --tag`.
pub(crate) fn tag_changed(change: &TagChange, paused: bool, now: DateTime<Utc>) -> String {
    let (did, state) = if paused { ("paused", "paused already") } else { ("resumed", "not paused") };
    let tag = &change.tag;
    let mut out = format!("{did} {} of {} job(s) tagged \"{tag}\"", change.changed.len(), change.jobs.len());
    if !change.changed.is_empty() {
        out.push_str(&format!(": {}", change.changed.join(", ")));
    }
    let others: Vec<&str> = change.jobs.iter().map(|j| j.name.as_str()).filter(|n| !change.changed.iter().any(|c| c == n)).collect();
    if !others.is_empty() {
        out.push_str(&format!(" ({state}: {})", others.join(", ")));
    }
    out.push('\n');
    if paused {
        out.push_str(&format!("they stay paused across restarts; resume them with: lampctl jobs resume --tag {tag}\n"));
    } else {
        for job in change.jobs.iter().filter(|j| j.next_fire.is_some()) {
            out.push_str(&format!("  {}: next fire {}\n", job.name, job.next_fire.map(|n| when_full(n, now)).unwrap_or_default()));
        }
    }
    out
}

/// `jobs trigger --tag`.
pub(crate) fn tag_triggered(answer: &TagTriggered) -> String {
    let mut out = format!("triggered {} job(s) tagged \"{}\"\n", answer.runs.len(), answer.tag);
    let mut table = Table::new(&["JOB", "RUN"]);
    for run in &answer.runs {
        table.push(vec![run.job.clone(), run.run_id.clone()]);
    }
    if !answer.runs.is_empty() {
        out.push_str(&table.render());
    }
    for refused in &answer.refused {
        out.push_str(&format!("not started: job \"{}\": {}\n", refused.job, refused.reason));
    }
    if let Some(first) = answer.runs.first() {
        out.push_str(&format!("follow one with: lampctl runs follow {}\n", first.run_id));
    }
    out
}

/// `jobs trigger` and `workflows run` without `--wait`.
pub(crate) fn triggered(outcome: &TriggerOutcome, job: &str, idempotency_key: Option<&str>) -> String {
    let id = &outcome.run_id;
    let first = match (outcome.created, idempotency_key) {
        (false, Some(key)) => format!("job \"{job}\" was not triggered again: idempotency key \"{key}\" belongs to run {id}"),
        (false, None) => format!("job \"{job}\" was not triggered again: run {id} already answers this trigger"),
        (true, _) => format!("job \"{job}\" triggered: run {id}"),
    };
    format!("{first}\nfollow it with: lampctl runs follow {id}\n")
}

/// `runs list`.
pub(crate) fn runs(page: &RunPage, now: DateTime<Utc>) -> String {
    if page.runs.is_empty() {
        return "no runs\n".to_owned();
    }
    let mut table = Table::new(&["ID", "JOB", "STATUS", "TRIGGER", "STARTED", "DURATION"]);
    for run in &page.runs {
        table.push(vec![
            run.id.clone(),
            run.job.clone(),
            run.status.to_string(),
            run.trigger.as_str().to_owned(),
            match (&run.waiting_for, run.started_at) {
                // `waiting for limit "warehouse"`: who holds it is for `runs show`.
                (Some(why), None) => why.split(':').next().unwrap_or(why).to_owned(),
                _ => time_short(run.started_at, now),
            },
            took(run.started_at, run.finished_at, now),
        ]);
    }
    table.render()
}

/// How long something ran, or has run so far.
fn took(started: Option<DateTime<Utc>>, finished: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    match (started, finished) {
        (Some(started), Some(finished)) => duration(whole_seconds(finished - started)),
        (Some(started), None) => format!("{} so far", duration(whole_seconds(now - started))),
        _ => NONE.to_owned(),
    }
}

/// `runs show`, and the final run of `jobs trigger --wait` (a bare [`Run`], no steps).
pub(crate) fn run(detail: &RunDetail, now: DateTime<Utc>) -> String {
    let run = &detail.run;
    let mut pairs = Pairs::default();
    pairs.add("id", run.id.clone());
    pairs.add("job", run.job.clone());
    pairs.add_some("workflow", detail.workflow.clone());
    pairs.add("status", run.status.to_string());
    pairs.add_some("waiting", run.waiting_for.clone());
    pairs.add("trigger", run.trigger.as_str().to_owned());
    pairs.add_some("requested by", run.requested_by.clone());
    pairs.add("attempt", run.attempt.to_string());
    pairs.add_some("retry of", run.retry_of.clone());
    pairs.add_some("retried as", run.next_run_id.clone().filter(|next| !next.is_empty()));
    pairs.add_some("scheduled", run.scheduled_at.map(|time| when_full(time, now)));
    pairs.add("due", when_full(run.due_at, now));
    pairs.add("enqueued", when_full(run.enqueued_at, now));
    pairs.add("started", time_full(run.started_at, now));
    pairs.add("finished", time_full(run.finished_at, now));
    pairs.add("duration", took(run.started_at, run.finished_at, now));
    pairs.add_some("worker", run.worker.clone());
    pairs.add_some("trace", run.trace_id.clone());
    pairs.add_some("idempotency key", run.idempotency_key.clone());
    pairs.add_some("tokens", tokens(run));
    pairs.add_some("cost", run.cost.map(|cost| format!("{cost:.6}")));
    pairs.add_some("usage", detail.usage.as_ref().map(usage));
    pairs.add_some("input", run.input.as_ref().map(compact));
    pairs.add_some("parameters", run.parameters.as_ref().map(compact));
    pairs.add_some("error", run.error.clone());
    let mut out = pairs.render();
    if !detail.steps.is_empty() {
        out.push_str("\nsteps:\n");
        let mut table = steps_table();
        step_rows(&mut table, &detail.steps, 0, now);
        out.push_str(&indent(&table.render()));
    }
    if !detail.agent_waits.is_empty() {
        out.push_str("\nagent approvals:\n");
        let mut table = steps_table();
        for wait in &detail.agent_waits {
            let row = StepRow { id: &wait.step, step_type: "tool call", status: Some(wait.status), attempt: Some(wait.attempt) };
            table.push(row.cells(wait.started_at, wait.finished_at, wait.error.as_deref(), wait.output.as_ref(), 0, now));
        }
        out.push_str(&indent(&table.render()));
    }
    if !detail.deadlines_missed.is_empty() {
        out.push_str("\ndeadlines missed:\n");
        let mut table = Table::new(&["DEADLINE", "DUE", "TOLD", "LATE", "ACTION", "ATTEMPT"]);
        for d in &detail.deadlines_missed {
            table.push(vec![
                d.deadline.clone(),
                time_full(Some(d.due_at), now),
                time_full(Some(d.told_at), now),
                format!("{} s", d.late_seconds),
                d.action.clone(),
                d.run_id.clone(),
            ]);
        }
        out.push_str(&indent(&table.render()));
    }
    if !detail.notifications.is_empty() {
        out.push_str("\nnotifications:\n");
        let mut table = Table::new(&["EVENT", "TO", "STATUS", "ATTEMPTS", "WHEN", "RESULT"]);
        for n in &detail.notifications {
            let when = match n.status {
                NotificationStatus::Delivered => time_full(n.sent_at, now),
                NotificationStatus::Pending => n.next_at.map(|at| format!("next try {}", when_full(at, now))).unwrap_or_default(),
                _ => time_full(Some(n.created_at), now),
            };
            let result = n.delivered.clone().or_else(|| n.error.clone()).unwrap_or_else(|| NONE.to_owned());
            table.push(vec![n.event.clone(), n.target.clone(), n.status.as_str().to_owned(), n.attempts.to_string(), when, result]);
        }
        out.push_str(&indent(&table.render()));
    }
    if !detail.log.is_empty() {
        const TAIL: usize = 20;
        let skipped = detail.log.len().saturating_sub(TAIL);
        let what = if skipped > 0 {
            format!("log ({} lines, the last {TAIL}; -o json has them all):\n", detail.log.len())
        } else {
            "log:\n".into()
        };
        out.push('\n');
        out.push_str(&what);
        for line in &detail.log[skipped..] {
            out.push_str(&log_line(line));
        }
    }
    if let Some(output) = &run.output {
        out.push_str("\noutput:\n");
        let text = match output {
            Value::String(text) => text.trim_end().to_owned(),
            other => serde_json::to_string_pretty(other).unwrap_or_default(),
        };
        out.push_str(&indent(&text));
    }
    out
}

/// A run without the detail `get_run` adds, as `trigger_job … wait` returns it.
pub(crate) fn bare(run: Run) -> RunDetail {
    RunDetail {
        run,
        workflow: None,
        steps: Vec::new(),
        agent_waits: Vec::new(),
        calls: Vec::new(),
        usage: None,
        notifications: Vec::new(),
        deadlines_missed: Vec::new(),
        log: Vec::new(),
    }
}

/// `runs follow`: the run when first shown, then one line per change: the run's status, each
/// workflow step and agent wait that moved, and how the run ended.
pub(crate) fn progress(before: Option<&RunDetail>, now_detail: &RunDetail, now: DateTime<Utc>) -> String {
    let run = &now_detail.run;
    let mut out = String::new();
    match before {
        None => out.push_str(&format!("run {} (job {}, {} trigger): {}\n", run.id, run.job, run.trigger.as_str(), run.status)),
        Some(b) if b.run.status != run.status && !run.status.is_final() => out.push_str(&format!("run {}: {}\n", run.id, run.status)),
        Some(_) => {}
    }
    let was = before.map(moves).unwrap_or_default();
    for (name, status, line) in moves(now_detail) {
        if !was.iter().any(|(n, s, _)| *n == name && *s == status) {
            out.push_str(&line);
        }
    }
    let shown = before.and_then(|b| b.log.last()).map_or(0, |l| l.seq);
    for line in now_detail.log.iter().filter(|l| l.seq > shown) {
        out.push_str(&log_line(line));
    }
    if run.status == RunStatus::WaitingApproval && before.is_none_or(|b| b.run.status != run.status) {
        out.push_str(&format!("  approve it with: lampctl approvals approve {}\n", run.id));
    }
    if run.status.is_final() {
        let took = took(run.started_at, run.finished_at, now);
        let error = run.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default();
        out.push_str(&format!("run {} {} after {took}{error}\n", run.id, run.status));
    }
    out
}

/// Between two attempts of a followed run: the one that ended and the retry followed next.
pub(crate) fn retrying(ended: &Run, next: &str) -> String {
    format!("attempt {} {}; a retry is scheduled: following run {next} (attempt {})", ended.attempt, ended.status, ended.attempt + 1)
}

/// Each step and agent wait that has a status: (its name, its status, the line that shows it).
fn moves(detail: &RunDetail) -> Vec<(String, String, String)> {
    fn walk(out: &mut Vec<(String, String, String)>, steps: &[StepView], prefix: &str) {
        for step in steps {
            let name = format!("{prefix}{}", step.id);
            if let Some(status) = step.status {
                let took = match (step.started_at, step.finished_at) {
                    (Some(s), Some(f)) => format!(" after {}", duration(whole_seconds(f - s))),
                    _ => String::new(),
                };
                let error = step.error.as_ref().map(|e| format!(": {}", truncate(e, MAX_CELL))).unwrap_or_default();
                out.push((name.clone(), status.to_string(), format!("  step {name}: {status}{took}{error}\n")));
            }
            walk(out, &step.steps, &format!("{name}/"));
        }
    }
    let mut out = Vec::new();
    walk(&mut out, &detail.steps, "");
    for wait in &detail.agent_waits {
        out.push((format!("wait {}", wait.step), wait.status.to_string(), format!("  agent wait {}: {}\n", wait.step, wait.status)));
    }
    for call in &detail.calls {
        let at = if call.conversation.is_empty() { String::new() } else { format!(" ({})", call.conversation) };
        let line = match (call.kind, &call.error) {
            (CallKind::Model, None) => {
                format!("  model call {}{at}: {} tokens in / {} out\n", call.name, call.input_tokens, call.output_tokens)
            }
            (CallKind::Tool, None) => format!("  tool call {}{at}: ok\n", call.name),
            (_, Some(e)) => format!("  {} call {}{at}: {}\n", call.kind.as_str(), call.name, truncate(e, MAX_CELL)),
        };
        out.push((format!("call {}/{}", call.conversation, call.seq), call.run_id.clone(), line));
    }
    out
}

/// A line of a run's live output as `runs follow` prints it: `  │ ` before what the command
/// wrote to stdout, `  ! ` before stderr, `  … ` before the worker's own notes.
fn log_line(line: &OutputLine) -> String {
    let mark = match line.stream.as_str() {
        "stdout" => "│",
        "stderr" => "!",
        _ => "…",
    };
    format!("  {mark} {}\n", line.text)
}

/// An agent run's usage: `2 model calls, 1 tool call, 20 tokens in / 10 out, cost 0.00004`.
fn usage(u: &AgentUsage) -> String {
    let plural = |count: u64, what: &str| format!("{count} {what}{}", if count == 1 { "" } else { "s" });
    let mut text = format!(
        "{}, {}, {} tokens in / {} out",
        plural(u.model_calls, "model call"),
        plural(u.tool_calls, "tool call"),
        u.input_tokens,
        u.output_tokens
    );
    if let Some(cost) = u.cost {
        text.push_str(&format!(", cost {cost:.6}"));
    }
    text
}

fn tokens(run: &Run) -> Option<String> {
    if run.tokens_in.is_none() && run.tokens_out.is_none() {
        return None;
    }
    let show = |count: Option<i64>| count.map_or_else(|| NONE.to_owned(), |n| n.to_string());
    Some(format!("{} in, {} out", show(run.tokens_in), show(run.tokens_out)))
}

/// `runs show --transcript`: every model and tool call of the run's agents, by conversation.
pub(crate) fn transcript(detail: &RunDetail) -> String {
    if detail.calls.is_empty() {
        return "transcript: no agent calls\n".to_owned();
    }
    let mut out = String::from("transcript:\n");
    let mut conversation = None;
    for call in &detail.calls {
        let conv = call.conversation.as_str();
        if conversation != Some(conv) {
            out.push_str(&format!("  [{}]\n", if conv.is_empty() { "agent" } else { conv }));
            conversation = Some(conv);
        }
        let name = &call.name;
        let took = (call.finished_at - call.started_at).num_milliseconds();
        match call.kind {
            CallKind::Model => {
                let cost = call.cost.map(|c| format!(", cost {c:.6}")).unwrap_or_default();
                out.push_str(&format!("    model {name} ({} in / {} out{cost}, {took} ms)\n", call.input_tokens, call.output_tokens));
                let response = call.response.as_ref().unwrap_or(&Value::Null);
                if let Some(text) = response.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
                    out.push_str(&indent_by(text.trim_end(), 6));
                }
                // The model's reply as recorded: tool calls name the configured tool.
                for tc in response.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    // `tool` is null when the model named a tool it was not offered: its wire name then.
                    let tool = tc.get("tool").and_then(Value::as_str).or_else(|| tc.get("name").and_then(Value::as_str)).unwrap_or("?");
                    let args = tc.get("arguments").and_then(Value::as_str).unwrap_or("");
                    out.push_str(&format!("      → {tool} {}\n", truncate(args, 200)));
                }
            }
            CallKind::Tool => {
                let failed = if call.error.is_some() { " failed" } else { "" };
                out.push_str(&format!("    tool {name}{failed} ({}, {took} ms)\n", or_none(call.call_id.as_deref())));
                let result = match (&call.error, &call.response) {
                    (Some(error), _) => error.clone(),
                    (None, Some(response)) => response.as_str().map_or_else(|| compact(response), str::to_owned),
                    (None, None) => String::new(),
                };
                out.push_str(&format!("      ← {}\n", truncate(&result.replace('\n', " "), 300)));
            }
        }
    }
    out
}

fn indent_by(text: &str, n: usize) -> String {
    text.lines().map(|l| format!("{}{l}\n", " ".repeat(n))).collect()
}

fn steps_table() -> Table {
    Table::new(&["STEP", "TYPE", "STATUS", "ATTEMPT", "STARTED", "DURATION", "OUTPUT / ERROR"])
}

/// What a step row shows besides its times and result.
struct StepRow<'a> {
    id: &'a str,
    step_type: &'a str,
    status: Option<StepStatus>,
    attempt: Option<u32>,
}

impl StepRow<'_> {
    fn cells(
        &self,
        started: Option<DateTime<Utc>>,
        finished: Option<DateTime<Utc>>,
        error: Option<&str>,
        output: Option<&Value>,
        depth: usize,
        now: DateTime<Utc>,
    ) -> Vec<String> {
        let detail = match (error, output) {
            (Some(error), _) => truncate(error, MAX_CELL),
            (None, Some(output)) => truncate(&compact(output), MAX_CELL),
            (None, None) => NONE.to_owned(),
        };
        vec![
            format!("{}{}", "  ".repeat(depth), self.id),
            self.step_type.to_owned(),
            self.status.map_or_else(|| "pending".to_owned(), |s| s.to_string()),
            self.attempt.map_or_else(|| NONE.to_owned(), |a| a.to_string()),
            time_short(started, now),
            if started.is_some() { took(started, finished, now) } else { NONE.to_owned() },
            detail,
        ]
    }
}

/// A workflow run's steps as a tree: a `parallel`'s children indented under it.
fn step_rows(table: &mut Table, steps: &[StepView], depth: usize, now: DateTime<Utc>) {
    for step in steps {
        let row = StepRow { id: &step.id, step_type: &step.step_type, status: step.status, attempt: step.attempt };
        table.push(row.cells(step.started_at, step.finished_at, step.error.as_deref(), step.output.as_ref(), depth, now));
        step_rows(table, &step.steps, depth + 1, now);
    }
}

/// `runs cancel`.
pub(crate) fn cancelled(run: &Run) -> String {
    match run.status {
        RunStatus::Cancelled => format!("run {} cancelled\n", run.id),
        status => format!("run {}: cancellation requested; it is {status} until it stops\n", run.id),
    }
}

/// `approvals list`.
pub(crate) fn approvals(list: &ApprovalList, now: DateTime<Utc>) -> String {
    if list.approvals.is_empty() {
        return "no steps are waiting for approval\n".to_owned();
    }
    let mut table = Table::new(&["RUN", "JOB", "STEP", "WAITING SINCE", "TIMEOUT", "QUESTION"]);
    for a in &list.approvals {
        let timeout = match (a.timeout_at, &a.on_timeout) {
            (Some(at), Some(then)) => format!("{}, then {then}", when_short(at, now)),
            (Some(at), None) => when_short(at, now),
            (None, _) => NONE.to_owned(),
        };
        table.push(vec![
            a.run_id.clone(),
            a.job.clone(),
            a.step.clone(),
            time_short(a.waiting_since, now),
            timeout,
            a.question.as_ref().map_or_else(|| NONE.to_owned(), |q| truncate(&compact(q), MAX_CELL)),
        ]);
    }
    table.render()
}

/// `limits list`: a line per key of each limit (one for a limit without keys).
pub(crate) fn limits(list: &LimitList, now: DateTime<Utc>) -> String {
    if list.limits.is_empty() {
        return "no limits are configured (scheduling.limits)\n".to_owned();
    }
    let mut table = Table::new(&["LIMIT", "KEY", "HELD", "WAITING", "WAITING SINCE", "HOLDERS"]);
    for limit in &list.limits {
        let slots = limit.slots.map_or_else(|| "no longer configured".to_owned(), |n| n.to_string());
        if limit.keys.is_empty() {
            table.push(vec![limit.name.clone(), NONE.to_owned(), format!("0/{slots}"), "0".to_owned(), NONE.to_owned(), NONE.to_owned()]);
        }
        for key in &limit.keys {
            table.push(vec![
                limit.name.clone(),
                if key.key.is_empty() { NONE.to_owned() } else { key.key.clone() },
                format!("{}/{slots}", key.holders.len()),
                key.waiting_count.to_string(),
                time_short(key.waiting_since, now),
                truncate(&key.holders.join(", "), MAX_CELL),
            ]);
        }
    }
    table.render()
}

/// `approvals approve` and `approvals reject`.
pub(crate) fn decision(d: &Decision) -> String {
    let verb = if d.approved { "approved" } else { "rejected" };
    format!("{verb} step \"{}\" of run {}; the run is now {}\n", d.step, d.run_id, d.run_status)
}

/// `workflows list`.
pub(crate) fn workflows(list: &WorkflowList) -> String {
    if list.workflows.is_empty() {
        return "no workflows\n".to_owned();
    }
    let mut table = Table::new(&["NAME", "STEPS", "DESCRIPTION"]);
    for w in &list.workflows {
        let description = match &w.disabled {
            Some(why) => format!("disabled: {why}"),
            None => or_none(w.description.as_deref()),
        };
        table.push(vec![w.name.clone(), step_chain(&w.steps), description]);
    }
    table.render()
}

/// `fetch → check → [a | b] → publish`: step ids in order, a parallel's children in brackets.
fn step_chain(steps: &[StepOutline]) -> String {
    fn entry(s: &StepOutline) -> String {
        if s.steps.is_empty() { s.id.clone() } else { format!("[{}]", s.steps.iter().map(entry).collect::<Vec<_>>().join(" | ")) }
    }
    steps.iter().map(entry).collect::<Vec<_>>().join(" → ")
}

/// `agents list`.
pub(crate) fn agents(list: &AgentList) -> String {
    if list.agents.is_empty() {
        return "no agents\n".to_owned();
    }
    let mut table = Table::new(&["NAME", "MODEL", "PROVIDER", "TOOLS", "ENABLED"]);
    for a in &list.agents {
        let model = match (&a.model, &a.model_id) {
            (Some(alias), Some(id)) if alias != id => format!("{alias} ({id})"),
            (Some(alias), _) => alias.clone(),
            (None, Some(id)) => id.clone(),
            (None, None) => NONE.to_owned(),
        };
        let enabled = match &a.disabled {
            Some(why) => format!("no: {why}"),
            None => "yes".to_owned(),
        };
        table.push(vec![a.name.clone(), model, or_none(a.provider.as_deref()), truncate(&joined(&a.tools), MAX_CELL), enabled]);
    }
    table.render()
}

/// `plugins list`.
pub(crate) fn plugins(list: &PluginList) -> String {
    if list.plugins.is_empty() {
        return "no plugins\n".to_owned();
    }
    let mut table = Table::new(&["NAME", "VERSION", "TYPE", "STATUS", "ACTIONS"]);
    for p in &list.plugins {
        let actions: Vec<String> = p.actions.iter().map(|a| a.name.clone()).collect();
        table.push(vec![
            p.name.clone(),
            or_none(Some(&p.version)),
            p.kind.clone(),
            p.error.as_ref().map_or_else(|| "loaded".to_owned(), |e| truncate(&format!("failed: {e}"), MAX_CELL)),
            truncate(&joined(&actions), MAX_CELL),
        ]);
    }
    table.render()
}

/// `config reload`.
pub(crate) fn reloaded(summary: &ReloadSummary) -> String {
    let mut out = format!("configuration reloaded: {} jobs\n", summary.jobs);
    for warning in &summary.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

/// `tools list`, from the tools as `tools/list` carries them.
pub(crate) fn tools(tools: &[Tool]) -> String {
    if tools.is_empty() {
        return "the worker offers no tools\n".to_owned();
    }
    let mut table = Table::new(&["NAME", "HINTS", "DESCRIPTION"]);
    for tool in tools {
        let hints = tool.annotations.as_ref();
        let hints: Vec<&str> =
            [(hints.and_then(|h| h.read_only_hint), "read-only"), (hints.and_then(|h| h.destructive_hint), "destructive")]
                .into_iter()
                .filter(|&(on, _)| on == Some(true))
                .map(|(_, label)| label)
                .collect();
        let description = tool.description.as_deref().and_then(|text| text.lines().next()).unwrap_or(NONE);
        table.push(vec![
            tool.name.to_string(),
            if hints.is_empty() { NONE.to_owned() } else { hints.join(", ") },
            truncate(description, 70),
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use lamplighter_contract::{AfterView, UpstreamOutcome};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 5, 4, 12, 0, 0).unwrap()
    }

    fn at(seconds_from_now: i64) -> DateTime<Utc> {
        now() + TimeDelta::seconds(seconds_from_now)
    }

    #[test]
    fn relative_times_use_one_unit_rounded_toward_zero() {
        let cases = [
            (0, "now"),
            (59, "in 59s"),
            (-1, "1s ago"),
            (60, "in 1m"),
            (-5 * 60, "5m ago"),
            (3 * 3_600, "in 3h"),
            (3 * 3_600 + 59 * 60, "in 3h"),
            (-26 * 3_600, "1d ago"),
            (9 * 86_400, "in 9d"),
        ];
        for (offset, expected) in cases {
            assert_eq!(relative(at(offset), now()), expected, "{offset}s");
        }
    }

    #[test]
    fn durations_use_two_units() {
        let cases = [(0, "0s"), (45, "45s"), (90, "1m30s"), (120, "2m"), (3_600, "1h"), (7_260, "2h1m"), (86_400 + 3 * 3_600, "1d3h")];
        for (seconds, expected) in cases {
            assert_eq!(duration(seconds), expected, "{seconds}");
        }
    }

    #[test]
    fn tables_align_columns_and_leave_the_last_unpadded() {
        let mut table = Table::new(&["NAME", "STATE", "NOTE"]);
        table.push(vec!["nightly-review".into(), "active".into(), "".into()]);
        table.push(vec!["a".into(), "paused".into(), "line\nbreak".into()]);
        table.push(vec!["short".into()]);
        assert_eq!(
            table.render(),
            "NAME            STATE   NOTE\n\
             nightly-review  active\n\
             a               paused  line break\n\
             short           -       -\n"
        );
    }

    #[test]
    fn pairs_align_values() {
        let mut pairs = Pairs::default();
        pairs.add("id", "r1".into());
        pairs.add("max retries", "2".into());
        pairs.add_some("absent", None);
        assert_eq!(pairs.render(), "id:           r1\nmax retries:  2\n");
    }

    fn summary(name: &str) -> JobSummary {
        JobSummary {
            name: name.into(),
            description: None,
            target_type: "workflow".into(),
            target: "workflow review".into(),
            schedule: Some("cron: 0 2 * * *".into()),
            timezone: "Europe/Berlin".into(),
            enabled: true,
            disabled: None,
            paused: false,
            pause_reason: None,
            paused_at: None,
            next_fire: Some(at(3 * 3_600)),
            last_run: None,
            origin: JobOrigin::File { location: Some("lamplighter.yaml:12:5".into()) },
            tags: Vec::new(),
        }
    }

    fn brief(id: &str, status: RunStatus, finished: Option<i64>) -> RunBrief {
        RunBrief {
            id: id.into(),
            status,
            trigger: lamplighter_contract::Trigger::Cron,
            enqueued_at: at(-600),
            finished_at: finished.map(at),
        }
    }

    fn a_run(status: RunStatus) -> Run {
        Run {
            id: "r9".into(),
            job: "nightly".into(),
            trigger: lamplighter_contract::Trigger::Manual,
            status,
            scheduled_at: None,
            due_at: at(-100),
            enqueued_at: at(-100),
            started_at: Some(at(-90)),
            finished_at: Some(at(0)),
            attempt: 2,
            input: None,
            parameters: None,
            output: None,
            error: None,
            worker: None,
            idempotency_key: None,
            root_id: "r9".into(),
            retry_of: None,
            next_run_id: None,
            tokens_in: None,
            tokens_out: None,
            cost: None,
            trace_id: None,
            requested_by: None,
            waiting_for: None,
        }
    }

    #[test]
    fn jobs_show_state_next_fire_and_last_run() {
        let mut job = summary("nightly");
        job.last_run = Some(brief("r1", RunStatus::Succeeded, Some(-5 * 60)));
        let mut adhoc = summary("adhoc");
        (adhoc.schedule, adhoc.paused, adhoc.next_fire) = (None, true, None);
        let mut broken = summary("broken");
        broken.disabled = Some("plugin \"x\" did not load".into());
        let text = jobs(&[job, adhoc, broken], now());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("NAME     TARGET           SCHEDULE         STATE        NEXT FIRE"), "{}", lines[0]);
        assert!(lines[1].starts_with("nightly  workflow review  cron: 0 2 * * *  active       "), "{}", lines[1]);
        assert!(lines[1].contains("(in 3h)"), "{}", lines[1]);
        assert!(lines[1].ends_with("succeeded 5m ago"), "{}", lines[1]);
        assert!(lines[2].starts_with("adhoc    workflow review  manual           paused       -"), "{}", lines[2]);
        assert!(lines[3].contains("unavailable"), "{}", lines[3]);
        assert_eq!(jobs(&[], now()), "no jobs\n");
    }

    #[test]
    fn job_detail_lists_fire_times_and_counts() {
        let mut paused = summary("nightly");
        (paused.paused, paused.pause_reason, paused.paused_at, paused.next_fire) =
            (true, Some("db migration".into()), Some(at(-2 * 3_600)), None);
        let detail = JobDetail {
            calendar_days: Vec::new(),
            summary: paused,
            next_fires: vec![FireTime { utc: at(3_600), local: "2026-05-04T15:00:00+02:00".into() }],
            counts: [("failed".to_owned(), 1), ("succeeded".to_owned(), 12)].into_iter().collect(),
            recent_runs: vec![brief("r1", RunStatus::Failed, None)],
            catch_up: "skip".into(),
            overlap: "skip".into(),
            timeout_seconds: Some(5_400),
            max_retries: 0,
            definition: None,
            history: Vec::new(),
            after: Some(AfterView {
                jobs: vec!["extract".into(), "load".into()],
                on: "success".into(),
                within_seconds: Some(43_200),
                pending: vec![UpstreamOutcome {
                    job: "extract".into(),
                    run_id: "r0".into(),
                    status: "succeeded".into(),
                    finished_at: at(-600),
                    expires_at: Some(at(42_600)),
                }],
                expired: vec![UpstreamOutcome {
                    job: "load".into(),
                    run_id: "r1".into(),
                    status: "succeeded".into(),
                    finished_at: at(-86_400),
                    expires_at: Some(at(-43_200)),
                }],
                waiting_for: vec!["load".into()],
            }),
            downstream: vec!["publish".into()],
            last_missed: Some(lamplighter_contract::MissedTicks {
                first_tick: at(-7200),
                last_tick: at(-3600),
                count: 2,
                caught_up: 1,
                skipped: 1,
                outside_window: 0,
                told_at: at(-60),
            }),
        };
        let text = job(&detail, now());
        assert!(text.contains("upstream:     waits for load\n"), "{text}");
        assert!(text.contains("  pending:    extract run r0 succeeded 10m ago, counts until "), "{text}");
        assert!(text.contains("downstream:   publish\n"), "{text}");
        assert!(
            text.contains("2 tick(s) ")
                && text
                    .contains("no worker fired them on time: 1 caught up, 1 skipped by catch_up, 0 outside catch_up_window (told 1m ago)"),
            "{text}"
        );
        assert!(text.contains("  expired:    load run r1 succeeded 1d ago: waited out its window, nothing ran\n"), "{text}");
        assert!(text.contains("schedule:     cron: 0 2 * * * (Europe/Berlin)\n"), "{text}");
        assert!(text.contains("state:        paused 2h ago: db migration\n"), "{text}");
        assert!(text.contains("timeout:      1h30m\n"), "{text}");
        assert!(text.contains("runs:         failed 1, succeeded 12\n"), "{text}");
        assert!(text.contains("next fire:    -\n"), "{text}");
        assert!(text.contains("in 1h"), "{text}");
        assert!(text.contains("2026-05-04 15:00 +02:00"), "{text}");
        assert!(text.contains("\nrecent runs:\n  ID"), "{text}");
    }

    #[test]
    fn a_run_shows_its_output_error_and_steps_as_a_tree() {
        let mut r = a_run(RunStatus::Failed);
        (r.error, r.output, r.tokens_in) = (Some("step \"load\" timed out".into()), Some(serde_json::json!({"rows": 3})), Some(10));
        let step = |id: &str, status: Option<StepStatus>, steps: Vec<StepView>| StepView {
            id: id.into(),
            step_type: if steps.is_empty() { "plugin".into() } else { "parallel".into() },
            status,
            attempt: status.map(|_| 2),
            started_at: status.map(|_| at(-60)),
            finished_at: None,
            output: None,
            error: None,
            steps,
        };
        let mut detail = bare(r);
        detail.steps =
            vec![step("fan", Some(StepStatus::Running), vec![step("a", Some(StepStatus::Running), vec![]), step("b", None, vec![])])];
        let text = run(&detail, now());
        assert!(text.contains("duration:  1m30s\n"), "{text}");
        assert!(text.contains("error:     step \"load\" timed out\n"), "{text}");
        assert!(text.contains("tokens:    10 in, - out\n"), "{text}");
        assert!(text.contains("\n    a   plugin    running  2  "), "{text}");
        assert!(text.contains("\n    b   plugin    pending  -  "), "{text}");
        assert!(text.ends_with("output:\n  {\n    \"rows\": 3\n  }\n"), "{text}");
    }

    #[test]
    fn progress_shows_the_run_once_then_only_what_moved() {
        let step = |id: &str, status: Option<StepStatus>| StepView {
            id: id.into(),
            step_type: "plugin".into(),
            status,
            attempt: None,
            started_at: None,
            finished_at: None,
            output: None,
            error: None,
            steps: vec![],
        };
        let mut first = bare(a_run(RunStatus::Running));
        first.steps = vec![step("a", Some(StepStatus::Succeeded)), step("b", Some(StepStatus::Running)), step("c", None)];
        assert_eq!(
            progress(None, &first, now()),
            "run r9 (job nightly, manual trigger): running\n  step a: succeeded\n  step b: running\n"
        );
        let mut waiting = first.clone();
        waiting.run.status = RunStatus::WaitingApproval;
        waiting.steps[1].status = Some(StepStatus::WaitingApproval);
        assert_eq!(
            progress(Some(&first), &waiting, now()),
            "run r9: waiting_approval\n  step b: waiting_approval\n  approve it with: lampctl approvals approve r9\n"
        );
        let mut done = waiting.clone();
        (done.run.status, done.run.error) = (RunStatus::Failed, Some("rejected".into()));
        done.steps[1].status = Some(StepStatus::Failed);
        assert_eq!(progress(Some(&waiting), &done, now()), "  step b: failed\nrun r9 failed after 1m30s: rejected\n");
    }

    #[test]
    fn trigger_and_cancel_messages_name_the_run() {
        let outcome = |created| TriggerOutcome { run_id: "r1".into(), created, run: None, finished: false, note: None };
        assert_eq!(
            triggered(&outcome(true), "nightly", None),
            "job \"nightly\" triggered: run r1\nfollow it with: lampctl runs follow r1\n"
        );
        assert!(triggered(&outcome(false), "nightly", Some("k")).contains("idempotency key \"k\" belongs to run r1"));
        assert_eq!(cancelled(&a_run(RunStatus::Cancelled)), "run r9 cancelled\n");
        assert!(cancelled(&a_run(RunStatus::Running)).contains("it is running until it stops"));
    }

    #[test]
    fn workflows_show_parallel_steps_in_brackets() {
        let outline = |id: &str, steps: Vec<StepOutline>| StepOutline {
            id: id.into(),
            step_type: "plugin".into(),
            does: String::new(),
            when: None,
            steps,
        };
        let w = lamplighter_contract::WorkflowInfo {
            name: "publish".into(),
            description: None,
            trigger: None,
            steps: vec![
                outline("fetch", vec![]),
                outline("fan", vec![outline("a", vec![]), outline("b", vec![outline("c", vec![])])]),
                outline("done", vec![]),
            ],
            disabled: None,
        };
        let text = workflows(&WorkflowList { workflows: vec![w] });
        assert!(text.contains("publish  fetch → [a | [c]] → done  -"), "{text}");
    }

    #[test]
    fn exported_yaml_reads_back_as_the_same_definitions() {
        let tricky = serde_json::json!({
            "cron": "30 7 * * 1-5",
            "description": "a: b # not a comment\n\ttab \u{7f} \u{85} \u{2028} \"quoted\" 'single' \\",
            "parameters": {"123": 1, "true": false, "null": null, "yes": "no", "": "empty key", "list": [{"a": 1, "b": [1, "x"]}, "s", []], "obj": {}},
            "input": [[1, 2], {"k": "v"}],
        });
        let jobs = vec![
            ("news-digest".to_owned(), tricky.clone()),
            ("123".to_owned(), serde_json::json!({"every": "1h"})),
            ("true".to_owned(), serde_json::json!({"at": "2026-12-01T00:00:00Z"})),
        ];
        let yaml = export(&jobs);
        let back: Value = serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{e}:\n{yaml}"));
        let read = &back["scheduling"]["jobs"];
        assert_eq!(read["news-digest"], tricky, "{yaml}");
        assert_eq!(read["123"], serde_json::json!({"every": "1h"}), "{yaml}");
        assert_eq!(read["true"], serde_json::json!({"at": "2026-12-01T00:00:00Z"}), "{yaml}");
    }
}
