//! Test support: build paths, start and stop the worker, read its database.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lamplighter_tests::proc::{READY_LINE, spawn_until};

pub(crate) fn ctl_bin() -> PathBuf {
    bin().with_file_name("lampctl")
}

/// Runs `lampctl --url URL [--token T] ARGS…` with a clean environment.
pub(crate) fn ctl_at(url: &str, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(ctl_bin());
    cmd.arg("--url").arg(url).env_remove("LAMPLIGHTER_URL").env_remove("LAMPLIGHTER_TOKEN");
    if let Some(t) = token {
        cmd.arg("--token").arg(t);
    }
    let out = cmd.args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// A raw HTTP POST of a JSON-RPC body to `/mcp` with the given extra headers: (status, body).
/// A body over 1 MiB is announced with `Expect: 100-continue` and sent only if the worker asks
/// for it (RFC 9110 §10.1.1): a worker refusing the size answers at once and closes, and writing
/// the body into a closed connection would lose that answer.
pub(crate) fn mcp_post(port: u16, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let (status, _, body) = mcp_exchange(port, headers, body);
    (status, body)
}

/// As [`mcp_post`], with the answer's head (status line and headers, lower-cased).
pub(crate) fn mcp_exchange(port: u16, headers: &[(&str, &str)], body: &str) -> (u16, String, String) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let expect = body.len() > 1024 * 1024;
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if expect {
        req.push_str("Expect: 100-continue\r\n");
    }
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let status = |text: &str| text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    if expect {
        // The interim `100 Continue`, or the final answer.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        if status(&head) != 100 {
            let mut rest = String::new();
            let _ = s.read_to_string(&mut rest);
            return (status(&head), head.to_ascii_lowercase(), rest);
        }
    }
    s.write_all(body.as_bytes()).unwrap();
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    let (head, rest) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    (status(head), head.to_ascii_lowercase(), rest.to_string())
}

/// The worker binary, built once per test process with the profile these tests were built
/// with: `cargo test --workspace` alone works, and no test runs a binary older than the
/// sources (the build is a no-op when they are fresh).
pub(crate) fn bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            // Integration tests of this package sit in target/<profile>/deps.
            let mut dir = std::env::current_exe().unwrap();
            dir.pop();
            if dir.ends_with("deps") {
                dir.pop();
            }
            let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug").to_owned();
            let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            // The whole workspace's binaries, as `cargo build --workspace` builds them (its
            // feature set, which differs from the tests' own: dev-dependencies add features).
            cargo.current_dir(repo_root()).args(["build", "--quiet", "--workspace", "--bins"]);
            if let Some(target) = dir.parent() {
                cargo.arg("--target-dir").arg(target);
            }
            match profile.as_str() {
                "debug" => {}
                "release" => {
                    cargo.arg("--release");
                }
                other => {
                    cargo.args(["--profile", other]);
                }
            }
            let out = cargo.output().unwrap_or_else(|e| panic!("cannot run cargo to build the binaries under test: {e}"));
            assert!(out.status.success(), "building lamplighter and lampctl failed:\n{}", String::from_utf8_lossy(&out.stderr));
            let b = dir.join("lamplighter");
            assert!(b.exists() && dir.join("lampctl").exists(), "cargo built, but {} is not there", b.display());
            b
        })
        .clone()
}

/// Polls `check` until it gives a value (another process's state, seen from outside: there
/// is no event to wait on); after `within` panics with `what` and `context()`.
pub(crate) fn poll<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>, context: impl Fn() -> String) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}; {}", context());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// libfaketime (Debian's `faketime`, installed on first use): a worker started with it in
/// `LD_PRELOAD` reads a wall clock the test sets.
pub(crate) fn libfaketime() -> &'static str {
    const LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
    lamplighter_tests::setup::debian_packages(&["faketime"], "the clock tests", || Path::new(LIB).exists());
    LIB
}

/// The internal events of `text`, as `lamplighter run --internal-events` writes them; a line
/// that does not read as one fails the test.
pub(crate) fn internal_events(text: &str) -> Vec<lamplighter_jobs::events::InternalEvent> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not an internal event ({e}): {l}"))).collect()
}

/// The wall clock, in Unix milliseconds (as runs record instants).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A worker under test with its own data directory and config.
pub(crate) struct Worker {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
    /// Extra environment for the worker process.
    pub env: Vec<(String, String)>,
    /// Extra arguments of `lamplighter run`.
    pub args: Vec<String>,
}

impl Worker {
    /// Writes `jobs_yaml` (the body of `scheduling.jobs`) into a config.
    pub(crate) fn new(jobs_yaml: &str) -> Self {
        // The binaries first (built once per process): a test that reads the clock after
        // this does not count the build against its deadlines.
        bin();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let w = Worker { log: dir.path().join("worker.log"), dir, port, child: None, env: Vec::new(), args: Vec::new() };
        w.write_jobs(jobs_yaml);
        w
    }

    pub(crate) fn config_path(&self) -> PathBuf {
        self.dir.path().join("lamplighter.yaml")
    }

    pub(crate) fn write_jobs(&self, jobs_yaml: &str) {
        self.write_config(jobs_yaml, "");
    }

    /// `mcp_extra` goes under `worker.mcp` (e.g. `auth: { type: bearer, token: t }`).
    pub(crate) fn write_config(&self, jobs_yaml: &str, mcp_extra: &str) {
        self.write_full("", jobs_yaml, mcp_extra);
    }

    /// As [`Worker::write_config`], with `top_yaml` (e.g. a `workflows:` section) at the top level.
    pub(crate) fn write_full(&self, top_yaml: &str, jobs_yaml: &str, mcp_extra: &str) {
        self.write_scheduling(top_yaml, "", jobs_yaml, mcp_extra);
    }

    /// As [`Worker::write_full`], with `scheduling_yaml` (e.g. `limits: {warehouse: 1}`) beside
    /// the jobs under `scheduling`.
    pub(crate) fn write_scheduling(&self, top_yaml: &str, scheduling_yaml: &str, jobs_yaml: &str, mcp_extra: &str) {
        let indent = |text: &str, by: &str| -> String { text.lines().map(|l| format!("{by}{l}\n")).collect() };
        let text = format!(
            "framework:\n  data_dir: {}\nworker:\n  shutdown_grace: 3s\n  mcp:\n    port: {}\n{}{top_yaml}scheduling:\n{}  jobs:\n{}",
            self.dir.path().join("data").display(),
            self.port,
            indent(mcp_extra, "    "),
            indent(scheduling_yaml, "  "),
            indent(jobs_yaml, "    ")
        );
        std::fs::write(self.config_path(), text).unwrap();
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Runs `lampctl` against this worker: (exit code, stdout, stderr).
    pub(crate) fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        ctl_at(&self.url(), None, args)
    }

    /// `lampctl ARGS -o json` against this worker, which must succeed: its answer.
    pub(crate) fn ctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        let (code, out, err) = self.ctl(&args);
        assert_eq!(code, 0, "lampctl {args:?}: {out}{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("lampctl {args:?} printed no JSON ({e}): {out}"))
    }

    /// Starts a worker that serves TLS and returns once it says it is ready (its `/readyz` is
    /// on the TLS listener; the test reads it with its CA).
    pub(crate) fn start_tls(&mut self) {
        let mut cmd = Command::new(bin());
        cmd.args(["run", "--config"]).arg(self.config_path()).current_dir(self.dir.path()).env("RUST_LOG", "info").stdout(Stdio::null());
        let child =
            spawn_until(&mut cmd, &self.log, READY_LINE, Duration::from_secs(20)).unwrap_or_else(|e| panic!("worker not ready: {e}"));
        self.child = Some(child);
    }

    /// Starts the worker and returns once its log has a line containing `marker`.
    pub(crate) fn start_until(&mut self, marker: &str) {
        let mut cmd = Command::new(bin());
        cmd.args(["run", "--config"]).arg(self.config_path()).current_dir(self.dir.path()).env("RUST_LOG", "info").stdout(Stdio::null());
        cmd.envs(self.env.iter().map(|(k, v)| (k, v))).args(&self.args);
        let child = spawn_until(&mut cmd, &self.log, marker, Duration::from_secs(20)).unwrap_or_else(|e| panic!("worker not ready: {e}"));
        self.child = Some(child);
    }

    /// Starts the worker and returns once it says it is ready (and `/readyz` agrees).
    pub(crate) fn start(&mut self) {
        self.start_until(READY_LINE);
        assert_eq!(http_get(self.port, "/readyz").map(|(code, _)| code), Some(200), "ready, but /readyz says otherwise:\n{}", self.log());
    }

    /// Started and not seen to exit.
    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([&format!("-{sig}"), &self.pid().to_string()]).status().unwrap().success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits for the process to exit and returns its exit code.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                self.child = None;
                return s.code();
            }
            if Instant::now() > deadline {
                panic!("worker did not exit within {within:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub(crate) fn db(&self) -> PathBuf {
        self.dir.path().join("data/lamplighter.db")
    }

    /// Rows of `SELECT job, trigger, status, scheduled_at, error, started_at - due_at FROM ll_runs`.
    /// A failed read fails the test: "no runs" must never stand for "could not look".
    pub(crate) fn runs(&self) -> Vec<RunRow> {
        query_runs(&self.db()).unwrap_or_else(|e| panic!("{e}\nlog:\n{}", self.log()))
    }

    /// Polls the database until `pred` holds (the worker's clock is real; this only waits).
    /// Until the worker has created its database there is nothing to read, and the wait goes
    /// on; any other failed read fails the test.
    pub(crate) fn wait_for(&self, what: &str, within: Duration, pred: impl Fn(&[RunRow]) -> bool) -> Vec<RunRow> {
        let read = || match query_runs(&self.db()) {
            Err(ReadError::NoDatabase(_)) => None,
            other => Some(other.unwrap_or_else(|e| panic!("{e}\nlog:\n{}", self.log()))),
        };
        poll(what, within, || read().filter(|r| pred(r)), || format!("runs: {:#?}\nlog:\n{}", read(), self.log()))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct RunRow {
    pub id: String,
    pub job: String,
    pub trigger: String,
    pub status: String,
    pub scheduled_at: Option<i64>,
    pub error: Option<String>,
    pub lateness_ms: Option<i64>,
    pub retry_of: Option<String>,
}

/// Why the runs could not be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The worker has not created its database (yet).
    NoDatabase(PathBuf),
    Failed(PathBuf, String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoDatabase(p) => write!(f, "cannot read the runs: there is no database at {}", p.display()),
            Self::Failed(p, e) => write!(f, "cannot read the runs in {}: {e}", p.display()),
        }
    }
}

/// `read` on a read-only connection to the worker's SQLite database.
fn read_db<T>(db: &Path, read: impl AsyncFnOnce(&mut sqlx::SqliteConnection) -> Result<T, sqlx::Error>) -> Result<T, ReadError> {
    if !db.exists() {
        return Err(ReadError::NoDatabase(db.to_path_buf()));
    }
    let failed = |e: sqlx::Error| ReadError::Failed(db.to_path_buf(), e.to_string());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(db).read_only(true).busy_timeout(Duration::from_secs(5));
        let mut conn = sqlx::ConnectOptions::connect(&opts).await.map_err(failed)?;
        read(&mut conn).await.map_err(failed)
    })
}

/// Every run in the worker's SQLite database, oldest first.
pub(crate) fn query_runs(db: &Path) -> Result<Vec<RunRow>, ReadError> {
    read_db(db, async |conn| {
        use sqlx::Row;
        let sql = "SELECT id, job, trigger, status, scheduled_at, error, started_at - due_at AS late, retry_of FROM ll_runs ORDER BY id";
        let rows = sqlx::query(sql).fetch_all(conn).await?;
        rows.iter()
            .map(|r| {
                Ok(RunRow {
                    id: r.try_get("id")?,
                    job: r.try_get("job")?,
                    trigger: r.try_get("trigger")?,
                    status: r.try_get("status")?,
                    scheduled_at: r.try_get("scheduled_at")?,
                    error: r.try_get("error")?,
                    lateness_ms: r.try_get("late")?,
                    retry_of: r.try_get("retry_of")?,
                })
            })
            .collect()
    })
}

/// The first column of `sql` on the worker's SQLite database, as text, a row a line.
pub(crate) fn sql_lines(db: &Path, sql: &str) -> Result<String, ReadError> {
    read_db(db, async |conn| {
        use sqlx::Row;
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).fetch_all(conn).await?;
        rows.iter().map(|r| r.try_get::<String, _>(0)).collect::<Result<Vec<_>, _>>().map(|v| v.join("\n"))
    })
}

/// A minimal HTTP/1.1 GET, enough for the health endpoints.
pub(crate) fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).ok()?;
    // Longer than the worker's own bound on a storage check (2 s): a `/readyz` asked while the
    // database does not answer still gets its answer, with the reasons.
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..split]).to_ascii_lowercase();
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = &buf[split + 4..];
    let body = if head.lines().any(|l| l.replace(' ', "") == "transfer-encoding:chunked") { dechunk(body)? } else { body.to_vec() };
    Some((code, String::from_utf8_lossy(&body).into_owned()))
}

/// An HTTP/1.1 chunked body, whole; none if it is cut short.
fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).ok()?.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// Runs the binary to completion: (exit code, stdout, stderr).
pub(crate) fn run_cli(args: &[&str], cwd: &Path) -> (i32, String, String) {
    let out = Command::new(bin()).args(args).current_dir(cwd).env_remove("LAMPLIGHTER_CONFIG").output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}
