//! Agent loop benchmark (issue 11): what the durable tool loop costs on top of the model, on
//! the real `lamplighter` binary (release build), against the scripted OpenAI-compatible server
//! answering at once.
//!
//! ```text
//! cargo build --release -p lamplighter-worker -p lamplighter-ctl
//! cargo bench -p lamplighter-tests --bench agent -- [--runs 20]
//! ```
//!
//! Two agent jobs, each triggered `--runs` times one after another with `lampctl jobs trigger
//! --wait`: `answer` (one model call, a text answer) and `loop` (50 turns: a model call that
//! asks for `file-read` of a 2-byte file, the tool call, then a final answer). A run's duration
//! is `finished_at − started_at` as the worker records it (ms). Per turn = (loop − answer) / 50:
//! one model round trip plus one tool call, each checkpointed to SQLite before the next. The
//! baseline is the same HTTP request (a 50-turn conversation's body) sent straight to the
//! server with reqwest, 500 times.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Instant;

use common::{Worker, bin, pct, read_rows};
use lamplighter_tests::llm::{Reply, ScriptedLlm, tool_results};

const TURNS: usize = 50;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let runs: usize = args.iter().position(|a| a == "--runs").and_then(|i| args.get(i + 1)).map_or(20, |n| n.parse().expect("--runs N"));
    println!("binary: {}", bin().display());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let llm = rt.block_on(ScriptedLlm::start((100, 20), |req| {
        let input =
            lamplighter_tests::llm::messages(req).iter().find(|m| m["role"] == "user").and_then(|m| m["content"].as_str()).unwrap_or("");
        if input == "loop" && tool_results(req) < TURNS {
            Reply::Tools(vec![("file-read__read".into(), r#"{"path": "tiny.txt"}"#.into())])
        } else {
            Reply::Text("done".into())
        }
    }));
    let top = format!(
        "ai:\n  providers:\n    p:\n      base_url: {}\n      models:\n        m: {{id: m}}\nagents:\n  a:\n    model: m\n    max_iters: 100\n    plugins: [file-read]\n",
        llm.base_url()
    );
    let jobs = "    answer: {type: agent, agent: a, input: answer, retention: {max_runs: 10000}}\n    loop: {type: agent, agent: a, input: loop, retention: {max_runs: 10000}}\n";
    let mut w = Worker::with(&top, jobs, 4);
    std::fs::create_dir_all(w.dir.path().join("data")).expect("data dir");
    std::fs::write(w.dir.path().join("data/tiny.txt"), "ok").expect("tiny file");
    w.start();
    let durations = |job: &str| w.trigger_durations(job, runs);
    let answer = durations("answer");
    let looped = durations("loop");
    println!("\n== {runs} runs each, run duration (finished − started), ms: p50 / p99 / max ==");
    for (name, v) in [("one model call", &answer), ("50 tool-loop turns", &looped)] {
        println!("{name:<20} {:>6} / {:>6} / {:>6}", pct(v, 0.5), pct(v, 0.99), v[v.len() - 1]);
    }
    let per_turn = |p: f64| (pct(&looped, p) - pct(&answer, p)) as f64 / TURNS as f64;
    println!("per turn (model round trip + tool call, both checkpointed): p50 {:.2} ms, p99 {:.2} ms", per_turn(0.5), per_turn(0.99));

    // The baseline: the longest request of a loop (50 turns of history), straight to the server.
    let body = llm.seen().iter().map(|s| s.body.clone()).max_by_key(|b| b.to_string().len()).expect("a request");
    let url = format!("{}/chat/completions", llm.base_url());
    let mut direct: Vec<u128> = rt.block_on(async {
        let http = reqwest::Client::new();
        let mut out = Vec::new();
        for _ in 0..500 {
            let t = Instant::now();
            let r = http.post(&url).json(&body).send().await.expect("send");
            let _ = r.bytes().await.expect("body");
            out.push(t.elapsed().as_micros());
        }
        out
    });
    direct.sort_unstable();
    let dp = |p: f64| pct(&direct, p) as f64 / 1000.0;
    println!("direct HTTP call, same server, {} KB body: p50 {:.2} ms, p99 {:.2} ms", body.to_string().len() / 1024, dp(0.5), dp(0.99));
    let calls: i64 = read_rows(&w.db(), "SELECT count(*) AS n FROM ll_agent_calls", |r| sqlx::Row::get::<i64, _>(r, "n"))[0];
    println!("agent call records kept: {calls}");
    w.stop();
    drop(rt);
}
