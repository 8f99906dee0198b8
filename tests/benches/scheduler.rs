//! Scheduler benchmark (issue 2): start-to-ready time, schedule lateness under load, idle RSS
//! and idle wake-ups of the real `lamplighter` binary.
//!
//! ```text
//! cargo build --release -p lamplighter-worker
//! cargo bench -p lamplighter-tests --bench scheduler -- [--jobs 1000,10000] [--seconds 60] [--idle-seconds 40] [--concurrency 32]
//! ```
//!
//! Load shape: `N` jobs, spread so that about 17 runs start every second whatever `N` is
//! (job `i` fires at second `i mod 60` of every `N/1000`-th minute), each running
//! `file-save.save`. Lateness is `started_at − due_at` as the worker records it: from the
//! scheduled instant to the moment an executor has claimed the run. About 17 runs fall due in
//! the same instant, so with fewer executor slots than that the later ones wait for a slot:
//! `--concurrency` (default 32) separates scheduler lateness from lack of capacity. Idle: the same `N` jobs
//! moved to a yearly schedule, so nothing is due; wake-ups are the context switches of all the
//! worker's threads over the idle window (`/proc/PID/task/*/status`).
#![allow(clippy::disallowed_methods)]

mod common;

use common::{Worker, bin, read_rows, rss_kb};

use std::path::Path;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let job_counts: Vec<usize> =
        arg("--jobs").unwrap_or_else(|| "1000,10000".into()).split(',').map(|s| s.trim().parse().expect("--jobs N[,N]")).collect();
    let seconds: u64 = arg("--seconds").map(|s| s.parse().expect("--seconds N")).unwrap_or(60);
    let idle_seconds: u64 = arg("--idle-seconds").map(|s| s.parse().expect("--idle-seconds N")).unwrap_or(40);
    let concurrency: usize = arg("--concurrency").map(|s| s.parse().expect("--concurrency N")).unwrap_or(32);
    println!("binary: {}", bin().display());
    for n in job_counts {
        loaded(n, seconds, concurrency);
        idle(n, idle_seconds);
    }
}

fn jobs_yaml(n: usize, schedule: impl Fn(usize) -> String) -> String {
    let mut s = String::with_capacity(n * 160);
    for i in 0..n {
        s.push_str(&format!(
            "    job-{i:05}:\n      cron: \"{}\"\n      type: plugin\n      plugin: file-save\n      action: save\n      parameters: {{ path: \"out/{i}.txt\", content: \"x\" }}\n",
            schedule(i)
        ));
    }
    s
}

fn loaded(n: usize, seconds: u64, concurrency: usize) {
    // Every `period` minutes at second i mod 60, offset so the load is even: ~1000 jobs/min.
    let period = n.div_ceil(1000).max(1);
    let yaml = jobs_yaml(n, |i| {
        if period == 1 { format!("{} * * * * *", i % 60) } else { format!("{} {}/{} * * * *", i % 60, (i / 60) % period, period) }
    });
    let mut w = Worker::new(&yaml, concurrency);
    let ready_in = w.start();
    println!("\n== {n} jobs, loaded, concurrency {concurrency} ({seconds} s, ~{:.0} runs/s) ==", 1000.0 / 60.0);
    println!("start to ready: {} ms", ready_in.as_millis());
    std::thread::sleep(Duration::from_secs(seconds));
    let rss = rss_kb(w.pid());
    w.stop();
    let mut late = lateness(&w.db());
    late.sort_unstable();
    if late.is_empty() {
        println!("no runs recorded");
        return;
    }
    let pct = |p: f64| late[((late.len() as f64 * p).ceil() as usize).clamp(1, late.len()) - 1];
    println!("runs: {}", late.len());
    println!("lateness ms: p50 {} p99 {} max {}", pct(0.50), pct(0.99), late[late.len() - 1]);
    println!("RSS under load: {:.1} MB", rss as f64 / 1024.0);
}

fn idle(n: usize, seconds: u64) {
    let yaml = jobs_yaml(n, |i| format!("{} {} 1 1 *", i % 60, (i / 60) % 24));
    let mut w = Worker::new(&yaml, 4);
    let ready_in = w.start();
    println!("\n== {n} jobs, idle ({seconds} s window) ==");
    println!("start to ready: {} ms", ready_in.as_millis());
    // Let start-up work settle, then count.
    std::thread::sleep(Duration::from_secs(2));
    let before = switches(w.pid());
    std::thread::sleep(Duration::from_secs(seconds));
    let after = switches(w.pid());
    println!("idle RSS: {:.1} MB", rss_kb(w.pid()) as f64 / 1024.0);
    println!(
        "idle wake-ups: {} in {seconds} s ({:.2}/s)",
        after.saturating_sub(before),
        after.saturating_sub(before) as f64 / seconds as f64
    );
    w.stop();
}

/// Voluntary plus involuntary context switches of every thread: each wake-up is one.
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .map(|t| {
            let s = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            s.lines()
                .filter(|l| l.starts_with("voluntary_ctxt_switches:") || l.starts_with("nonvoluntary_ctxt_switches:"))
                .filter_map(|l| l.split(':').nth(1).and_then(|v| v.trim().parse::<u64>().ok()))
                .sum::<u64>()
        })
        .sum()
}

fn lateness(db: &Path) -> Vec<i64> {
    use sqlx::Row;
    read_rows(db, "SELECT started_at - due_at AS late FROM ll_runs WHERE started_at IS NOT NULL AND trigger = 'cron'", |r| {
        r.get::<i64, _>("late")
    })
}
