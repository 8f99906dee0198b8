//! MCP benchmark (issue 3): `tools/call` round trips on loopback against the real worker.
//!
//! ```text
//! cargo build --release -p lamplighter-worker -p lamplighter-ctl
//! cargo bench -p lamplighter-tests --bench mcp -- [--jobs 1000] [--history 100] [--calls 2000] [--clients 8] [--seconds 5]
//! ```
//!
//! Measures, with `--jobs` jobs defined (none due during the run) and `--history` finished runs
//! of each in the database (default 100, the default retention): p50/p99 of `list_jobs` (its
//! default page of 100, and all jobs in one page) and of `get_job` from one rmcp client (Streamable HTTP, the current protocol revision); calls per
//! second of `get_job` with `--clients` concurrent clients; whole-process wall time of
//! `lampctl jobs list` (p50/p99 over 50 runs). The plain-HTTP client measures the same calls
//! against this worker and the Python SDK's server side by side, and `list_jobs` once more with
//! a change before each call, so that the worker cannot serve a listing it kept. Each read is
//! also sent with a `_meta` key of the bench's own, a shape the worker's stateless transport
//! (`direct.rs`) leaves to rmcp: the same answer by both routes.
#![allow(clippy::disallowed_methods)]

use lamplighter_tests::proc::KillOnDrop;
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
    let history = arg("--history", 100);
    let dir = target_dir();
    let worker = Worker::start(&dir.join("lamplighter"), jobs);
    let url = format!("http://127.0.0.1:{}/mcp", worker.port);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(seed_history(&worker._dir.path().join("data/lamplighter.db"), jobs, history));
    println!("worker: {jobs} jobs, {history} finished runs each in its history, at {url}");
    rt.block_on(async {
        let client = ().serve(StreamableHttpClientTransport::from_uri(url.clone())).await.expect("connect");
        // Each call twice: as the client sends it (the worker's stateless transport answers
        // these reads, `direct.rs`), and with a `_meta` key of the bench's own, a shape only
        // rmcp takes: the same answer, through rmcp's `Value`.
        let calls_of =
            |tool: &'static str, args: serde_json::Value| [false, true].map(move |through_rmcp| (tool, args.clone(), through_rmcp));
        let cases = [
            ("list_jobs, default page of 100", calls_of("list_jobs", serde_json::json!({}))),
            ("list_jobs, all 1,000 in one page", calls_of("list_jobs", serde_json::json!({"limit": 1000}))),
            ("get_job", calls_of("get_job", serde_json::json!({"name": "job-00042"}))),
        ];
        for (label, (tool, args, through_rmcp)) in cases.into_iter().flat_map(|(label, c)| c.map(|c| (label, c))) {
            let label = if through_rmcp { format!("{label}, through rmcp") } else { label.to_string() };
            let params = || {
                let mut p = CallToolRequestParams::new(tool).with_arguments(args.as_object().cloned().unwrap_or_default());
                if through_rmcp {
                    let mut meta = rmcp::model::RequestMetaObject::new();
                    meta.insert("dev.lamplighter.bench/route".into(), "rmcp".into());
                    p.meta = Some(meta);
                }
                p
            };
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

    // The same calls from a plain HTTP/1.1 client (one keep-alive connection per client, the
    // 2026-07-28 headers), against this worker and, with MCP_PEER_PYTHON set to a Python that
    // has the `mcp` package, the official Python SDK's server with the same tools and jobs.
    let mut servers = vec![("lamplighter".to_string(), worker.port, None)];
    if let Ok(python) = std::env::var("MCP_PEER_PYTHON") {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peer/mcp_sdk_server.py");
        let mut child = Command::new(python)
            .arg(script)
            .args([port.to_string(), jobs.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python peer");
        // Ready when uvicorn says it is listening (its log goes to standard error).
        let stderr = child.stderr.take().expect("stderr");
        let killer = KillOnDrop(child);
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
        assert!(
            lines.by_ref().map_while(Result::ok).any(|l| l.contains("Uvicorn running")),
            "the Python SDK server did not start (is `mcp` installed for MCP_PEER_PYTHON?)"
        );
        // Keep draining its access log, so that a full pipe never blocks it.
        std::thread::spawn(move || lines.for_each(drop));
        servers.push(("python sdk".to_string(), port, Some(killer)));
    }
    for (name, port, _) in &servers {
        plain_http(name, *port, calls, clients, seconds);
    }
    drop(servers);

    // On SQLite the worker keeps a listing while nothing it shows changes, so the calls above
    // are served from it. Here another connection changes a pause reason before each call, so
    // that every listing is read afresh: the cost after any change (a run's end, a pause).
    let db = worker._dir.path().join("data/lamplighter.db");
    let mut writer = rt.block_on(async {
        use sqlx::Connection;
        sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display())).await.expect("open the worker's database")
    });
    let mut c = Plain::connect(worker.port);
    let mut lat = Vec::with_capacity(calls);
    for i in 0..calls + 50 {
        rt.block_on(
            sqlx::query(
                "INSERT INTO ll_job_state (job, pause_reason) VALUES ('bench-writer', ?1) ON CONFLICT (job) DO UPDATE SET pause_reason = ?1",
            )
            .bind(i.to_string())
            .execute(&mut writer),
        )
        .expect("commit");
        let t = Instant::now();
        c.call("list_jobs", r#"{"limit":1000}"#);
        if i >= 50 {
            lat.push(t.elapsed());
        }
    }
    report(&format!("plain HTTP, lamplighter: list_jobs of all, each after a change ({calls} calls)"), &mut lat);

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

/// A worker's history after a while in service: `per_job` finished runs of every job (100 is
/// the default retention), written day by day as the scheduler would have (every job once a
/// day, run ids in time order, the last tick recorded), one in twenty failed. Written into the running worker's
/// database (it has applied its migrations once it listens; nothing is due during the bench).
async fn seed_history(db: &Path, jobs: usize, per_job: usize) {
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display())).await.expect("open the worker's database");
    let mut tx = conn.begin().await.expect("begin");
    let start: i64 = 1_750_000_000_000;
    for day in 0..per_job as i64 {
        for job in 0..jobs as i64 {
            let at = start + day * 86_400_000 + job * 60_000;
            let failed = (day + job) % 20 == 0;
            sqlx::query(
                "INSERT INTO ll_runs (id, job, trigger, status, scheduled_at, due_at, enqueued_at, dispatched_at, started_at, finished_at, output, error, worker)
                 VALUES (?1, ?2, 'cron', ?3, ?4, ?4, ?4, ?4 + 2, ?4 + 3, ?4 + 40, ?5, ?6, 'bench')",
            )
            // UUIDv7's layout: the millisecond first, so that ids sort by time as real ones do.
            .bind(format!("{:08x}-{:04x}-7000-8000-{:012x}", at >> 16, at & 0xffff, day * jobs as i64 + job))
            .bind(format!("job-{job:05}"))
            .bind(if failed { "failed" } else { "succeeded" })
            .bind(at)
            .bind((!failed).then_some(r#"{"path":"out.txt","bytes":1}"#))
            .bind(failed.then_some("file-save: disk full"))
            .execute(&mut *tx)
            .await
            .expect("insert a run");
        }
    }
    // The scheduler records each job's last tick.
    for job in 0..jobs as i64 {
        sqlx::query("INSERT INTO ll_job_state (job, last_tick) VALUES (?1, ?2)")
            .bind(format!("job-{job:05}"))
            .bind(start + (per_job as i64 - 1) * 86_400_000 + job * 60_000)
            .execute(&mut *tx)
            .await
            .expect("insert a job's state");
    }
    tx.commit().await.expect("commit");
}

/// One keep-alive HTTP/1.1 connection that sends `tools/call` at 2026-07-28 and reads whole
/// answers (`Content-Length` or chunked: plain JSON or an event stream).
struct Plain {
    reader: std::io::BufReader<std::net::TcpStream>,
    port: u16,
}

impl Plain {
    fn connect(port: u16) -> Plain {
        let s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Plain { reader: std::io::BufReader::new(s), port }
    }

    /// One call; returns the answer's body size in bytes.
    fn call(&mut self, tool: &str, args: &str) -> usize {
        self.call_with(tool, args, "")
    }

    /// A call with `extra` (`"key":value,`) first in its `_meta`.
    fn call_with(&mut self, tool: &str, args: &str, extra: &str) -> usize {
        use std::io::{BufRead, Read, Write};
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{args},"_meta":{{{extra}"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
        );
        let req = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Length: {}\r\n\r\n{body}",
            self.port,
            body.len()
        );
        self.reader.get_mut().write_all(req.as_bytes()).expect("write");
        let (mut length, mut chunked, mut status) = (None, false, String::new());
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).expect("read head");
            let l = line.trim_end().to_ascii_lowercase();
            if status.is_empty() {
                status = l.clone();
            } else if l.is_empty() {
                break;
            } else if let Some(v) = l.strip_prefix("content-length:") {
                length = v.trim().parse::<usize>().ok();
            } else if l.starts_with("transfer-encoding:") && l.contains("chunked") {
                chunked = true;
            }
        }
        assert!(status.starts_with("http/1.1 200"), "{tool}: {status}");
        let mut out = Vec::new();
        if let Some(n) = length {
            out.resize(n, 0);
            self.reader.read_exact(&mut out).expect("body");
        } else {
            assert!(chunked, "{tool}: neither a length nor chunks");
            loop {
                let mut size = String::new();
                self.reader.read_line(&mut size).expect("chunk size");
                let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
                let mut chunk = vec![0; n + 2];
                self.reader.read_exact(&mut chunk).expect("chunk");
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&chunk[..n]);
            }
        }
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("\"result\"") && !text.contains("\"isError\":true"), "{tool} failed: {text}");
        out.len()
    }
}

/// `get_job` and `list_jobs` (all jobs in one page) from one connection, then `get_job` from
/// `clients` connections for `seconds`.
fn plain_http(server: &str, port: u16, calls: usize, clients: usize, seconds: usize) {
    let mut c = Plain::connect(port);
    // A `_meta` key of the bench's own: a shape the worker's stateless transport leaves to
    // rmcp (the Python SDK ignores it).
    let rmcp = r#""dev.lamplighter.bench/route":"rmcp","#;
    for (label, tool, args, extra) in [
        ("get_job", "get_job", r#"{"name":"job-00042"}"#, ""),
        ("get_job, through rmcp", "get_job", r#"{"name":"job-00042"}"#, rmcp),
        ("list_jobs of all", "list_jobs", r#"{"limit":1000}"#, ""),
        ("list_jobs of all, through rmcp", "list_jobs", r#"{"limit":1000}"#, rmcp),
    ] {
        for _ in 0..50 {
            c.call_with(tool, args, extra);
        }
        let mut lat = Vec::with_capacity(calls);
        let mut size = 0;
        for _ in 0..calls {
            let t = Instant::now();
            size = c.call_with(tool, args, extra);
            lat.push(t.elapsed());
        }
        let mean = lat.iter().sum::<Duration>().as_secs_f64() * 1000.0 / calls as f64;
        report(&format!("plain HTTP, {server}: {label} ({calls} calls, answer {size} B, mean {mean:.2} ms)"), &mut lat);
    }
    let deadline = Instant::now() + Duration::from_secs(seconds as u64);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Plain::connect(port);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    c.call("get_job", r#"{"name":"job-00042"}"#);
                    n += 1;
                }
                n
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().expect("client")).sum();
    println!("plain HTTP, {server}: get_job, {clients} connections: {:.0} calls/s", total as f64 / seconds as f64);
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
