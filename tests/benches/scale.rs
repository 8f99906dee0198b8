//! Scale benchmark (issue 57, item 5): a very large file of jobs, and many runtime jobs, on the
//! real `lamplighter` binary (release build).
//!
//! ```text
//! cargo build --release -p lamplighter-worker
//! cargo bench -p lamplighter-tests --bench scale -- [files] [runtime] [--jobs 10000,100000,1000000] [--seconds 30]
//! ```
//!
//! - files: `--jobs` N `file-save` jobs in one file, each at its own second of the day
//!   (spread, not in order), in one of four zones, and twenty per-second jobs among them: start
//!   to `/readyz`, idle RSS, then for `--seconds` the start lateness (`started_at − due_at`) of
//!   the per-second jobs' runs and of the others due meanwhile; then one job paused and resumed
//!   over MCP (`lampctl`), each call's round trip and the lateness of the seconds around it;
//!   then the config reloaded (`lampctl config reload`), likewise.
//! - runtime: N jobs created over MCP (`create_job`, four rmcp clients at once, each job at its
//!   own second of the day) on a worker with none; the create rate by tenth (does a create cost
//!   more with more jobs in force?); then SIGTERM, and the time from a new start to `/readyz`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::{Worker, now_ms, read_rows, sleep_until, status_kb, summary};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;

const ZONES: [&str; 4] = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"];
/// Per-second jobs among the large set.
const EVERY_SECOND: usize = 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let seconds: u64 = arg("--seconds").map(|s| s.parse().expect("--seconds N")).unwrap_or(30);
    let jobs: Vec<usize> =
        arg("--jobs").unwrap_or_else(|| "100000".into()).split(',').map(|n| n.trim().parse().expect("--jobs N[,N]")).collect();
    let mut scenarios: Vec<&str> = args.iter().map(String::as_str).filter(|a| ["files", "runtime"].contains(a)).collect();
    if scenarios.is_empty() {
        scenarios = vec!["files", "runtime"];
    }
    println!("binary: {}", common::bin().display());
    for s in scenarios {
        for &n in &jobs {
            match s {
                "files" => files(n, seconds),
                _ => runtime(n),
            }
        }
    }
}

/// Job `i`'s second of the day: spread over the day, neighbours far apart.
fn second_of_day(i: usize) -> usize {
    (i * 48_271) % 86_400
}

fn files(n: usize, seconds: u64) {
    let mut yaml = String::with_capacity(n * 190);
    for i in 0..n {
        let s = second_of_day(i);
        yaml.push_str(&format!(
            "    job-{i:07}:\n      cron: \"{} {} {} * * *\"\n      timezone: {}\n      type: plugin\n      plugin: file-save\n      action: save\n      parameters: {{ path: \"out/{}.txt\", content: \"x\" }}\n",
            s % 60,
            s / 60 % 60,
            s / 3600,
            ZONES[i % ZONES.len()],
            i % 1000
        ));
    }
    for i in 0..EVERY_SECOND {
        yaml.push_str(&format!(
            "    second-{i:02}:\n      cron: \"* * * * * *\"\n      type: plugin\n      plugin: file-save\n      action: save\n      parameters: {{ path: \"out/second-{i}.txt\", content: \"x\" }}\n"
        ));
    }
    let mut w = Worker::with("    manage_jobs: {enabled: true}\n", &yaml, 64);
    drop(yaml);
    let ready = w.start();
    std::thread::sleep(Duration::from_secs(3));
    let mb = |field| status_kb(w.pid(), field) as f64 / 1024.0;
    println!("\n== files: {n} jobs spread over the day in {} zones, {EVERY_SECOND} per-second jobs ==", ZONES.len());
    println!(
        "start to ready: {} ms; idle RSS {:.1} MB: {:.1} MB the process's own, {:.1} MB mapped from files",
        ready.as_millis(),
        mb("VmRSS"),
        mb("RssAnon"),
        mb("RssFile")
    );
    let from = now_ms();
    std::thread::sleep(Duration::from_secs(seconds));
    let until = now_ms();
    let ctl = common::bin().with_file_name("lampctl");
    // One job paused and resumed, then the whole config read again and swapped in (the plan
    // of every job built again): each call's round trip, and the ticks around them.
    let (calls, paused) = calls_and_ticks(&w, &ctl, &[&["jobs", "pause", "job-0000001"], &["jobs", "resume", "job-0000001"]]);
    let (reload, reloaded) = calls_and_ticks(&w, &ctl, &[&["config", "reload"]]);
    w.stop();
    let rows = read_rows(&w.db(), "SELECT job, due_at, started_at FROM ll_runs", |r| {
        use sqlx::Row;
        (r.get::<String, _>("job"), r.get::<i64, _>("due_at"), r.get::<Option<i64>, _>("started_at"))
    });
    let late = |per_second: bool, (a, b): (i64, i64)| -> Vec<i64> {
        rows.iter()
            .filter(|(job, due, _)| job.starts_with("second-") == per_second && (a..b).contains(due))
            .map(|(_, due, started)| started.map_or(i64::MAX, |s| s - due))
            .collect()
    };
    summary(&format!("per-second jobs' start lateness ms over {seconds} s"), late(true, (from, until)));
    summary("the others' due meanwhile", late(false, (from, until)));
    println!("lampctl jobs pause / resume round trip: {calls:?} ms");
    summary("per-second jobs' lateness ms from the pause to 3 s after the resume", late(true, paused));
    println!("lampctl config reload round trip: {reload:?} ms");
    summary("per-second jobs' lateness ms from the reload to 3 s after it", late(true, reloaded));
}

/// Runs each `lampctl` call in turn: their round trips (ms), and the window of ticks around
/// them (from the first call's start to 3 s after the last's end), waited out so that those
/// ticks have started before anything else is asked of the worker.
fn calls_and_ticks(w: &Worker, ctl: &std::path::Path, calls: &[&[&str]]) -> (Vec<u128>, (i64, i64)) {
    let from = now_ms();
    let took = calls
        .iter()
        .map(|args| {
            let t = Instant::now();
            let out = std::process::Command::new(ctl).args(["--url", &w.url()]).args(*args).output().expect("lampctl");
            assert!(out.status.success(), "lampctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
            t.elapsed().as_millis()
        })
        .collect();
    let window = (from, now_ms() + 3_000);
    until_started(w, window);
    (took, window)
}

/// Waits until every per-second tick due in `window` has a run that started, as the worker's
/// database says: the window's end first (the worker's ticks come on the wall clock), then
/// each look at the database a tenth of a second after the last, up to 10 s past the end
/// (ticks still not started then count as never started in the lateness).
fn until_started(w: &Worker, (from, until): (i64, i64)) {
    // Each whole second in the window, for each per-second job.
    let ticks = ((until - 1).div_euclid(1_000) - (from + 999).div_euclid(1_000) + 1).max(0) * EVERY_SECOND as i64;
    let sql = format!(
        "SELECT count(*) FROM ll_runs WHERE job LIKE 'second-%' AND due_at >= {from} AND due_at < {until} AND started_at IS NOT NULL"
    );
    let mut look = until;
    loop {
        sleep_until(look);
        let started = read_rows(&w.db(), &sql, |r| sqlx::Row::get::<i64, _>(r, 0)).first().copied().expect("count(*) returns a row");
        if started >= ticks || look >= until + 10_000 {
            return;
        }
        look = now_ms() + 100;
    }
}

fn runtime(n: usize) {
    const CLIENTS: usize = 4;
    let mut w = Worker::with("    manage_jobs: {enabled: true, max_jobs: 10000000}\n", "", 64);
    w.start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let url = w.url();
    let began = Instant::now();
    // Per tenth of the jobs: the seconds it took.
    let tenths: Vec<f64> = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            clients.push(().serve(StreamableHttpClientTransport::from_uri(url.clone())).await.expect("connect"));
        }
        let clients = std::sync::Arc::new(clients);
        let tenth = n.div_ceil(10);
        let mut tenths = Vec::new();
        for t in 0..10 {
            let start = Instant::now();
            let mut tasks = Vec::new();
            for c in 0..CLIENTS {
                let clients = clients.clone();
                tasks.push(tokio::spawn(async move {
                    for i in (t * tenth..((t + 1) * tenth).min(n)).filter(|i| i % CLIENTS == c) {
                        let s = second_of_day(i);
                        let definition = serde_json::json!({
                            "cron": format!("{} {} {} * * *", s % 60, s / 60 % 60, s / 3600),
                            "timezone": ZONES[i % ZONES.len()],
                            "plugin": "file-save", "action": "save",
                            "parameters": {"path": format!("out/{}.txt", i % 1000), "content": "x"}
                        });
                        let args = serde_json::json!({"name": format!("job-{i:07}"), "definition": definition});
                        let params = CallToolRequestParams::new("create_job").with_arguments(args.as_object().cloned().expect("object"));
                        let r = clients[c].call_tool(params).await.expect("call");
                        assert_ne!(r.is_error, Some(true), "create_job failed: {r:?}");
                    }
                }));
            }
            for task in tasks {
                task.await.expect("client");
            }
            tenths.push(start.elapsed().as_secs_f64());
        }
        tenths
    });
    let took = began.elapsed().as_secs_f64();
    println!("\n== runtime: {n} jobs created over MCP, {CLIENTS} clients ==");
    println!("created in {took:.1} s ({:.0} jobs/s)", n as f64 / took);
    println!("jobs/s by tenth: {}", tenths.iter().map(|s| format!("{:.0}", n as f64 / 10.0 / s)).collect::<Vec<_>>().join(" "));
    let idle = status_kb(w.pid(), "VmRSS") as f64 / 1024.0;
    w.stop();
    let ready = w.start();
    std::thread::sleep(Duration::from_secs(3));
    println!(
        "RSS before the restart {idle:.1} MB; restart to ready: {} ms; idle RSS after it {:.1} MB",
        ready.as_millis(),
        status_kb(w.pid(), "VmRSS") as f64 / 1024.0
    );
    w.stop();
}
