//! A throwaway PostgreSQL cluster for tests: `initdb` in a temporary directory, started with
//! `pg_ctl` on a free loopback port (its socket in the same directory, `fsync` off), stopped and
//! removed when dropped. The server binaries come from `PATH` or Debian's
//! `/usr/lib/postgresql/<version>/bin`, installed on first use where missing ([`crate::setup`]). They refuse to
//! run as root: as root the cluster belongs to an unprivileged system user, `llpg`, created on
//! first use.
//!
//! A missing server is a failure, never a skip: the tests that need PostgreSQL must run.

// Starting the server's own programs is this module's job.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The unprivileged owner of test clusters when tests run as root.
const USER: &str = "llpg";

/// A running cluster; stopped (immediately) and deleted when dropped.
#[derive(Debug)]
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_user: Option<&'static str>,
}

impl Cluster {
    /// Initialises and starts a cluster, installing PostgreSQL first where it is missing. Panics
    /// with what to do when it cannot be installed or does not start.
    pub fn start() -> Cluster {
        crate::setup::debian_packages(&["postgresql"], "a throwaway PostgreSQL cluster (initdb, pg_ctl)", || server_bin().is_some());
        let bin = server_bin().expect("installed above");
        let as_user = crate::setup::is_root().then(|| {
            ensure_user();
            USER
        });
        let dir = tempfile::Builder::new().prefix("llpg-").tempdir().expect("temp dir");
        if as_user.is_some() {
            run(Command::new("chown").args(["-R", USER]).arg(dir.path()), "chown the cluster directory");
        }
        let mut c = Cluster { dir, bin, port: free_port(), as_user };
        c.pg("initdb", &["-D", &c.data().display().to_string(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]);
        // The free port may be taken again before the server binds it (by a client socket, or
        // another test's cluster): then another port, a few times.
        for _ in 0..5 {
            match c.try_start_server() {
                Ok(()) => return c,
                Err(log) if log.contains("could not bind") || log.contains("could not create any TCP/IP sockets") => c.port = free_port(),
                Err(log) => panic!("the PostgreSQL server did not start:\n{log}"),
            }
        }
        panic!("the PostgreSQL server found no free port in 5 tries:\n{}", c.server_log());
    }

    fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_of("postgres")
    }

    /// The URL of database `db` on this cluster.
    pub fn url_of(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server (fast shutdown) without deleting anything; [`Cluster::restart`] brings it back.
    pub fn stop(&self) {
        self.pg("pg_ctl", &["-D", &self.data().display().to_string(), "-m", "fast", "-w", "stop"]);
    }

    /// Starts the server again on the same port and data.
    pub fn restart(&self) {
        self.start_server();
    }

    /// When the server last became ready for connections, by its own log, in ms since the epoch.
    /// [`Cluster::restart`] returns later than that on a busy machine (`pg_ctl` polls, and the
    /// test's thread waits for a core): a bound on what the workers could reach.
    pub fn ready_at_ms(&self) -> i64 {
        self.logged_at_ms("database system is ready to accept connections")
    }

    /// When the server last received a request to stop, by its own log, in ms since the epoch:
    /// from then on it commits nothing. [`Cluster::stop`] is called earlier than that (`pg_ctl`
    /// has to start and signal it, which a busy machine delays) and returns later (the shutdown
    /// checkpoint).
    pub fn stop_asked_at_ms(&self) -> i64 {
        self.logged_at_ms("received fast shutdown request")
    }

    /// The time stamp of the last line of the server's log that holds `marker`.
    fn logged_at_ms(&self, marker: &str) -> i64 {
        let log = self.server_log();
        let line = log.lines().rfind(|l| l.contains(marker)).unwrap_or_else(|| panic!("the server's log says \"{marker}\":\n{log}"));
        // `log_line_prefix`'s default `%m [%p] `: `2026-12-05 14:30:01.123 UTC [42] LOG: …`.
        let stamp = line.get(..23).unwrap_or_else(|| panic!("a time stamp opens the line: {line}"));
        let at = chrono::NaiveDateTime::parse_from_str(stamp, "%Y-%m-%d %H:%M:%S%.3f")
            .unwrap_or_else(|e| panic!("a time stamp opens the line ({e}): {line}"));
        at.and_utc().timestamp_millis()
    }

    /// Freezes the server and every backend (SIGSTOP): connections stay open and queries
    /// hang, as on a database host that stopped answering. [`Cluster::thaw`] resumes them.
    pub fn freeze(&self) {
        self.signal_all("STOP");
    }

    /// Resumes a frozen server.
    pub fn thaw(&self) {
        self.signal_all("CONT");
    }

    /// Sends `sig` to the postmaster (first line of `postmaster.pid`), then to its children: a
    /// stopped postmaster forks no backend between the listing and the signal.
    fn signal_all(&self, sig: &str) {
        let postmaster = self.postmaster_pid().to_string();
        run(Command::new("kill").arg(format!("-{sig}")).arg(&postmaster), &format!("kill -{sig} the postmaster"));
        let children = run(Command::new("ps").args(["-o", "pid=", "--ppid", &postmaster]), "list the server's processes");
        let pids: Vec<String> = String::from_utf8_lossy(&children.stdout).split_whitespace().map(str::to_owned).collect();
        // A backend may end between the listing and the signal (its client went away while it
        // was frozen, and the postmaster resumed first): only the postmaster must get it.
        let _ = Command::new("kill").arg(format!("-{sig}")).args(&pids).output();
    }

    /// The postmaster's pid: the first line of `postmaster.pid`.
    pub fn postmaster_pid(&self) -> u32 {
        let pidfile = std::fs::read_to_string(self.data().join("postmaster.pid")).expect("postmaster.pid");
        pidfile.lines().next().and_then(|l| l.trim().parse().ok()).expect("a pid on postmaster.pid's first line")
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn start_server(&self) {
        if let Err(log) = self.try_start_server() {
            panic!("the PostgreSQL server did not start again on port {}:\n{log}", self.port);
        }
    }

    /// Starts the server on `self.port`; the server's log when it does not start.
    fn try_start_server(&self) -> Result<(), String> {
        // `PG_EXTRA_OPTS`: more server settings, for a bench looking into the server (e.g.
        // `-c shared_preload_libraries=pg_stat_statements`).
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c log_timezone=UTC -c fsync=off -c synchronous_commit=off -c full_page_writes=off {}",
            self.port,
            self.dir.path().display(),
            std::env::var("PG_EXTRA_OPTS").unwrap_or_default()
        );
        let log = self.dir.path().join("server.log");
        let _ = std::fs::remove_file(&log);
        let data = self.data().display().to_string();
        let log_arg = log.display().to_string();
        let args = ["-D", data.as_str(), "-o", opts.as_str(), "-l", log_arg.as_str(), "-w", "-t", "60", "start"];
        let out = self.command("pg_ctl").args(args).current_dir(self.dir.path()).output().map_err(|e| format!("pg_ctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{}{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr), self.server_log()))
        }
    }

    /// One of the server's programs, to run as the cluster's owner.
    fn command(&self, program: &str) -> Command {
        let exe = self.bin.join(program);
        match self.as_user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        }
    }

    /// Runs one of the server's programs, as the cluster's owner.
    fn pg(&self, program: &str, args: &[&str]) -> Output {
        let mut cmd = self.command(program);
        cmd.args(args).current_dir(self.dir.path());
        run(&mut cmd, &format!("{program} {}", args.join(" ")))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A test that failed while the server was frozen: a stopped server ignores the stop.
        if let Ok(pidfile) = std::fs::read_to_string(self.data().join("postmaster.pid")) {
            let postmaster = pidfile.lines().next().unwrap_or_default().trim().to_owned();
            let _ = Command::new("pkill").args(["-CONT", "-P", &postmaster]).output();
            let _ = Command::new("kill").args(["-CONT", &postmaster]).output();
        }
        let data = self.data().display().to_string();
        let _ = self.command("pg_ctl").args(["-D", &data, "-m", "immediate", "-w", "stop"]).output();
    }
}

fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The directory holding `initdb` and `pg_ctl`.
fn server_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file());
    on_path.or_else(|| {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("initdb").is_file())
            .collect();
        versions.sort();
        versions.pop()
    })
}

fn ensure_user() {
    let exists = Command::new("id").arg(USER).output().map(|o| o.status.success()).unwrap_or(false);
    if !exists {
        // Two tests may race to create it: the loser finds it there.
        let _ = Command::new("useradd").args(["-r", "-M", "-s", "/usr/sbin/nologin", USER]).output();
        let exists = Command::new("id").arg(USER).output().map(|o| o.status.success()).unwrap_or(false);
        assert!(exists, "cannot create the system user {USER} that owns test clusters (useradd -r -M {USER})");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// Where a cluster keeps its files (for tests that check it is gone).
pub fn path_of(c: &Cluster) -> &Path {
    c.dir.path()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cluster_accepts_connections_survives_a_restart_and_is_removed_when_dropped() {
        let c = Cluster::start();
        let query = |url: String| async move {
            let pool = sqlx::PgPool::connect(&url).await.expect("connect");
            let v: i32 = sqlx::query_scalar("SELECT 41 + 1").fetch_one(&pool).await.expect("query");
            pool.close().await;
            v
        };
        assert_eq!(query(c.url()).await, 42);
        c.stop();
        assert!(sqlx::PgPool::connect(&c.url()).await.is_err(), "stopped means refused");
        c.restart();
        assert_eq!(query(c.url()).await, 42, "back on the same port");
        let dir = path_of(&c).to_path_buf();
        drop(c);
        assert!(!dir.exists(), "its files are gone");
    }
}
