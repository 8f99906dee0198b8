//! Run-core benchmark (issue 9): bursts, sustained load, queue drain and a large idle config,
//! on the real `lamplighter` binary (release build).
//!
//! ```text
//! cargo build --release -p lamplighter-worker
//! cargo bench -p lamplighter-tests --bench runcore -- [burst] [sustained] [queue] [idle] [--seconds 60] [--jobs 10000,100000] [--kind save|shell|workflow] [--limit N]
//! ```
//!
//! - burst: 1,000 jobs due at the same instant every 10 s (`*/10 * * * * *`),
//!   `worker.concurrency: 1000`, `file-save`. Lateness = `started_at − due_at` as the worker
//!   records it (started = claimed by an executor, just before its target is called); spread =
//!   last start − first start of one burst.
//! - sustained: 1,000 jobs every second (`* * * * * *`), same settings; lateness in the first
//!   and the last 10 s (a growing backlog shows as the second being worse), ticks missed, then
//!   SIGTERM and the time until the process exits (`shutdown_grace` 30 s, the default).
//! - queue: 50,000 runs queued while the worker is stopped (as manual triggers leave them),
//!   `worker.concurrency: 32`, a near no-op action (`file-read` of a 2-byte file); drain rate =
//!   runs / (last finish − first start).
//!   Then apalis-sqlite's own worker drains as many tasks (`peer/apalis_sqlite.rs`, up to
//!   180 s more).
//! - idle: 10,000 jobs defined (`--jobs 10000,100000` for more sizes; `--kind shell` or
//!   `workflow` for `shell-exec` or workflow jobs), each at one minute of the day: start to
//!   `/readyz`, idle RSS, and the lateness of the next minute's runs.
#![allow(clippy::disallowed_methods)]

#[path = "peer/apalis_cron.rs"]
mod apalis_cron;
#[path = "peer/apalis_sqlite.rs"]
mod apalis_sqlite;
mod common;

use common::{
    InternalEvent, SAVE, Worker, bin, burst_spreads, cpu_ms, drain_stages, jobs_yaml, now_ms, read_rows, rss_kb, sleep_until, status_kb,
    summary,
};

use std::path::Path;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let seconds: u64 = arg("--seconds").map(|s| s.parse().expect("--seconds N")).unwrap_or(60);
    // How many jobs `idle` defines, each size a run of its own.
    let jobs: Vec<usize> =
        arg("--jobs").unwrap_or_else(|| "10000".into()).split(',').map(|n| n.trim().parse().expect("--jobs N[,N]")).collect();
    // What the `idle` jobs run: save, shell or workflow.
    let kind = arg("--kind").unwrap_or_else(|| "save".into());
    let mut scenarios: Vec<&str> =
        args.iter().map(String::as_str).filter(|a| ["burst", "sustained", "queue", "idle"].contains(a)).collect();
    if scenarios.is_empty() {
        scenarios = vec!["burst", "sustained", "queue", "idle"];
    }
    println!("binary: {}", bin().display());
    // `--limit N`: burst and queue with every job in one limit of N slots against none,
    // alternated, twice each.
    if let Some(limit) = arg("--limit").map(|l| l.parse::<u32>().expect("--limit N")) {
        for s in scenarios.iter().filter(|s| ["burst", "queue"].contains(s)) {
            for round in 0..2 {
                for variant in [None, Some(limit)] {
                    println!("\n##### {s}, {}, round {round}", variant.map_or_else(|| "no limit".to_owned(), |n| format!("limit {n}")));
                    match *s {
                        "burst" => burst_in(seconds, variant),
                        _ => queue_in(50_000, variant),
                    }
                }
            }
        }
        return;
    }
    for s in scenarios {
        match s {
            "burst" => burst(seconds),
            "sustained" => sustained(seconds),
            "queue" => queue(50_000),
            "idle" => jobs.iter().for_each(|n| idle(*n, &kind)),
            _ => unreachable!(),
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// (scheduled_at, due_at, started_at, finished_at, status) of a run.
type Row = (Option<i64>, i64, Option<i64>, Option<i64>, String);

/// Every run in the database.
fn runs(db: &Path) -> Vec<Row> {
    use sqlx::Row;
    read_rows(db, "SELECT scheduled_at, due_at, started_at, finished_at, status FROM ll_runs", |r| {
        (r.get("scheduled_at"), r.get("due_at"), r.get("started_at"), r.get("finished_at"), r.get("status"))
    })
}

/// `scheduling.limits` with one limit `pool` of `n` slots, and the line a job takes it with.
fn pool(limit: Option<u32>) -> (String, &'static str) {
    match limit {
        Some(n) => (format!("  limits:\n    pool: {n}\n"), "      limits: [pool]\n"),
        None => (String::new(), ""),
    }
}

fn burst(seconds: u64) {
    burst_in(seconds, None);
}

fn burst_in(seconds: u64, limit: Option<u32>) {
    let (limits, takes) = pool(limit);
    let mut w = Worker::scheduled(&limits, &jobs_yaml(1000, "*/10 * * * * *", &format!("{SAVE}{takes}")), 1000);
    let ready = w.start_recording();
    println!("\n== burst: 1,000 jobs due together every 10 s, concurrency 1000, {seconds} s ==");
    println!("start to ready: {} ms", ready.as_millis());
    std::thread::sleep(Duration::from_secs(seconds));
    let exit = w.stop();
    let r = runs(&w.db());
    summary("start lateness ms", r.iter().filter_map(|x| Some(x.2? - x.1)).collect());
    let (spreads, per_tick) = burst_spreads(r.iter().map(|x| (x.0, x.2)), 900);
    println!("bursts: {} (runs per burst: {per_tick:?})", spreads.len());
    summary("burst spread ms (last start − first start)", spreads);
    // Independent of what the worker records: when each action really wrote its file.
    let mut real: Vec<i64> = Vec::new();
    for i in 0..1000 {
        let p = w.dir.path().join(format!("data/out/{i}.txt"));
        if let Ok(m) = std::fs::metadata(&p).and_then(|m| m.modified()) {
            let ms = m.duration_since(std::time::UNIX_EPOCH).expect("mtime").as_millis() as i64;
            // The file system's clock is coarse (a few ms): a file written just after the tick
            // can be stamped just before it, read as that many ms before it, not 9.99 s after.
            let after = ms.rem_euclid(10_000);
            real.push(if after > 5_000 { after - 10_000 } else { after });
        }
    }
    summary("last burst, file written ms after the tick (mtime)", real);
    println!("SIGTERM to exit: {} ms", exit.as_millis());
    stages(&w.internal_events(), &r);
    peer(1000, "*/10 * * * * *", seconds);
}

/// The same load on apalis-cron, in this process, in memory.
fn peer(n: usize, cron: &str, seconds: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    println!("\n-- peer: apalis-cron 1.0, in memory (nothing persisted), same jobs, same {seconds} s --");
    let starts = apalis_cron::run(n, cron, seconds, dir.path());
    summary("start lateness ms", starts.iter().map(|s| s.1).collect());
    let (spreads, per_tick) = burst_spreads(starts.iter().map(|s| (Some(s.0), Some(s.0 + s.1))), n * 9 / 10);
    println!("bursts: {} (runs per burst: {per_tick:?})", spreads.len());
    summary("burst spread ms (last start − first start)", spreads);
}

/// Where the milliseconds of each burst go, from the worker's internal events and the runs'
/// recorded starts, each in ms after the tick's instant (negative: before it, as the scheduler
/// does a tick's transaction ahead and holds it until the instant): the scheduler's pass (one
/// `TickBurst` per tick transaction, with where the transaction's time went) and each batch of
/// ends recorded (`EndsRecorded`).
fn stages(events: &[InternalEvent], runs: &[Row]) {
    let ms = |us: Option<i64>| us.map_or("?".to_string(), |v| format!("{:.1}", v as f64 / 1000.0));
    let ends: Vec<i64> = events
        .iter()
        .filter_map(|e| match e {
            InternalEvent::EndsRecorded { at_ms, .. } => Some(*at_ms),
            _ => None,
        })
        .collect();
    let bursts: Vec<&InternalEvent> = events.iter().filter(|e| matches!(e, InternalEvent::TickBurst { .. })).collect();
    let tick_of = |e: &InternalEvent| match e {
        InternalEvent::TickBurst { tick_ms, .. } => *tick_ms,
        _ => unreachable!("only bursts"),
    };
    let mut ticks: Vec<i64> = bursts.iter().map(|e| tick_of(e)).collect();
    ticks.dedup();
    println!("stages of each burst, ms after the tick:");
    for tick in ticks {
        let mine: Vec<&&InternalEvent> = bursts.iter().filter(|e| tick_of(e) == tick).collect();
        let Some(InternalEvent::TickBurst { woke_us, planned_us, ready_us, .. }) = mine.first().map(|e| **e) else { continue };
        let n: usize = mine.iter().map(|e| if let InternalEvent::TickBurst { ticks, .. } = e { *ticks } else { 0 }).sum();
        let committed: Vec<String> = mine
            .iter()
            .map(|e| if let InternalEvent::TickBurst { committed_us, .. } = e { ms(*committed_us) } else { "?".into() })
            .collect();
        let launched =
            mine.last().and_then(|e| if let InternalEvent::TickBurst { launched_us, .. } = e { Some(*launched_us) } else { None });
        let mut starts: Vec<i64> = runs.iter().filter(|r| r.0 == Some(tick)).filter_map(|r| Some(r.2? - tick)).collect();
        starts.sort_unstable();
        let start = |p: f64| starts.get(((starts.len() as f64 - 1.0) * p).round() as usize).map_or("?".into(), i64::to_string);
        let burst_ends: Vec<i64> = ends.iter().copied().filter(|at| *at >= tick && *at < tick + 10_000).collect();
        println!(
            "  {n} ticks: woke {} → planned {} → ready to commit {} → {} transaction(s) committed at {} → launched {} → runs started first {} / p50 {} / last {} → last end recorded {} ({} batches)",
            ms(Some(*woke_us)),
            ms(Some(*planned_us)),
            ms(*ready_us),
            mine.len(),
            committed.join(", "),
            ms(launched),
            start(0.0),
            start(0.5),
            start(1.0),
            burst_ends.iter().map(|at| at - tick).max().map_or("?".into(), |e| e.to_string()),
            burst_ends.len(),
        );
        for e in &mine {
            if let InternalEvent::TickBurst { ticks, transaction: Some(t), .. } = e {
                let parts = [
                    ("begin", t.begin_us),
                    ("keys", t.keys_us),
                    ("reads", t.reads_us),
                    ("runs", t.runs_us),
                    ("state", t.state_us),
                    ("held", t.held_us),
                    ("commit", t.commit_us),
                ]
                .map(|(p, us)| format!("{p} {}", ms(Some(us as i64))));
                println!("    transaction of {ticks} ticks (ms): {}", parts.join(", "));
            }
        }
    }
}

fn sustained(seconds: u64) {
    let mut w = Worker::new(&jobs_yaml(1000, "* * * * * *", SAVE), 1000);
    w.start();
    println!("\n== sustained: 1,000 jobs every second, concurrency 1000, {seconds} s ==");
    let began = now_ms();
    std::thread::sleep(Duration::from_secs(seconds));
    let rss = rss_kb(w.pid());
    let exit = w.stop();
    let r = runs(&w.db());
    let late = |from: i64, to: i64| -> Vec<i64> {
        r.iter().filter(|x| x.0.is_some_and(|t| t >= from && t < to)).filter_map(|x| Some(x.2? - x.1)).collect()
    };
    let end = began + seconds as i64 * 1000;
    summary("start lateness ms, whole run", r.iter().filter_map(|x| Some(x.2? - x.1)).collect());
    summary("start lateness ms, first 10 s", late(began, began + 10_000));
    summary("start lateness ms, last 10 s", late(end - 10_000, end));
    let ticks: std::collections::BTreeSet<i64> = r.iter().filter_map(|x| x.0).collect();
    let full = ticks.iter().filter(|t| r.iter().filter(|x| x.0 == Some(**t)).count() == 1000).count();
    let expected = (ticks.last().copied().unwrap_or(0) - ticks.first().copied().unwrap_or(0)) / 1000 + 1;
    println!("ticks: {} instants seen of {expected} expected, {full} with all 1,000 jobs", ticks.len());
    let skipped = r.iter().filter(|x| x.4 == "skipped").count();
    let never = r.iter().filter(|x| x.4 == "queued").count();
    println!("runs: {} (skipped {skipped}, still queued at exit {never}); RSS under load {:.1} MB", r.len(), rss as f64 / 1024.0);
    println!("SIGTERM to exit: {} ms (shutdown_grace 30 s)", exit.as_millis());
    peer(1000, "* * * * * *", seconds);
}

fn queue(n: usize) {
    queue_in(n, None);
    queue_peer(n);
}

/// apalis-sqlite's own worker draining `n` no-op tasks on disk, as the floor of a durable
/// SQLite queue on this machine in this hour (`peer/apalis_sqlite.rs` says why its best
/// stretch is the figure to compare).
fn queue_peer(n: usize) {
    let dir = tempfile::tempdir().expect("peer dir");
    println!("\n== queue peer: apalis-sqlite worker, {n} tasks, concurrency 32, fetch 32, file read of 2 bytes ==");
    let d = apalis_sqlite::drain(n, 32, dir.path());
    let rate = |tasks: usize, ms: i64| tasks as f64 / (ms.max(1) as f64 / 1000.0);
    println!(
        "first {} tasks in {} ms: peer drain rate {:.0} tasks/s (its best stretch)",
        apalis_sqlite::FIRST,
        d.first_ms,
        rate(apalis_sqlite::FIRST, d.first_ms)
    );
    println!(
        "in the {:?} window: {} of {n} done ({} acked in the database), {:.0} tasks/s over first start → last finish",
        apalis_sqlite::WINDOW,
        d.done,
        d.acked,
        rate(d.done, d.span_ms)
    );
}

fn queue_in(n: usize, limit: Option<u32>) {
    // History kept whole (the default retention of 100 runs would prune it while it drains).
    let action =
        "      plugin: file-read\n      action: read\n      parameters: { path: \"tiny.txt\" }\n      retention: { max_runs: 100000 }\n";
    let (limits, takes) = pool(limit);
    let mut w = Worker::scheduled(&limits, &jobs_yaml(1, "0 0 1 1 *", &format!("{action}{takes}")), 32);
    w.start();
    w.stop();
    std::fs::write(w.dir.path().join("data/tiny.txt"), "ok").expect("tiny file");
    let db = w.db();
    let t0 = now_ms();
    rt().block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&db);
        let mut conn = sqlx::ConnectOptions::connect(&opts).await.expect("open db");
        let mut tx = sqlx::Connection::begin(&mut conn).await.expect("tx");
        for i in 0..n {
            // As a manual trigger of the job inserts them: due, in the pool's line at once.
            sqlx::query("INSERT INTO ll_runs (id, job, trigger, status, due_at, enqueued_at, attempt, parameters, root_id, limits, limit_wait, limit_wait_since) VALUES (?1, 'job-00000', 'manual', 'queued', ?2, ?2, 1, '{\"path\":\"tiny.txt\"}', ?1, ?3, ?4, ?5)")
                .bind(format!("0190b000-0000-7000-8000-{i:012}"))
                .bind(t0)
                .bind(limit.map(|_| "[[\"pool\",\"\"]]"))
                .bind(limit.map(|_| "pool"))
                .bind(limit.map(|_| t0))
                .execute(&mut *tx)
                .await
                .expect("insert");
        }
        tx.commit().await.expect("commit");
    });
    println!("\n== queue: {n} queued runs, concurrency 32, file-read of 2 bytes ==");
    let started = Instant::now();
    w.start_recording();
    loop {
        std::thread::sleep(Duration::from_millis(250));
        // Whether any is left, by the status index, stopping at the first: a count of the
        // runs left took CPU the worker needs (25 ms a poll on PostgreSQL, `postgres -- drain`).
        let left: i64 = read_rows(&w.db(), "SELECT EXISTS (SELECT 1 FROM ll_runs WHERE status IN ('queued', 'running')) AS n", |r| {
            sqlx::Row::get(r, "n")
        })
        .first()
        .copied()
        .expect("whether runs are left");
        if left == 0 || started.elapsed() > Duration::from_secs(300) {
            break;
        }
    }
    let cpu = cpu_ms(w.pid());
    w.stop();
    let r = runs(&w.db());
    let first = r.iter().filter_map(|x| x.2).min().unwrap_or(0);
    let last = r.iter().filter_map(|x| x.3).max().unwrap_or(0);
    let done = r.iter().filter(|x| x.4 == "succeeded").count();
    let other = r.len() - done;
    println!("succeeded {done}, other {other}; first start → last finish {} ms", last - first);
    println!("drain rate: {:.0} runs/s", done as f64 / ((last - first).max(1) as f64 / 1000.0));
    println!("worker CPU (user + system, whole life): {cpu} ms, {:.0} µs per run", cpu as f64 * 1000.0 / done.max(1) as f64);
    drain_stages(&w.internal_events());
}

/// `n` jobs of `kind`, each at one minute of the day (job `i` at minute `i mod 1440`): start
/// to ready, idle RSS, then the lateness of the runs of the next whole minute (`n / 1440` of
/// them). Kinds: `save` (a `file-save` plugin action), `shell` (a `shell-exec` command),
/// `workflow` (a workflow job, one of 100 workflows of three steps: two commands and a save).
fn idle(n: usize, kind: &str) {
    let mut yaml = String::with_capacity(n * 160);
    for i in 0..n {
        let minute = i % 1440;
        let what = match kind {
            "save" => format!("      type: plugin\n{}", SAVE.replace("{i}", &i.to_string())),
            "shell" => {
                format!("      type: plugin\n      plugin: shell-exec\n      action: run\n      parameters: {{ command: \"echo {i}\" }}\n")
            }
            "workflow" => format!("      type: workflow\n      workflow: flow-{:02}\n", i % 100),
            other => panic!("--kind {other}: one of save, shell, workflow"),
        };
        yaml.push_str(&format!("    job-{i:06}:\n      cron: \"0 {} {} * * *\"\n{what}", minute % 60, minute / 60));
    }
    let mut workflows = String::new();
    if kind == "workflow" {
        workflows.push_str("workflows:\n");
        for f in 0..100 {
            workflows.push_str(&format!(
                "  flow-{f:02}:\n    steps:\n      - {{id: fetch, type: plugin, plugin: shell-exec, action: run, parameters: {{command: \"echo fetch {f}\"}}}}\n      - {{id: build, type: plugin, plugin: shell-exec, action: run, parameters: {{command: \"echo build {f}\"}}}}\n      - {{id: keep, type: plugin, plugin: file-save, action: save, parameters: {{path: \"out/{f}.txt\", content: \"x\"}}}}\n"
            ));
        }
    }
    let mut w = Worker::with(&workflows, &yaml, 32);
    let ready = w.start();
    std::thread::sleep(Duration::from_secs(3));
    println!("\n== idle: {n} {kind} jobs defined, each at one minute of the day ==");
    let mb = |field| status_kb(w.pid(), field) as f64 / 1024.0;
    println!(
        "start to ready: {} ms; idle RSS {:.1} MB: {:.1} MB the process's own (heap, stacks), {:.1} MB mapped from the binary and libraries",
        ready.as_millis(),
        mb("VmRSS"),
        mb("RssAnon"),
        mb("RssFile")
    );
    // The next minute's runs: wait for it to pass, and a little more for its runs to end.
    let until = (now_ms() / 60_000 + 1) * 60_000;
    sleep_until(until + 3_000);
    let rss = rss_kb(w.pid());
    w.stop();
    let r = runs(&w.db());
    summary(
        &format!("start lateness ms, the minute from {}", until / 1000),
        r.iter().filter(|x| x.1 == until).filter_map(|x| Some(x.2? - x.1)).collect(),
    );
    println!("RSS after the minute's runs: {:.1} MB", rss as f64 / 1024.0);
}
