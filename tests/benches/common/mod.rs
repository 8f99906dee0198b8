//! What the benchmarks need to drive the real binary: where it is, a worker to start and stop,
//! whether it is ready, how much memory and CPU it holds.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) use lamplighter_jobs::events::{EndsWrite, InternalEvent};

/// `$LAMPLIGHTER_BIN`, or the `lamplighter` built beside this benchmark.
pub(crate) fn bin() -> PathBuf {
    if let Ok(b) = std::env::var("LAMPLIGHTER_BIN") {
        return b.into();
    }
    let mut p = std::env::current_exe().expect("current exe");
    p.pop();
    if p.ends_with("deps") {
        p.pop();
    }
    let b = p.join("lamplighter");
    assert!(b.exists(), "{} not built: run `cargo build --release -p lamplighter-worker` first", b.display());
    b
}

/// `GET /readyz` answers 200.
pub(crate) fn ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(s, "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.1 200")
}

/// Resident memory of a process, in KiB.
/// Every row of `sql` in the worker's database (opened read-only, beside the running worker),
/// each read by `row`.
pub(crate) fn read_rows<T>(db: &std::path::Path, sql: &str, row: impl Fn(&sqlx::sqlite::SqliteRow) -> T) -> Vec<T> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(db).read_only(true);
        let mut conn = sqlx::ConnectOptions::connect(&opts).await.expect("open db");
        sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(&mut conn).await.expect("query").iter().map(row).collect()
    })
}

pub(crate) fn rss_kb(pid: u32) -> u64 {
    status_kb(pid, "VmRSS")
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `RssAnon`, `RssFile`), 0 when unreadable.
pub(crate) fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) the process has used so far, in ms (clock ticks of 10 ms).
pub(crate) fn cpu_ms(pid: u32) -> u64 {
    stat_cpu_ms(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
}

/// utime + stime (ms) of a `/proc/.../stat` line.
fn stat_cpu_ms(stat: &str) -> u64 {
    let f = stat_fields(stat);
    f.utime_ms + f.stime_ms
}

/// What the benches read of a `/proc/.../stat` line.
pub(crate) struct StatFields {
    pub(crate) ppid: u32,
    pub(crate) utime_ms: u64,
    pub(crate) stime_ms: u64,
    /// CPU of the children the process has waited for (user + system).
    pub(crate) children_ms: u64,
}

pub(crate) fn stat_fields(stat: &str) -> StatFields {
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // ppid is field 4 of the whole line, utime, stime, cutime and cstime 14–17: 2 and 12–15
    // after the name (counted from 1). Ticks of 10 ms.
    StatFields { ppid: ticks(1) as u32, utime_ms: ticks(11) * 10, stime_ms: ticks(12) * 10, children_ms: (ticks(13) + ticks(14)) * 10 }
}

/// CPU time (user + system, ms) of each thread of the process, summed by thread name (e.g.
/// `tokio-rt-worker`, `sqlx-sqlite-wor`, `OpenTelemetry.T`).
pub(crate) fn cpu_ms_by_thread(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut by = std::collections::BTreeMap::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        *by.entry(stat[open + 1..close].to_string()).or_insert(0) += stat_cpu_ms(&stat);
    }
    by
}

/// The real binary in a temp dir with a generated config: `jobs` is the YAML under
/// `scheduling.jobs`. Killed when dropped; `BENCH_LOG` sets its log filter and keeps its log
/// (copied to /tmp/bench-worker.log).
pub(crate) struct Worker {
    pub(crate) dir: tempfile::TempDir,
    child: Option<Child>,
    port: u16,
}

impl Worker {
    pub(crate) fn new(jobs: &str, concurrency: usize) -> Worker {
        Worker::with("", jobs, concurrency)
    }

    /// As [`Worker::new`], with `top` (e.g. a `workflows:` section) at the top level.
    pub(crate) fn with(top: &str, jobs: &str, concurrency: usize) -> Worker {
        Worker::configured(top, "", jobs, concurrency)
    }

    /// As [`Worker::new`], on the PostgreSQL database at `url`.
    pub(crate) fn on_postgres(url: &str, jobs: &str, concurrency: usize) -> Worker {
        Worker::on_postgres_with(url, "", jobs, concurrency)
    }

    /// As [`Worker::on_postgres`], with `scheduling` (e.g. `limits:`) beside the storage.
    pub(crate) fn on_postgres_with(url: &str, scheduling: &str, jobs: &str, concurrency: usize) -> Worker {
        let storage = format!("  storage:\n    provider: postgres\n    connection_string: \"{url}\"\n{scheduling}");
        Worker::configured("", &storage, jobs, concurrency)
    }

    /// As [`Worker::new`], with `scheduling` (e.g. `limits:`) beside the jobs.
    pub(crate) fn scheduled(scheduling: &str, jobs: &str, concurrency: usize) -> Worker {
        Worker::configured("", scheduling, jobs, concurrency)
    }

    fn configured(top: &str, storage: &str, jobs: &str, concurrency: usize) -> Worker {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        let config = format!(
            "framework:\n  data_dir: {data}\nworker:\n  concurrency: {concurrency}\n  mcp:\n    port: {port}\n{top}scheduling:\n{storage}  jobs:\n{jobs}",
            data = dir.path().join("data").display()
        );
        std::fs::write(dir.path().join("lamplighter.yaml"), config).expect("write config");
        Worker { dir, child: None, port }
    }

    /// Starts a worker that serves TLS: returns once it says it is ready.
    pub(crate) fn start_tls(&mut self) -> Duration {
        let started = Instant::now();
        let mut cmd = Command::new(bin());
        cmd.args(["run", "--config"])
            .arg(self.dir.path().join("lamplighter.yaml"))
            .current_dir(self.dir.path())
            .env("RUST_LOG", "warn,lamplighter_worker::run=info")
            .stdout(Stdio::null());
        let log = self.dir.path().join("worker.log");
        let child = lamplighter_tests::proc::spawn_until(&mut cmd, &log, lamplighter_tests::proc::READY_LINE, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("worker not ready: {e}"));
        self.child = Some(child);
        started.elapsed()
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Starts the worker; returns the time to `/readyz` 200.
    pub(crate) fn start(&mut self) -> Duration {
        self.start_with(&std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()), false)
    }

    /// As [`Worker::start`], with the worker writing its internal events (read them with
    /// [`Worker::internal_events`]), unless `BENCH_STAGES=0` (a binary older than
    /// `--internal-events`, measured against a newer one).
    pub(crate) fn start_recording(&mut self) -> Duration {
        self.start_with(&std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()), stages_recorded())
    }

    /// The internal events the worker wrote (see `lamplighter run --internal-events`); a line
    /// that does not read as one fails the bench. None with `BENCH_STAGES=0`.
    pub(crate) fn internal_events(&self) -> Vec<InternalEvent> {
        if !stages_recorded() {
            println!("(no internal events: BENCH_STAGES=0)");
            return Vec::new();
        }
        let path = self.dir.path().join("internal-events.jsonl");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not an internal event ({e}): {l}"))).collect()
    }

    fn start_with(&mut self, filter: &str, events: bool) -> Duration {
        let started = Instant::now();
        let mut cmd = Command::new(bin());
        cmd.args(["run", "--config"])
            .arg(self.dir.path().join("lamplighter.yaml"))
            .current_dir(self.dir.path())
            // BENCH_LOG=lamplighter_jobs=debug keeps more of the worker's log in worker.log; the
            // ready line is always kept, since it is what start waits for.
            .env("RUST_LOG", format!("{filter},lamplighter_worker::run=info"))
            .stdout(Stdio::null());
        if events {
            cmd.arg("--internal-events").arg(self.dir.path().join("internal-events.jsonl"));
        }
        let log = self.dir.path().join("worker.log");
        let child = lamplighter_tests::proc::spawn_until(&mut cmd, &log, lamplighter_tests::proc::READY_LINE, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("worker not ready: {e}"));
        self.child = Some(child);
        assert!(ready(self.port), "ready, but /readyz says otherwise:\n{}", self.log());
        started.elapsed()
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("worker.log")).unwrap_or_default()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGTERM; returns how long the process took to exit.
    pub(crate) fn stop(&mut self) -> Duration {
        let t = Instant::now();
        let _ = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        t.elapsed()
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Triggers `job` `runs` times, one after another, with `lampctl jobs trigger --wait`, and
    /// returns the runs' recorded durations (`finished_at − started_at`, ms), sorted.
    pub(crate) fn trigger_durations(&self, job: &str, runs: usize) -> Vec<i64> {
        let ctl = bin().with_file_name("lampctl");
        for _ in 0..runs {
            let out =
                Command::new(&ctl).args(["--url", &self.url(), "jobs", "trigger", job, "--wait", "-o", "json"]).output().expect("lampctl");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        let sql = format!("SELECT finished_at - started_at AS d FROM ll_runs WHERE job = '{job}' AND status = 'succeeded'");
        let mut d = read_rows(&self.db(), &sql, |r| sqlx::Row::get::<i64, _>(r, "d"));
        assert_eq!(d.len(), runs, "every run succeeded");
        d.sort_unstable();
        d
    }

    pub(crate) fn db(&self) -> PathBuf {
        self.dir.path().join("data/lamplighter.db")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::env::var_os("BENCH_LOG").is_some() {
            let _ = std::fs::copy(self.dir.path().join("worker.log"), "/tmp/bench-worker.log");
        }
    }
}

/// The `p` quantile (0–1) of sorted values, nearest rank.
pub(crate) fn pct<T: Copy>(sorted: &[T], p: f64) -> T {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// `n` jobs `job-00000`… on `cron`, each running `action` (`{i}`: the job's number).
pub(crate) fn jobs_yaml(n: usize, cron: &str, action: &str) -> String {
    let mut s = String::with_capacity(n * 160);
    for i in 0..n {
        s.push_str(&format!("    job-{i:05}:\n      cron: \"{cron}\"\n      type: plugin\n{}", action.replace("{i}", &i.to_string())));
    }
    s
}

/// `file-save` of a one-byte file per job.
pub(crate) const SAVE: &str = "      plugin: file-save\n      action: save\n      parameters: { path: \"out/{i}.txt\", content: \"x\" }\n";

/// The `p` quantile of sorted values, rank rounded up.
pub(crate) fn pct_up(sorted: &[i64], p: f64) -> i64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// Prints n, p50, p99 and max of `v`.
pub(crate) fn summary(label: &str, mut v: Vec<i64>) {
    v.sort_unstable();
    if v.is_empty() {
        println!("{label}: none");
        return;
    }
    println!("{label}: n {} p50 {} p99 {} max {}", v.len(), pct_up(&v, 0.5), pct_up(&v, 0.99), v[v.len() - 1]);
}

/// Per tick of a burst: the spread of its starts (last − first, ms) for ticks that started at
/// least `min_runs` runs, and the number of runs of every tick, in tick order. `runs` are
/// `(scheduled_at, started_at)`.
pub(crate) fn burst_spreads(runs: impl Iterator<Item = (Option<i64>, Option<i64>)>, min_runs: usize) -> (Vec<i64>, Vec<usize>) {
    let mut by_tick: std::collections::BTreeMap<i64, (i64, i64, usize)> = Default::default();
    for (tick, started) in runs {
        if let (Some(t), Some(s)) = (tick, started) {
            let e = by_tick.entry(t).or_insert((i64::MAX, i64::MIN, 0));
            e.0 = e.0.min(s);
            e.1 = e.1.max(s);
            e.2 += 1;
        }
    }
    let spreads = by_tick.values().filter(|v| v.2 >= min_runs).map(|v| v.1 - v.0).collect();
    (spreads, by_tick.values().map(|v| v.2).collect())
}

/// Whether the worker is asked for its internal events (`BENCH_STAGES=0`: not).
fn stages_recorded() -> bool {
    std::env::var("BENCH_STAGES").map_or(true, |v| v != "0")
}

/// The drain's writes, from the worker's internal events ([`Worker::internal_events`]): how
/// many, how many runs each, and how long each took (from the call to its return, waits for the
/// writer included), and where the time of a write of ends and claims went.
pub(crate) fn drain_stages(events: &[InternalEvent]) {
    let claims: Vec<(usize, u64)> = events
        .iter()
        .filter_map(|e| match e {
            InternalEvent::ClaimedFromQueue { runs, claim_us, .. } => Some((*runs, *claim_us)),
            _ => None,
        })
        .collect();
    let ends: Vec<(usize, usize, u64, Option<EndsWrite>)> = events
        .iter()
        .filter_map(|e| match e {
            InternalEvent::EndsRecorded { runs, claimed, finish_us, write, .. } => Some((*runs, *claimed, *finish_us, *write)),
            _ => None,
        })
        .collect();
    for (what, batches) in [("claims by the intake", claims.clone()), ("end writes", ends.iter().map(|e| (e.0, e.2)).collect::<Vec<_>>())] {
        let runs: usize = batches.iter().map(|b| b.0).sum();
        let mut us: Vec<u64> = batches.iter().map(|b| b.1).collect();
        us.sort_unstable();
        let p = |q: f64| us.get(((us.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
        println!(
            "{what}: {} of {:.1} runs on average; each took p50 {} / p99 {} µs",
            batches.len(),
            runs as f64 / batches.len().max(1) as f64,
            p(0.5),
            p(0.99)
        );
    }
    // The write of ends and claims: one statement (or script), or a transaction statement by
    // statement.
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let one: Vec<_> = ends
        .iter()
        .filter_map(|e| match e.3 {
            Some(EndsWrite::OneStatement { statement_us, writer_wait_us }) => Some((e.0, e.1, statement_us, writer_wait_us)),
            _ => None,
        })
        .collect();
    let tx: Vec<_> = ends
        .iter()
        .filter_map(|e| match e.3 {
            Some(EndsWrite::Transaction { begin_us, ends_us, claim_us, commit_us }) => {
                Some((e.0, e.1, begin_us, ends_us, claim_us, commit_us))
            }
            _ => None,
        })
        .collect();
    if !one.is_empty() {
        println!(
            "a write of ends and claims, one statement: {:.1} ends and {:.1} claims, mean {:.0} µs",
            mean(one.iter().map(|w| w.0 as f64).collect()),
            mean(one.iter().map(|w| w.1 as f64).collect()),
            mean(one.iter().map(|w| w.2 as f64).collect())
        );
        // SQLite's script: how much of it was the wait for the writing connection.
        let waits: Vec<f64> = one.iter().filter_map(|w| w.3).map(|w| w as f64).collect();
        if !waits.is_empty() {
            println!("  of which the wait for the writer, mean {:.0} µs", mean(waits));
        }
    }
    if !tx.is_empty() {
        println!(
            "a transaction of ends and claims, mean µs: begin {:.0}, {:.1} ends {:.0}, lease, take and {:.1} claims {:.0}, commit {:.0}",
            mean(tx.iter().map(|w| w.2 as f64).collect()),
            mean(tx.iter().map(|w| w.0 as f64).collect()),
            mean(tx.iter().map(|w| w.3 as f64).collect()),
            mean(tx.iter().map(|w| w.1 as f64).collect()),
            mean(tx.iter().map(|w| w.4 as f64).collect()),
            mean(tx.iter().map(|w| w.5 as f64).collect())
        );
    }
    let claimed: usize = ends.iter().map(|e| e.1).sum();
    println!("runs claimed in the end writes: {claimed} ({:.1} a write)", claimed as f64 / ends.len().max(1) as f64);
}

/// Milliseconds since the Unix epoch, on the wall clock: the clock of the worker a bench runs.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64
}

/// Waits until the wall clock reads `ms`: a worker's ticks come on it, in real time (a bench
/// drives the release binary, whose clock it cannot move).
pub(crate) fn sleep_until(ms: i64) {
    let d = ms - now_ms();
    if d > 0 {
        std::thread::sleep(Duration::from_millis(d as u64));
    }
}
