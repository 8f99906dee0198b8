//! What people read: aligned tables, key-value blocks, and times in local time with a
//! relative hint ("in 3h", "5m ago"). The worker's JSON is read tolerantly: a field it does
//! not send is shown as "-", a list may come bare or inside an object, and fields this
//! version does not know are left to `-o json`.

use chrono::{DateTime, Datelike, Local, TimeDelta, Utc};
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
// Reading the worker's JSON

/// The first of `keys` that is present and not null.
fn get<'a>(value: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().filter_map(|key| value.get(*key)).find(|found| !found.is_null())
}

/// The first of `keys` as text, or "-".
fn cell(value: &Value, keys: &[&str]) -> String {
    get(value, keys).map_or_else(|| NONE.to_owned(), scalar)
}

/// The entries of a list the worker sends either bare (`[...]`) or inside an object
/// (`{"jobs": [...]}`; failing `key`, the object's first list).
pub(crate) fn items<'a>(value: &'a Value, key: &str) -> Vec<&'a Value> {
    match value {
        Value::Array(list) => list.iter().collect(),
        Value::Object(map) => match map.get(key) {
            Some(Value::Array(list)) => list.iter().collect(),
            _ => map.values().find_map(Value::as_array).map(|list| list.iter().collect()).unwrap_or_default(),
        },
        _ => Vec::new(),
    }
}

/// Only `value[key]` as a list (no fallback to another field).
fn list_at<'a>(value: &'a Value, key: &str) -> Vec<&'a Value> {
    value.get(key).and_then(Value::as_array).map(|list| list.iter().collect()).unwrap_or_default()
}

/// A value as a person reads it: strings as they are, lists joined, objects as JSON.
pub(crate) fn scalar(value: &Value) -> String {
    match value {
        Value::Null => NONE.to_owned(),
        Value::String(text) if text.is_empty() => NONE.to_owned(),
        Value::String(text) => text.clone(),
        Value::Bool(true) => "yes".to_owned(),
        Value::Bool(false) => "no".to_owned(),
        Value::Number(number) => number.to_string(),
        Value::Array(list) if list.is_empty() => "none".to_owned(),
        Value::Array(list) => list.iter().map(list_entry).collect::<Vec<_>>().join(", "),
        Value::Object(_) => compact(value),
    }
}

/// A list entry: a string or number as is, an object by its name when it has one.
fn list_entry(value: &Value) -> String {
    match value {
        Value::Object(_) => get(value, &["name", "id"]).map_or_else(|| compact(value), scalar),
        other => scalar(other),
    }
}

/// A value on one line: strings as they are, anything else as compact JSON.
fn compact(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => truncate(&serde_json::to_string(other).unwrap_or_default(), MAX_INLINE_JSON),
    }
}

/// Table cells for lists whose shape lampctl only partly knows: times are recognised and
/// shown as times; everything is cut to [`MAX_CELL`].
fn table_value(value: &Value, now: DateTime<Utc>) -> String {
    match parse_time(value) {
        Some(time) => when_short(time, now),
        None => truncate(&scalar(value), MAX_CELL),
    }
}

/// The same for key-value lines.
fn detail_value(value: &Value, now: DateTime<Utc>) -> String {
    match parse_time(value) {
        Some(time) => when_full(time, now),
        None => scalar(value),
    }
}

// ---------------------------------------------------------------------------------------
// Times

/// An RFC 3339 string as an instant.
pub(crate) fn parse_time(value: &Value) -> Option<DateTime<Utc>> {
    let text = value.as_str()?;
    DateTime::parse_from_rfc3339(text).ok().map(|time| time.with_timezone(&Utc))
}

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

/// The run in a tool's answer: `trigger_job` wraps it as `{"run": …}`, the others send it bare.
pub(crate) fn run_of(value: &Value) -> &Value {
    value.get("run").filter(|run| run.is_object()).unwrap_or(value)
}

/// A time field for a table: "-" when absent, the text as sent when it is not a time.
pub(crate) fn when(value: Option<&Value>, now: DateTime<Utc>) -> String {
    match value {
        None | Some(Value::Null) => NONE.to_owned(),
        Some(value) => parse_time(value).map_or_else(|| scalar(value), |time| when_short(time, now)),
    }
}

/// A time field for a key-value block.
fn when_detail(value: Option<&Value>, now: DateTime<Utc>) -> String {
    value.map_or_else(|| NONE.to_owned(), |value| detail_value(value, now))
}

// ---------------------------------------------------------------------------------------
// Views, one per command

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

/// `status`.
pub(crate) fn status(value: &Value, now: DateTime<Utc>) -> String {
    const SHOWN: [&str; 10] =
        ["worker", "name", "version", "started_at", "uptime_seconds", "jobs", "running", "queue_depth", "storage", "workers"];
    let mut pairs = Pairs::default();
    pairs.add("worker", cell(value, &["worker", "name"]));
    pairs.add("version", cell(value, &["version"]));
    pairs.add("started", when_detail(value.get("started_at"), now));
    pairs.add("uptime", value.get("uptime_seconds").and_then(Value::as_u64).map_or_else(|| NONE.to_owned(), duration));
    pairs.add("jobs", cell(value, &["jobs"]));
    pairs.add("running", cell(value, &["running"]));
    pairs.add("queue depth", cell(value, &["queue_depth"]));
    pairs.add("storage", cell(value, &["storage"]));
    if let Some(map) = value.as_object() {
        for (key, extra) in map.iter().filter(|(key, _)| !SHOWN.contains(&key.as_str())) {
            pairs.add(&key.replace('_', " "), detail_value(extra, now));
        }
    }
    let mut out = pairs.render();
    // The workers sharing the database (one on SQLite) and what each runs.
    let workers = items(value, "workers");
    if !workers.is_empty() {
        let mut table = Table::new(&["WORKER", "HOST", "PID", "HEARTBEAT", "RUNNING"]);
        for w in workers {
            let running = w.get("running").and_then(Value::as_array).map_or(0, Vec::len);
            table.push(vec![
                cell(w, &["name"]),
                cell(w, &["host"]),
                cell(w, &["pid"]),
                when(w.get("heartbeat_at"), now),
                running.to_string(),
            ]);
        }
        out.push('\n');
        out.push_str(&table.render());
    }
    out
}

/// `jobs list`.
pub(crate) fn jobs(value: &Value, now: DateTime<Utc>) -> String {
    let jobs = items(value, "jobs");
    if jobs.is_empty() {
        return "no jobs\n".to_owned();
    }
    let mut table = Table::new(&["NAME", "TARGET", "SCHEDULE", "STATE", "NEXT FIRE", "LAST RUN"]);
    for job in jobs {
        table.push(vec![
            cell(job, &["name"]),
            truncate(&cell(job, &["target", "target_type"]), MAX_CELL),
            schedule(job),
            job_state(job),
            when(job.get("next_fire"), now),
            last_run(job.get("last_run"), now),
        ]);
    }
    table.render()
}

/// A job's schedule; a job the worker sends with `schedule: null` fires only when triggered.
fn schedule(job: &Value) -> String {
    match job.get("schedule") {
        Some(Value::Null) => "manual".to_owned(),
        Some(schedule) => scalar(schedule),
        None => NONE.to_owned(),
    }
}

fn job_state(job: &Value) -> String {
    let paused = job.get("paused").and_then(Value::as_bool);
    let enabled = job.get("enabled").and_then(Value::as_bool);
    // The worker cannot run it (e.g. its plugin did not load): the strongest state.
    if job.get("disabled").is_some_and(Value::is_string) {
        return "unavailable".to_owned();
    }
    let state = match (paused, enabled) {
        (Some(true), _) => "paused",
        (_, Some(false)) => "disabled",
        (None, None) => NONE,
        _ => "active",
    };
    state.to_owned()
}

/// "succeeded 5m ago", from a run summary.
fn last_run(run: Option<&Value>, now: DateTime<Utc>) -> String {
    let Some(run) = run.filter(|run| run.is_object()) else { return NONE.to_owned() };
    let status = cell(run, &["status"]);
    match get(run, &["finished_at", "started_at", "enqueued_at"]).and_then(parse_time) {
        Some(time) => format!("{status} {}", relative(time, now)),
        None => status,
    }
}

/// `jobs show`.
pub(crate) fn job(value: &Value, now: DateTime<Utc>) -> String {
    let mut pairs = Pairs::default();
    pairs.add("name", cell(value, &["name"]));
    pairs.add_some("description", get(value, &["description"]).map(scalar));
    pairs.add("target", cell(value, &["target", "target_type"]));
    let zone = get(value, &["timezone"]).map(scalar);
    pairs.add(
        "schedule",
        match zone {
            Some(zone) => format!("{} ({zone})", schedule(value)),
            None => schedule(value),
        },
    );
    pairs.add("state", job_state_detail(value, now));
    pairs.add("next fire", when_detail(value.get("next_fire"), now));
    pairs.add("catch-up", cell(value, &["catch_up"]));
    pairs.add("overlap", cell(value, &["overlap"]));
    pairs.add("timeout", seconds(value.get("timeout_seconds")));
    pairs.add("max retries", cell(value, &["max_retries"]));
    pairs.add("runs", counts(value.get("counts")));
    pairs.add("last run", last_run(value.get("last_run"), now));
    let mut out = pairs.render();
    let fires = list_at(value, "next_fires");
    if !fires.is_empty() {
        out.push_str("\nnext fires:\n");
        out.push_str(&indent(&fires_table(&fires, now)));
    }
    let recent = list_at(value, "recent_runs");
    if !recent.is_empty() {
        out.push_str("\nrecent runs:\n");
        out.push_str(&indent(&brief_runs_table(&recent, now)));
    }
    out
}

fn job_state_detail(job: &Value, now: DateTime<Utc>) -> String {
    let state = job_state(job);
    if let Some(reason) = job.get("disabled").and_then(Value::as_str) {
        return format!("{state}: {reason}");
    }
    if state != "paused" {
        return state;
    }
    let mut text = state;
    if let Some(since) = job.get("paused_at").and_then(parse_time) {
        text.push_str(&format!(" {}", relative(since, now)));
    }
    if let Some(reason) = get(job, &["pause_reason"]) {
        text.push_str(&format!(": {}", scalar(reason)));
    }
    text
}

/// A count of seconds as a length of time; null means "none" (no limit).
fn seconds(value: Option<&Value>) -> String {
    match value {
        None => NONE.to_owned(),
        Some(Value::Null) => "none".to_owned(),
        Some(value) => value.as_u64().map_or_else(|| scalar(value), duration),
    }
}

/// `{"succeeded": 12, "failed": 1}` as "succeeded 12, failed 1".
fn counts(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => NONE.to_owned(),
        Some(Value::Object(map)) if map.is_empty() => "none yet".to_owned(),
        Some(Value::Object(map)) => map.iter().map(|(status, count)| format!("{status} {}", scalar(count))).collect::<Vec<_>>().join(", "),
        Some(other) => scalar(other),
    }
}

/// Upcoming fire times: in the reader's local time, relative, and in the job's own zone.
fn fires_table(fires: &[&Value], now: DateTime<Utc>) -> String {
    let mut table = Table::new(&["LOCAL TIME", "WHEN", "IN THE JOB'S ZONE"]);
    for fire in fires {
        let instant = get(fire, &["at", "utc", "time"]).and_then(parse_time).or_else(|| parse_time(fire));
        let zoned = match get(fire, &["local"]).and_then(Value::as_str) {
            Some(text) => {
                DateTime::parse_from_rfc3339(text).map_or_else(|_| text.to_owned(), |time| time.format("%Y-%m-%d %H:%M %:z").to_string())
            }
            None => NONE.to_owned(),
        };
        table.push(vec![
            instant.map_or_else(|| NONE.to_owned(), |time| time.with_timezone(&Local).format("%a %Y-%m-%d %H:%M").to_string()),
            instant.map_or_else(|| NONE.to_owned(), |time| relative(time, now)),
            zoned,
        ]);
    }
    table.render()
}

/// `jobs next`.
pub(crate) fn next_fires(value: &Value, job: &str, now: DateTime<Utc>) -> String {
    let fires = list_at(value, "next_fires");
    if fires.is_empty() {
        return format!("job \"{job}\" has no upcoming fire times ({})\n", job_state(value));
    }
    fires_table(&fires, now)
}

fn brief_runs_table(runs: &[&Value], now: DateTime<Utc>) -> String {
    let mut table = Table::new(&["ID", "STATUS", "TRIGGER", "ENQUEUED", "FINISHED"]);
    for run in runs {
        table.push(vec![
            cell(run, &["id", "run_id"]),
            cell(run, &["status"]),
            cell(run, &["trigger"]),
            when(run.get("enqueued_at"), now),
            when(run.get("finished_at"), now),
        ]);
    }
    table.render()
}

/// `jobs pause`.
pub(crate) fn paused(value: &Value, job: &str) -> String {
    let reason = get(value, &["pause_reason"]).map(|reason| format!(" ({})", scalar(reason))).unwrap_or_default();
    format!("job \"{job}\" paused{reason}; it stays paused across restarts\nresume it with: lampctl jobs resume {job}\n")
}

/// `jobs resume`.
pub(crate) fn resumed(value: &Value, job: &str, now: DateTime<Utc>) -> String {
    match get(value, &["next_fire"]).and_then(parse_time) {
        Some(next) => format!("job \"{job}\" resumed; next fire {}\n", when_full(next, now)),
        None => format!("job \"{job}\" resumed\n"),
    }
}

/// The run a trigger or a wait answered with: `run_id`, `id`, or `run.id`.
pub(crate) fn run_id(value: &Value) -> Option<String> {
    get(value, &["run_id", "id"])
        .or_else(|| value.get("run").and_then(|run| get(run, &["id", "run_id"])))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// `jobs trigger` without `--wait`.
pub(crate) fn triggered(value: &Value, job: &str, idempotency_key: Option<&str>) -> String {
    let id = run_id(value).unwrap_or_else(|| NONE.to_owned());
    let created = value.get("created").and_then(Value::as_bool).unwrap_or(true);
    let first = match (created, idempotency_key) {
        (false, Some(key)) => format!("job \"{job}\" was not triggered again: idempotency key \"{key}\" belongs to run {id}"),
        (false, None) => format!("job \"{job}\" was not triggered again: run {id} already answers this trigger"),
        (true, _) => format!("job \"{job}\" triggered: run {id}"),
    };
    format!("{first}\nfollow it with: lampctl runs show {id}\n")
}

/// `runs list`.
pub(crate) fn runs(value: &Value, now: DateTime<Utc>) -> String {
    let runs = items(value, "runs");
    if runs.is_empty() {
        return "no runs\n".to_owned();
    }
    let mut table = Table::new(&["ID", "JOB", "STATUS", "TRIGGER", "STARTED", "DURATION"]);
    for run in runs {
        table.push(vec![
            cell(run, &["id", "run_id"]),
            cell(run, &["job"]),
            cell(run, &["status"]),
            cell(run, &["trigger"]),
            when(run.get("started_at"), now),
            run_duration(run, now),
        ]);
    }
    table.render()
}

fn run_duration(run: &Value, now: DateTime<Utc>) -> String {
    let started = run.get("started_at").and_then(parse_time);
    let finished = run.get("finished_at").and_then(parse_time);
    match (started, finished) {
        (Some(started), Some(finished)) => duration(whole_seconds(finished - started)),
        (Some(started), None) => format!("{} so far", duration(whole_seconds(now - started))),
        _ => NONE.to_owned(),
    }
}

/// `runs show`, and the final run of `jobs trigger --wait`.
pub(crate) fn run(value: &Value, now: DateTime<Utc>) -> String {
    let run = run_of(value);
    let mut pairs = Pairs::default();
    pairs.add("id", cell(run, &["id", "run_id"]));
    pairs.add("job", cell(run, &["job"]));
    pairs.add("status", cell(run, &["status"]));
    pairs.add("trigger", cell(run, &["trigger"]));
    pairs.add("attempt", cell(run, &["attempt"]));
    pairs.add_some("retry of", get(run, &["retry_of"]).map(scalar));
    pairs.add_some("retried as", get(run, &["next_run_id"]).map(scalar));
    pairs.add_some("scheduled", get(run, &["scheduled_at"]).map(|time| when_detail(Some(time), now)));
    pairs.add("due", when_detail(run.get("due_at"), now));
    pairs.add("enqueued", when_detail(run.get("enqueued_at"), now));
    pairs.add("started", when_detail(run.get("started_at"), now));
    pairs.add("finished", when_detail(run.get("finished_at"), now));
    pairs.add("duration", run_duration(run, now));
    pairs.add_some("worker", get(run, &["worker"]).map(scalar));
    pairs.add_some("trace", get(run, &["trace_id"]).map(scalar));
    pairs.add_some("idempotency key", get(run, &["idempotency_key"]).map(scalar));
    pairs.add_some("tokens", tokens(run));
    pairs.add_some("cost", get(run, &["cost"]).map(scalar));
    pairs.add_some("usage", get(run, &["usage"]).map(usage));
    pairs.add_some("input", get(run, &["input"]).map(compact));
    pairs.add_some("parameters", get(run, &["parameters"]).map(compact));
    pairs.add_some("error", get(run, &["error"]).map(scalar));
    let mut out = pairs.render();
    let steps = list_at(run, "steps");
    if !steps.is_empty() {
        out.push_str("\nsteps:\n");
        out.push_str(&indent(&steps_table(&steps, now)));
    }
    let waits = list_at(run, "agent_waits");
    if !waits.is_empty() {
        out.push_str("\nagent approvals:\n");
        out.push_str(&indent(&steps_table(&waits, now)));
    }
    if let Some(output) = get(run, &["output"]) {
        out.push_str("\noutput:\n");
        let text = match output {
            Value::String(text) => text.trim_end().to_owned(),
            other => serde_json::to_string_pretty(other).unwrap_or_default(),
        };
        out.push_str(&indent(&text));
    }
    out
}

/// An agent run's usage: `2 model calls, 1 tool call, 20 tokens in / 10 out, cost 0.00004`.
fn usage(u: &Value) -> String {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let plural = |count: u64, what: &str| format!("{count} {what}{}", if count == 1 { "" } else { "s" });
    let mut text = format!(
        "{}, {}, {} tokens in / {} out",
        plural(n("model_calls"), "model call"),
        plural(n("tool_calls"), "tool call"),
        n("input_tokens"),
        n("output_tokens")
    );
    if let Some(cost) = u.get("cost").and_then(Value::as_f64) {
        text.push_str(&format!(", cost {cost:.6}"));
    }
    text
}

/// `runs show --transcript`: every model and tool call of the run's agents, by conversation.
pub(crate) fn transcript(value: &Value) -> String {
    let run = run_of(value);
    let calls = list_at(run, "calls");
    if calls.is_empty() {
        return "transcript: no agent calls\n".to_owned();
    }
    let mut out = String::from("transcript:\n");
    let mut conversation = None;
    for call in calls {
        let conv = call.get("conversation").and_then(Value::as_str).unwrap_or_default();
        if conversation != Some(conv) {
            out.push_str(&format!("  [{}]\n", if conv.is_empty() { "agent" } else { conv }));
            conversation = Some(conv);
        }
        let name = cell(call, &["name"]);
        let took = took_ms(call).map(|ms| format!(", {ms} ms")).unwrap_or_default();
        match call.get("kind").and_then(Value::as_str) {
            Some("model") => {
                let n = |k: &str| call.get(k).and_then(Value::as_u64).unwrap_or(0);
                let cost = call.get("cost").and_then(Value::as_f64).map(|c| format!(", cost {c:.6}")).unwrap_or_default();
                out.push_str(&format!("    model {name} ({} in / {} out{cost}{took})\n", n("input_tokens"), n("output_tokens")));
                let response = call.get("response").cloned().unwrap_or(Value::Null);
                if let Some(text) = response.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
                    out.push_str(&indent_by(text.trim_end(), 6));
                }
                for tc in response.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    let tool = tc.get("tool").and_then(Value::as_str).or_else(|| tc.get("name").and_then(Value::as_str)).unwrap_or("?");
                    let args = tc.get("arguments").and_then(Value::as_str).unwrap_or("");
                    out.push_str(&format!("      → {tool} {}\n", truncate(args, 200)));
                }
            }
            _ => {
                let failed = if call.get("error").is_some_and(|e| !e.is_null()) { " failed" } else { "" };
                out.push_str(&format!("    tool {name}{failed} ({}{took})\n", cell(call, &["call_id"])));
                let result = call.get("response").map_or_else(String::new, |r| r.as_str().map_or_else(|| compact(r), str::to_owned));
                out.push_str(&format!("      ← {}\n", truncate(&result.replace('\n', " "), 300)));
            }
        }
    }
    out
}

fn took_ms(call: &Value) -> Option<i64> {
    let start = parse_time(call.get("started_at")?)?;
    let end = parse_time(call.get("finished_at")?)?;
    Some((end - start).num_milliseconds())
}

fn indent_by(text: &str, n: usize) -> String {
    text.lines().map(|l| format!("{}{l}\n", " ".repeat(n))).collect()
}

fn tokens(run: &Value) -> Option<String> {
    let tokens_in = get(run, &["tokens_in"]);
    let tokens_out = get(run, &["tokens_out"]);
    if tokens_in.is_none() && tokens_out.is_none() {
        return None;
    }
    let show = |count: Option<&Value>| count.map_or_else(|| NONE.to_owned(), scalar);
    Some(format!("{} in, {} out", show(tokens_in), show(tokens_out)))
}

/// A workflow run's steps as a tree: a `parallel`'s children indented under it.
fn steps_table(steps: &[&Value], now: DateTime<Utc>) -> String {
    let mut table = Table::new(&["STEP", "TYPE", "STATUS", "ATTEMPT", "STARTED", "DURATION", "OUTPUT / ERROR"]);
    step_rows(&mut table, steps, 0, now);
    table.render()
}

fn step_rows(table: &mut Table, steps: &[&Value], depth: usize, now: DateTime<Utc>) {
    for step in steps {
        let status = get(step, &["status"]).map_or_else(|| "pending".to_owned(), scalar);
        let detail =
            get(step, &["error"]).or_else(|| get(step, &["output"])).map_or_else(|| NONE.to_owned(), |v| truncate(&compact(v), MAX_CELL));
        table.push(vec![
            format!("{}{}", "  ".repeat(depth), cell(step, &["name", "step", "id"])),
            cell(step, &["type"]),
            status,
            cell(step, &["attempt"]),
            when(step.get("started_at"), now),
            if step.get("started_at").is_some() { run_duration(step, now) } else { NONE.to_owned() },
            detail,
        ]);
        step_rows(table, &list_at(step, "steps"), depth + 1, now);
    }
}

/// `runs cancel`.
pub(crate) fn cancelled(value: &Value, id: &str) -> String {
    let run = run_of(value);
    match get(run, &["status"]).and_then(Value::as_str) {
        Some("cancelled") => format!("run {id} cancelled\n"),
        Some(status) => format!("run {id}: cancellation requested; it is {status} until it stops\n"),
        None => format!("run {id}: cancellation requested\n"),
    }
}

/// One column of a list whose entries lampctl reads by any of several field names.
struct Column {
    title: &'static str,
    keys: &'static [&'static str],
}

fn list_view(value: &Value, key: &str, empty: &str, columns: &[Column], now: DateTime<Utc>) -> String {
    let entries = items(value, key);
    if entries.is_empty() {
        return format!("{empty}\n");
    }
    let titles: Vec<&str> = columns.iter().map(|column| column.title).collect();
    let mut table = Table::new(&titles);
    for entry in entries {
        table.push(
            columns.iter().map(|column| get(entry, column.keys).map_or_else(|| NONE.to_owned(), |found| table_value(found, now))).collect(),
        );
    }
    table.render()
}

/// `approvals list`.
pub(crate) fn approvals(value: &Value, now: DateTime<Utc>) -> String {
    const COLUMNS: [Column; 6] = [
        Column { title: "RUN", keys: &["run_id", "run"] },
        Column { title: "JOB", keys: &["job"] },
        Column { title: "STEP", keys: &["step", "step_id", "step_name"] },
        Column { title: "WAITING SINCE", keys: &["requested_at", "waiting_since", "since", "created_at"] },
        Column { title: "TIMEOUT", keys: &["timeout_at"] },
        Column { title: "QUESTION", keys: &["question", "message", "prompt", "description", "summary"] },
    ];
    list_view(value, "approvals", "no steps are waiting for approval", &COLUMNS, now)
}

/// `approvals approve` and `approvals reject`.
pub(crate) fn decision(value: &Value, approved: bool, run: &str, step: Option<&str>) -> String {
    let verb = if approved { "approved" } else { "rejected" };
    let step = step.map(str::to_owned).or_else(|| get(value, &["step"]).map(scalar));
    let mut line = match step {
        Some(step) => format!("{verb} step \"{step}\" of run {run}"),
        None => format!("{verb} the waiting step of run {run}"),
    };
    if let Some(status) = get(value, &["run_status", "status"]) {
        line.push_str(&format!("; the run is now {}", scalar(status)));
    }
    line.push('\n');
    line
}

/// `workflows list`.
pub(crate) fn workflows(value: &Value, now: DateTime<Utc>) -> String {
    let entries = items(value, "workflows");
    if entries.is_empty() {
        return "no workflows\n".to_owned();
    }
    let mut table = Table::new(&["NAME", "STEPS", "DESCRIPTION"]);
    for w in entries {
        let steps = match w.get("steps") {
            Some(Value::Array(steps)) => step_chain(steps),
            Some(other) => table_value(other, now),
            None => NONE.to_owned(),
        };
        let mut description = get(w, &["description"]).map_or_else(|| NONE.to_owned(), scalar);
        if let Some(why) = get(w, &["disabled"]) {
            description = format!("disabled: {}", scalar(why));
        }
        table.push(vec![cell(w, &["name"]), steps, description]);
    }
    table.render()
}

/// `fetch → check → [a | b] → publish`: step ids in order, a parallel's children in brackets.
fn step_chain(steps: &[Value]) -> String {
    steps
        .iter()
        .map(|s| match s.get("steps") {
            Some(Value::Array(children)) if !children.is_empty() => {
                format!("[{}]", children.iter().map(|c| step_chain(std::slice::from_ref(c))).collect::<Vec<_>>().join(" | "))
            }
            _ => cell(s, &["id", "name"]),
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

/// `agents list`.
pub(crate) fn agents(value: &Value, now: DateTime<Utc>) -> String {
    let _ = now;
    let entries = items(value, "agents");
    if entries.is_empty() {
        return "no agents\n".to_owned();
    }
    let mut table = Table::new(&["NAME", "MODEL", "PROVIDER", "TOOLS", "ENABLED"]);
    for a in entries {
        let model = match (get(a, &["model"]).map(scalar), get(a, &["model_id"]).map(scalar)) {
            (Some(alias), Some(id)) if alias != id => format!("{alias} ({id})"),
            (Some(alias), _) => alias,
            (None, _) => NONE.to_owned(),
        };
        let tools = list_at(a, "tools").iter().map(|t| scalar(t)).collect::<Vec<_>>().join(", ");
        let enabled = match get(a, &["disabled"]) {
            Some(why) => format!("no: {}", scalar(why)),
            None => "yes".to_owned(),
        };
        table.push(vec![
            cell(a, &["name"]),
            model,
            cell(a, &["provider"]),
            if tools.is_empty() { NONE.to_owned() } else { truncate(&tools, MAX_CELL) },
            enabled,
        ]);
    }
    table.render()
}

/// `plugins list`.
pub(crate) fn plugins(value: &Value, now: DateTime<Utc>) -> String {
    const COLUMNS: [Column; 5] = [
        Column { title: "NAME", keys: &["name"] },
        Column { title: "VERSION", keys: &["version"] },
        Column { title: "TYPE", keys: &["type", "kind"] },
        Column { title: "STATUS", keys: &["status", "state", "error"] },
        Column { title: "ACTIONS", keys: &["actions"] },
    ];
    list_view(value, "plugins", "no plugins", &COLUMNS, now)
}

/// `config reload`.
pub(crate) fn reloaded(value: &Value, now: DateTime<Utc>) -> String {
    let mut out = String::from("configuration reloaded\n");
    match value {
        Value::Object(map) if !map.is_empty() => {
            let mut pairs = Pairs::default();
            for (key, field) in map {
                pairs.add(&key.replace('_', " "), detail_value(field, now));
            }
            out.push_str(&pairs.render());
        }
        Value::String(text) if !text.trim().is_empty() => out = format!("{}\n", text.trim_end()),
        _ => {}
    }
    out
}

/// `tools list`, from the tools as `tools/list` carries them.
pub(crate) fn tools(value: &Value) -> String {
    let tools = items(value, "tools");
    if tools.is_empty() {
        return "the worker offers no tools\n".to_owned();
    }
    let mut table = Table::new(&["NAME", "HINTS", "DESCRIPTION"]);
    for tool in tools {
        let hint = |key: &str| tool.get("annotations").and_then(|annotations| annotations.get(key)).and_then(Value::as_bool) == Some(true);
        let hints: Vec<&str> = [("readOnlyHint", "read-only"), ("destructiveHint", "destructive")]
            .into_iter()
            .filter(|&(key, _)| hint(key))
            .map(|(_, label)| label)
            .collect();
        let description = tool.get("description").and_then(Value::as_str).and_then(|text| text.lines().next()).unwrap_or(NONE);
        table.push(vec![
            cell(tool, &["name"]),
            if hints.is_empty() { NONE.to_owned() } else { hints.join(", ") },
            truncate(description, 70),
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::json;

    use super::*;

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

    #[test]
    fn jobs_accept_a_bare_list_or_an_object_and_show_missing_fields_as_dashes() {
        let job = json!({
            "name": "nightly",
            "target": "workflow review",
            "schedule": "cron: 0 2 * * *",
            "enabled": true,
            "paused": false,
            "next_fire": at(3 * 3_600).to_rfc3339(),
            "last_run": {"id": "r1", "status": "succeeded", "finished_at": at(-5 * 60).to_rfc3339()}
        });
        let sparse = json!({"name": "adhoc", "schedule": null, "paused": true});
        let from_object = jobs(&json!({"jobs": [job.clone(), sparse.clone()]}), now());
        let from_list = jobs(&json!([job, sparse]), now());
        assert_eq!(from_object, from_list);
        let lines: Vec<&str> = from_object.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("NAME     TARGET           SCHEDULE         STATE   NEXT FIRE"), "{}", lines[0]);
        assert!(lines[1].starts_with("nightly  workflow review  cron: 0 2 * * *  active  "), "{}", lines[1]);
        assert!(lines[1].contains("(in 3h)"), "{}", lines[1]);
        assert!(lines[1].ends_with("succeeded 5m ago"), "{}", lines[1]);
        assert!(lines[2].starts_with("adhoc    -                manual           paused  -"), "{}", lines[2]);
        assert_eq!(jobs(&json!({"jobs": []}), now()), "no jobs\n");
    }

    #[test]
    fn job_detail_lists_fire_times_and_counts() {
        let detail = json!({
            "name": "nightly",
            "timezone": "Europe/Berlin",
            "schedule": "cron: 0 2 * * *",
            "paused": true,
            "pause_reason": "db migration",
            "paused_at": at(-2 * 3_600).to_rfc3339(),
            "counts": {"failed": 1, "succeeded": 12},
            "timeout_seconds": 5_400,
            "next_fires": [{"utc": at(3_600).to_rfc3339(), "local": "2026-05-04T15:00:00+02:00"}],
            "recent_runs": [{"id": "r1", "status": "failed", "trigger": "cron"}]
        });
        let text = job(&detail, now());
        assert!(text.contains("schedule:     cron: 0 2 * * * (Europe/Berlin)\n"), "{text}");
        assert!(text.contains("state:        paused 2h ago: db migration\n"), "{text}");
        assert!(text.contains("timeout:      1h30m\n"), "{text}");
        assert!(text.contains("runs:         failed 1, succeeded 12\n"), "{text}");
        assert!(text.contains("catch-up:     -\n"), "{text}");
        assert!(text.contains("in 1h"), "{text}");
        assert!(text.contains("2026-05-04 15:00 +02:00"), "{text}");
        assert!(text.contains("\nrecent runs:\n  ID"), "{text}");
    }

    #[test]
    fn a_run_shows_its_output_and_error() {
        let text = run(
            &json!({
                "id": "r9", "job": "nightly", "status": "failed", "trigger": "manual", "attempt": 2,
                "started_at": at(-90).to_rfc3339(), "finished_at": at(0).to_rfc3339(),
                "error": "step \"load\" timed out", "output": {"rows": 3}, "tokens_in": 10
            }),
            now(),
        );
        assert!(text.contains("duration:  1m30s\n"), "{text}");
        assert!(text.contains("error:     step \"load\" timed out\n"), "{text}");
        assert!(text.contains("tokens:    10 in, - out\n"), "{text}");
        assert!(text.ends_with("output:\n  {\n    \"rows\": 3\n  }\n"), "{text}");
    }

    #[test]
    fn lists_of_unknown_shape_pick_known_field_names() {
        let text = plugins(&json!({"plugins": [{"name": "shell-exec", "type": "builtin", "actions": [{"name": "run"}]}]}), now());
        assert_eq!(text, "NAME        VERSION  TYPE     STATUS  ACTIONS\nshell-exec  -        builtin  -       run\n");
        assert_eq!(approvals(&json!([]), now()), "no steps are waiting for approval\n");
    }

    #[test]
    fn trigger_messages_name_the_run() {
        assert_eq!(
            triggered(&json!({"run_id": "r1", "created": true}), "nightly", None),
            "job \"nightly\" triggered: run r1\nfollow it with: lampctl runs show r1\n"
        );
        assert!(
            triggered(&json!({"run_id": "r1", "created": false}), "nightly", Some("k")).contains("idempotency key \"k\" belongs to run r1")
        );
        assert_eq!(run_id(&json!({"run": {"id": "r2"}})).as_deref(), Some("r2"));
    }

    #[test]
    fn scalars_read_as_text() {
        assert_eq!(scalar(&json!(["a", 1, {"name": "x"}])), "a, 1, x");
        assert_eq!(scalar(&json!([])), "none");
        assert_eq!(scalar(&json!(true)), "yes");
        assert_eq!(scalar(&json!("")), NONE);
        assert_eq!(when(None, now()), NONE);
        assert_eq!(when(Some(&json!("soon")), now()), "soon");
    }
}
