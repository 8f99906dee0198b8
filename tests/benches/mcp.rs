//! MCP benchmark (issue 3): `tools/call` round trips on loopback against the real worker.
//!
//! ```text
//! cargo build --release -p lamplighter-worker -p lamplighter-ctl
//! cargo bench -p lamplighter-tests --bench mcp -- [--jobs 1000] [--calls 2000] [--clients 8] [--seconds 5]
//! ```
//!
//! Measures, with `--jobs` jobs defined (none due during the run): p50/p99 of `list_jobs` (its
//! default page of 100, and all jobs in one page) and of `get_job` from one rmcp client (Streamable HTTP, the current protocol revision); calls per
//! second of `get_job` with `--clients` concurrent clients; whole-process wall time of
//! `lampctl jobs list` (p50/p99 over 50 runs).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(|v| v.parse().expect("a number")).unwrap_or(default)
    };
    let (jobs, calls, clients, seconds) = (arg("--jobs", 1000), arg("--calls", 2000), arg("--clients", 8), arg("--seconds", 5));
    let dir = target_dir();
    let worker = Worker::start(&dir.join("lamplighter"), jobs);
    let url = format!("http://127.0.0.1:{}/mcp", worker.port);
    println!("worker: {} jobs at {url}", jobs);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = ().serve(StreamableHttpClientTransport::from_uri(url.clone())).await.expect("connect");
        for (label, tool, args) in [
            ("list_jobs, default page of 100", "list_jobs", serde_json::json!({})),
            ("list_jobs, all 1,000 in one page", "list_jobs", serde_json::json!({"limit": 1000})),
            ("get_job", "get_job", serde_json::json!({"name": "job-00042"})),
        ] {
            let params = || CallToolRequestParams::new(tool).with_arguments(args.as_object().cloned().unwrap_or_default());
            for _ in 0..50 {
                client.call_tool(params()).await.expect("warm-up call");
            }
            let mut lat = Vec::with_capacity(calls);
            for _ in 0..calls {
                let t = Instant::now();
                let r = client.call_tool(params()).await.expect("call");
                lat.push(t.elapsed());
                assert_ne!(r.is_error, Some(true), "{tool} failed: {r:?}");
            }
            report(&format!("{label} (1 client, {calls} calls)"), &mut lat);
        }
        let _ = client.cancel().await;

        // Concurrent clients, each with its own connection, for a fixed time.
        let deadline = Instant::now() + Duration::from_secs(seconds as u64);
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let url = url.clone();
            tasks.push(tokio::spawn(async move {
                let client = ().serve(StreamableHttpClientTransport::from_uri(url)).await.expect("connect");
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let p = CallToolRequestParams::new("get_job")
                        .with_arguments(serde_json::json!({"name": "job-00042"}).as_object().cloned().unwrap_or_default());
                    client.call_tool(p).await.expect("call");
                    n += 1;
                }
                let _ = client.cancel().await;
                n
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("client task");
        }
        println!("get_job, {clients} concurrent clients: {:.0} calls/s ({total} in {seconds} s)", total as f64 / seconds as f64);
    });

    let ctl = dir.join("lampctl");
    let mut wall = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let out = Command::new(&ctl).args(["--url", &url, "jobs", "list"]).stdout(Stdio::null()).status().expect("lampctl");
        wall.push(t.elapsed());
        assert!(out.success(), "lampctl jobs list failed");
    }
    report(&format!("lampctl jobs list, whole process ({jobs} jobs, 50 runs)"), &mut wall);
    drop(worker);
}

fn report(what: &str, lat: &mut [Duration]) {
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("{what}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms", ms(pct(0.5)), ms(pct(0.99)), ms(lat[lat.len() - 1]));
}

fn target_dir() -> PathBuf {
    let mut p = std::env::current_exe().expect("current exe");
    p.pop();
    if p.ends_with("deps") {
        p.pop();
    }
    for bin in ["lamplighter", "lampctl"] {
        assert!(p.join(bin).exists(), "{bin} not built: run `cargo build --release -p lamplighter-worker -p lamplighter-ctl` first");
    }
    p
}

struct Worker {
    _dir: tempfile::TempDir,
    child: Child,
    port: u16,
}

impl Worker {
    fn start(bin: &Path, jobs: usize) -> Worker {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        let mut yaml = format!(
            "framework:\n  data_dir: {}\nworker:\n  mcp:\n    port: {port}\nscheduling:\n  jobs:\n",
            dir.path().join("data").display()
        );
        for i in 0..jobs {
            yaml.push_str(&format!(
                "    job-{i:05}:\n      cron: \"{} {} 1 1 *\"\n      type: plugin\n      plugin: file-save\n      action: save\n      parameters: {{ path: out.txt, content: x }}\n",
                i % 60,
                (i / 60) % 24
            ));
        }
        std::fs::write(dir.path().join("l.yaml"), yaml).expect("config");
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(dir.path().join("l.yaml"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn lamplighter");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(60), "worker did not listen");
            std::thread::sleep(Duration::from_millis(10));
        }
        Worker { _dir: dir, child, port }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
