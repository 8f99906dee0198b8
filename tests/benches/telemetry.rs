//! Telemetry overhead (issue 13): the run-core burst scenario with telemetry off, then on
//! (traces, metrics and logs over OTLP/HTTP to a real receiver in this process, which decodes
//! every request), alternated so that drift in the machine affects both alike.
//!
//! ```text
//! cargo build --release -p lamplighter-worker
//! cargo bench -p lamplighter-tests --bench telemetry -- [--seconds 40] [--rounds 2]
//! ```
//!
//! Per run: the worker's CPU time (utime + stime from /proc) over the whole run, divided by
//! the runs it executed, and the start lateness (`started_at − due_at`) of every run. Target:
//! ≤ 5 % more CPU per run and ≤ 2 ms more p99 lateness with telemetry on.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{SAVE, Worker, bin, cpu_ms, jobs_yaml, read_rows, summary};

use std::time::Duration;

use lamplighter_tests::otlp::Receiver;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let seconds: u64 = arg("--seconds").map(|s| s.parse().expect("--seconds N")).unwrap_or(40);
    let rounds: usize = arg("--rounds").map(|s| s.parse().expect("--rounds N")).unwrap_or(2);
    println!("binary: {}", bin().display());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let otlp = rt.block_on(Receiver::start());
    let mut off = Totals::default();
    let mut on = Totals::default();
    for round in 1..=rounds {
        off.add(burst(None, seconds, round));
        on.add(burst(Some(&otlp), seconds, round));
    }
    println!("\n== totals over {rounds} round(s) of {seconds} s each ==");
    for (label, t) in [("off", &off), ("on ", &on)] {
        println!("telemetry {label}: {} runs, CPU {:.3} ms per run", t.runs, t.cpu_ms as f64 / t.runs.max(1) as f64);
        summary(&format!("telemetry {label}: start lateness ms"), t.lateness.clone());
    }
    let per = |t: &Totals| t.cpu_ms as f64 / t.runs.max(1) as f64;
    println!("CPU per run, on vs off: {:+.1} %", (per(&on) / per(&off) - 1.0) * 100.0);
    println!("receiver: {} spans, metric names {}, {} log records", otlp.spans().len(), otlp.metric_names().len(), otlp.logs().len());
    drop(rt);
}

#[derive(Default)]
struct Totals {
    runs: usize,
    cpu_ms: u64,
    lateness: Vec<i64>,
}

impl Totals {
    fn add(&mut self, (runs, cpu, lateness): (usize, u64, Vec<i64>)) {
        self.runs += runs;
        self.cpu_ms += cpu;
        self.lateness.extend(lateness);
    }
}

/// One burst scenario: 1,000 jobs every 10 s, concurrency 1000, `file-save`.
fn burst(otlp: Option<&Receiver>, seconds: u64, round: usize) -> (usize, u64, Vec<i64>) {
    let telemetry = match otlp {
        None => String::new(),
        Some(r) => format!(
            "telemetry:\n  enabled: true\n  traces: {{exporter: otlp, endpoint: \"{u}\"}}\n  metrics: {{exporter: otlp, endpoint: \"{u}\", export_interval_ms: 5000}}\n  logs: {{exporter: otlp, endpoint: \"{u}\"}}\n",
            u = r.base_url()
        ),
    };
    let spans_before = otlp.map_or(0, |r| r.spans().len());
    let mut w = Worker::with(&telemetry, &jobs_yaml(1000, "*/10 * * * * *", SAVE), 1000);
    w.start();
    std::thread::sleep(Duration::from_secs(seconds));
    let cpu = cpu_ms(w.pid());
    w.stop();
    let rows: Vec<(Option<i64>, i64)> = read_rows(&w.db(), "SELECT started_at, due_at FROM ll_runs WHERE status = 'succeeded'", |r| {
        use sqlx::Row;
        (r.get("started_at"), r.get("due_at"))
    });
    let lateness: Vec<i64> = rows.iter().filter_map(|(s, d)| Some(s.as_ref()? - d)).collect();
    let label = if otlp.is_some() { "on" } else { "off" };
    println!("\n== round {round}, telemetry {label}: {} runs, worker CPU {cpu} ms ==", rows.len());
    summary("start lateness ms", lateness.clone());
    if let Some(r) = otlp {
        // Two spans per run (the run and its plugin action).
        println!("spans received: {} (runs × 2 = {})", r.spans().len() - spans_before, rows.len() * 2);
    }
    (rows.len(), cpu, lateness)
}
