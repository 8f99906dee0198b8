//! Workflow benchmark (issue 10): the cost of a durable step, on the real `lamplighter` binary
//! (release build), with a near no-op plugin step (`file-read` of a 2-byte file).
//!
//! ```text
//! cargo build --release -p lamplighter-worker -p lamplighter-ctl
//! cargo bench -p lamplighter-tests --bench workflow -- [--runs 30]
//! ```
//!
//! Three jobs, each triggered `--runs` times one after another with `lampctl jobs trigger
//! --wait`: a 100-step workflow, a 1-step workflow, and the same action as a plain plugin job.
//! A run's duration is `finished_at − started_at` as the worker records it (ms), so the MCP
//! round trip is not in it. Per step = (100-step run − plugin-job run) / 100: the engine's cost
//! per step, with both of its checkpoints (step started, step ended) committed to SQLite.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{Worker, bin, pct, read_rows};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let runs: usize = args.iter().position(|a| a == "--runs").and_then(|i| args.get(i + 1)).map_or(30, |n| n.parse().expect("--runs N"));
    println!("binary: {}", bin().display());
    let step = "      - {id: s{i}, type: plugin, plugin: file-read, action: read, parameters: {path: tiny.txt}}\n";
    let steps = |n: usize| (0..n).map(|i| step.replace("{i}", &i.to_string())).collect::<String>();
    let top = format!("workflows:\n  w100:\n    steps:\n{}  w1:\n    steps:\n{}", steps(100), steps(1));
    let jobs = "    j100: {type: workflow, workflow: w100, retention: {max_runs: 10000}}\n    j1: {type: workflow, workflow: w1, retention: {max_runs: 10000}}\n    plain: {type: plugin, plugin: file-read, action: read, parameters: {path: tiny.txt}, retention: {max_runs: 10000}}\n";
    let mut w = Worker::with(&top, jobs, 4);
    std::fs::create_dir_all(w.dir.path().join("data")).expect("data dir");
    std::fs::write(w.dir.path().join("data/tiny.txt"), "ok").expect("tiny file");
    w.start();
    let durations = |job: &str| w.trigger_durations(job, runs);
    let plain = durations("plain");
    let one = durations("j1");
    let hundred = durations("j100");
    println!("\n== {runs} runs each, run duration (finished − started), ms: p50 / p99 / max ==");
    for (name, v) in [("plugin job (file-read)", &plain), ("1-step workflow", &one), ("100-step workflow", &hundred)] {
        println!("{name:<24} {:>6} / {:>6} / {:>6}", pct(v, 0.5), pct(v, 0.99), v[v.len() - 1]);
    }
    let per_step = |p: f64| (pct(&hundred, p) - pct(&plain, p)) as f64 / 100.0;
    println!("per durable step: p50 {:.2} ms, p99 {:.2} ms", per_step(0.5), per_step(0.99));
    let steps_written: i64 = read_rows(&w.db(), "SELECT count(*) AS n FROM ll_steps", |r| sqlx::Row::get::<i64, _>(r, "n"))[0];
    println!("step records kept: {steps_written}");
    w.stop();
}
