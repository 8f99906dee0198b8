//! Live output and notification benchmark (issue 34), on the real `lamplighter` binary
//! (release build).
//!
//! ```text
//! cargo build --release -p lamplighter-worker
//! cargo bench -p lamplighter-tests --bench notify -- [--runs 5]
//! ```
//!
//! - output: a `shell-exec` command printing 10 MB (100-byte lines), its output recorded live
//!   (the first 1 MiB kept as lines, the rest counted), against the same command with its
//!   output sent to /dev/null: run duration p50, throughput, and the worker's CPU per run.
//! - notifications: 1,000 jobs failing on one tick, each with a failure notification to a
//!   local webhook: from each run's end to its notification's arrival, p50/p99, and until the
//!   last arrived.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::{Worker, cpu_ms, summary};
use lamplighter_tests::webhook::Receiver;

const TEN_MB: &str = "head -c 10485760 /dev/zero | tr '\\\\0' x | fold -w 100";
const JOBS: usize = 1000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args.iter().position(|a| a == "--runs").and_then(|i| args.get(i + 1)).map_or(5, |v| v.parse().expect("--runs N"));
    println!("binary: {}", common::bin().display());
    output(runs);
    notifications();
}

fn output(runs: usize) {
    println!("\n== output: a command printing 10 MB in 100-byte lines, {runs} runs each ==");
    let job = |name: &str, command: &str| {
        format!(
            "    {name}:\n      type: plugin\n      plugin: shell-exec\n      action: run\n      parameters: {{command: \"{command}\", timeout_seconds: 600}}\n"
        )
    };
    let jobs = job("discarded", &format!("{TEN_MB} > /dev/null")) + &job("recorded", TEN_MB);
    let mut w = Worker::new(&jobs, 4);
    w.start();
    for name in ["discarded", "recorded"] {
        let cpu_before = cpu_ms(w.pid());
        let durations = w.trigger_durations(name, runs);
        let cpu = (cpu_ms(w.pid()) - cpu_before) / runs as u64;
        let p50 = durations[durations.len() / 2];
        println!(
            "{name}: run duration p50 {p50} ms (max {} ms), {:.0} MB/s, worker CPU {cpu} ms a run",
            durations[durations.len() - 1],
            10.0 * 1000.0 / p50.max(1) as f64
        );
    }
    let lines = common::read_rows(&w.db(), "SELECT count(*) AS n FROM ll_run_output", |r| sqlx::Row::get::<i64, _>(r, "n"));
    println!("lines recorded over the {runs} recorded runs: {} (the first 1 MiB of each, and a line saying what was left out)", lines[0]);
}

fn notifications() {
    println!("\n== notifications: {JOBS} jobs failing on one tick, a failure notification each ==");
    let hook = Receiver::start();
    let port = hook.port;
    let mut jobs = String::new();
    for i in 0..JOBS {
        jobs.push_str(&format!(
            "    fail-{i:04}:\n      cron: \"*/30 * * * * *\"\n      type: plugin\n      plugin: file-save\n      action: save\n      retries: {{max: 0}}\n      parameters: {{path: \"../outside-{i}\", content: x}}\n      notify: [{{on: failure, to: {{webhook: \"http://127.0.0.1:{port}/hook\"}}}}]\n"
        ));
    }
    let mut w = Worker::new(&jobs, JOBS);
    w.start();
    let cpu_before = cpu_ms(w.pid());
    let got = hook
        .wait_for(JOBS, Duration::from_secs(120))
        .unwrap_or_else(|got| panic!("only {} notifications arrived:\n{}", got.len(), w.log()));
    let cpu = cpu_ms(w.pid()) - cpu_before;
    w.stop();
    // (arrival, the run's end as the event says), Unix ms.
    let got: Vec<(i64, i64)> = got
        .iter()
        .map(|r| {
            let ended = r.body["finished_at"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
            (r.arrived_ms, ended.map_or(r.arrived_ms, |t| t.timestamp_millis()))
        })
        .collect();
    let first_end = got.iter().map(|(_, e)| *e).min().unwrap_or(0);
    let last_arrival = got.iter().map(|(a, _)| *a).max().unwrap_or(0);
    summary("run end → notification arrived, ms", got.iter().map(|(a, e)| a - e).collect());
    println!("first run's end → last notification: {} ms; worker CPU meanwhile (runs included) {cpu} ms", last_arrival - first_end);
}
