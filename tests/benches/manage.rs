//! Runtime jobs benchmark (issue 31), on the real `lamplighter` binary (release build).
//!
//! ```text
//! cargo build --release -p lamplighter-worker
//! cargo bench -p lamplighter-tests --bench manage -- [--seconds 60]
//! ```
//!
//! - create: 1,000 jobs created over MCP one by one (`create_job`, one rmcp client, Streamable
//!   HTTP, the current protocol revision) on a worker with none: p50/p99 per call. Each call
//!   compiles the definition, commits it with its history entry, and swaps the config in force.
//! - burst: the same 1,000 jobs (`*/10 * * * * *`, `file-save`, `worker.concurrency: 1000`) as
//!   runtime jobs, then as file jobs on a fresh worker, side by side, `--seconds` each: start
//!   lateness (`started_at − due_at`) p50/p99, and the spread of each burst.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::{SAVE, Worker, burst_spreads, jobs_yaml, read_rows, summary};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;

const JOBS: usize = 1000;
const CRON: &str = "*/10 * * * * *";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: u64 =
        args.iter().position(|a| a == "--seconds").and_then(|i| args.get(i + 1)).map_or(60, |v| v.parse().expect("--seconds N"));
    println!("binary: {}", common::bin().display());

    // Runtime jobs, created one by one.
    let mut w = Worker::with("    manage_jobs: {enabled: true}\n", "", JOBS);
    w.start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut lat: Vec<i64> = rt.block_on(async {
        let client = ().serve(StreamableHttpClientTransport::from_uri(w.url())).await.expect("connect");
        let mut lat = Vec::with_capacity(JOBS);
        for i in 0..JOBS {
            let definition = serde_json::json!({
                "cron": CRON, "plugin": "file-save", "action": "save",
                "parameters": {"path": format!("out/{i}.txt"), "content": "x"}
            });
            let args = serde_json::json!({"name": format!("job-{i:05}"), "definition": definition});
            let params = CallToolRequestParams::new("create_job").with_arguments(args.as_object().cloned().expect("object"));
            let t = Instant::now();
            let r = client.call_tool(params).await.expect("call");
            lat.push(t.elapsed().as_micros() as i64);
            assert_ne!(r.is_error, Some(true), "create_job failed: {r:?}");
        }
        let _ = client.cancel().await;
        lat
    });
    println!("\n== create: {JOBS} jobs created over MCP one by one ==");
    // In call order: does a call cost more with more jobs in force?
    let (first, last) = (median(&lat[..100]), median(&lat[lat.len() - 100..]));
    lat.sort_unstable();
    summary("create_job round trip µs", lat);
    println!("the first 100 calls: p50 {first} µs; the last 100: p50 {last} µs");

    println!("\n== burst: {JOBS} jobs due together every 10 s, concurrency {JOBS}, {seconds} s each ==");
    // The runtime jobs fire from the worker that created them; then the same jobs from files.
    burst("runtime jobs", w, seconds);
    let mut files = Worker::new(&jobs_yaml(JOBS, CRON, SAVE), JOBS);
    files.start();
    burst("file jobs", files, seconds);
}

fn median(v: &[i64]) -> i64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn burst(label: &str, mut w: Worker, seconds: u64) {
    std::thread::sleep(Duration::from_secs(seconds));
    w.stop();
    type Row = (Option<i64>, i64, Option<i64>);
    let rows: Vec<Row> = read_rows(&w.db(), "SELECT scheduled_at, due_at, started_at FROM ll_runs", |r| {
        use sqlx::Row;
        (r.get("scheduled_at"), r.get("due_at"), r.get("started_at"))
    });
    summary(&format!("{label}: start lateness ms"), rows.iter().filter_map(|x| Some(x.2? - x.1)).collect());
    let (spreads, per_tick) = burst_spreads(rows.iter().map(|x| (x.0, x.2)), 900);
    println!("{label}: bursts {} (runs per burst: {per_tick:?})", spreads.len());
    summary(&format!("{label}: burst spread ms"), spreads);
}
