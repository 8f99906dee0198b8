//! Telemetry overhead (issue 13): the run-core burst scenario with telemetry off, then on
//! (traces, metrics and logs over OTLP/HTTP to a real receiver in this process, which decodes
//! every request), alternated so that drift in the machine affects both alike.
//!
//! ```text
//! cargo build --release -p lamplighter-worker
//! TMPDIR=/dev/shm cargo bench -p lamplighter-tests --bench telemetry -- [--bursts 3] [--rounds 3] [--grpc]
//! ```
//!
//! `--grpc`: "on" exports over OTLP/gRPC (`protocol: grpc`) to the receiver's gRPC services.
//!
//! (`TMPDIR=/dev/shm`: the workers' data dirs on tmpfs, where file-save's file creation costs
//! the same in every round; on disk it varies by tens of percent and hides the difference.)
//!
//! Each side runs in a fresh worker for a fixed window of whole bursts: from 1 s before a tick
//! (at least 3 s after the worker is ready, so start-up is not counted) to 6 s after the last
//! one. Per run: the worker's CPU time (utime + stime from /proc) over that window divided by
//! the runs due in it, and the start lateness (`started_at − due_at`) of those runs. Rounds
//! alternate which side goes first (off, on, on, off, …): each worker's runs leave the file
//! system (file-save's files, the deleted temp dirs) a little different for the next.
//! Target: ≤ 5 % more CPU per run and ≤ 2 ms more p99 lateness with telemetry on.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{SAVE, Worker, bin, cpu_ms, cpu_ms_by_thread, jobs_yaml, now_ms, pct_up, read_rows, sleep_until, summary};

use lamplighter_tests::otlp::Receiver;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let bursts: i64 = arg("--bursts").map(|s| s.parse().expect("--bursts N")).unwrap_or(3);
    let rounds: usize = arg("--rounds").map(|s| s.parse().expect("--rounds N")).unwrap_or(3);
    println!("binary: {}", bin().display());
    let grpc = args.iter().any(|a| a == "--grpc");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let otlp = if grpc { rt.block_on(Receiver::start_grpc()) } else { rt.block_on(Receiver::start()) };
    let protocol = if grpc { "grpc" } else { "http/protobuf" };
    println!("telemetry on: OTLP over {protocol}");
    let mut off = Totals::default();
    let mut on = Totals::default();
    // Per round: CPU per run on / off, and p99 on − off (ms).
    let mut pairs: Vec<(f64, i64)> = Vec::new();
    for round in 1..=rounds {
        let (a, b) = if round % 2 == 1 {
            let a = burst(None, bursts, round);
            (a, burst(Some((&otlp, protocol)), bursts, round))
        } else {
            let b = burst(Some((&otlp, protocol)), bursts, round);
            (burst(None, bursts, round), b)
        };
        let per = |r: &(usize, u64, Vec<i64>)| r.1 as f64 / r.0.max(1) as f64;
        pairs.push((per(&b) / per(&a), p99(&b.2) - p99(&a.2)));
        off.add(a);
        on.add(b);
    }
    println!("\n== totals over {rounds} round(s) of {bursts} bursts each ==");
    for (label, t) in [("off", &off), ("on ", &on)] {
        println!("telemetry {label}: {} runs, CPU {:.3} ms per run", t.runs, t.cpu_ms as f64 / t.runs.max(1) as f64);
        summary(&format!("telemetry {label}: start lateness ms"), t.lateness.clone());
    }
    let per = |t: &Totals| t.cpu_ms as f64 / t.runs.max(1) as f64;
    println!("CPU per run, on vs off: {:+.1} %", (per(&on) / per(&off) - 1.0) * 100.0);
    let cpu: Vec<String> = pairs.iter().map(|(r, _)| format!("{:+.1}", (r - 1.0) * 100.0)).collect();
    let lat: Vec<String> = pairs.iter().map(|(_, d)| format!("{d:+}")).collect();
    let mean = pairs.iter().map(|(r, _)| r - 1.0).sum::<f64>() / pairs.len().max(1) as f64 * 100.0;
    println!("per round, CPU per run on vs off (%): {} (mean {mean:+.1})", cpu.join(" "));
    println!("per round, p99 lateness on − off (ms): {}", lat.join(" "));
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

/// The 99th percentile, as `summary` prints it.
fn p99(v: &[i64]) -> i64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    if v.is_empty() { 0 } else { pct_up(&v, 0.99) }
}

/// One burst scenario: 1,000 jobs every 10 s, concurrency 1000, `file-save`; measured over
/// `bursts` whole bursts.
fn burst(on: Option<(&Receiver, &str)>, bursts: i64, round: usize) -> (usize, u64, Vec<i64>) {
    const PERIOD: i64 = 10_000;
    let otlp = on.map(|(r, _)| r);
    let telemetry = match on {
        None => String::new(),
        Some((r, p)) => format!(
            "telemetry:\n  enabled: true\n  traces: {{exporter: otlp, protocol: {p}, endpoint: \"{u}\"}}\n  metrics: {{exporter: otlp, protocol: {p}, endpoint: \"{u}\"}}\n  logs: {{exporter: otlp, protocol: {p}, endpoint: \"{u}\"}}\n",
            u = r.base_url()
        ),
    };
    let spans_before = otlp.map_or(0, |r| r.spans().len());
    let mut w = Worker::with(&telemetry, &jobs_yaml(1000, "*/10 * * * * *", SAVE), 1000);
    w.start();
    // The first tick of the window: at least 3 s after ready, so that start-up (and a burst
    // that started right after it) is done before the window opens.
    let first = ((now_ms() + 3_000) as u64).div_ceil(PERIOD as u64) as i64 * PERIOD;
    let last = first + (bursts - 1) * PERIOD;
    sleep_until(first - 1_000);
    let cpu0 = cpu_ms(w.pid());
    let threads0 = cpu_ms_by_thread(w.pid());
    sleep_until(last + 6_000);
    let cpu = cpu_ms(w.pid()) - cpu0;
    let threads: Vec<String> = cpu_ms_by_thread(w.pid())
        .into_iter()
        .map(|(name, ms)| format!("{name} {}", ms - threads0.get(&name).copied().unwrap_or(0)))
        .collect();
    w.stop();
    let sql = format!("SELECT started_at, due_at FROM ll_runs WHERE status = 'succeeded' AND due_at >= {first} AND due_at <= {last}");
    let rows: Vec<(Option<i64>, i64)> = read_rows(&w.db(), &sql, |r| {
        use sqlx::Row;
        (r.get("started_at"), r.get("due_at"))
    });
    assert_eq!(rows.len() as i64, bursts * 1000, "every run of the window succeeded:\n{}", w.log());
    let lateness: Vec<i64> = rows.iter().filter_map(|(s, d)| Some(s.as_ref()? - d)).collect();
    let label = if otlp.is_some() { "on" } else { "off" };
    println!("\n== round {round}, telemetry {label}: {} runs, worker CPU {cpu} ms ==", rows.len());
    summary("start lateness ms", lateness.clone());
    println!("CPU ms by thread: {}", threads.join(", "));
    if let Some(r) = otlp {
        // Two spans per run (the run and its plugin action), for every run the worker ran.
        println!("spans received: {} (2 per run)", r.spans().len() - spans_before);
    }
    (rows.len(), cpu, lateness)
}
