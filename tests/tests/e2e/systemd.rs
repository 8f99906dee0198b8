//! The worker under a service manager: the real binary with `NOTIFY_SOCKET` pointing at a
//! socket this test listens on, as systemd runs a `Type=notify` unit
//! (`deploy/systemd/lamplighter.service`). The messages are checked in order: ready, watchdog
//! pings, a reload (taken or rejected), stopping; and the pings stop while the scheduler cannot
//! complete a pass because its database hangs.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use lamplighter_tests::pg::Cluster;
use lamplighter_tests::proc::KillOnDrop;

use crate::support::Worker;

/// A job every second that shows what of systemd's variables its command sees.
const EVERY_SECOND: &str = "tick:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  cron: \"* * * * * *\"\n  \
                            parameters: {command: \"echo socket=[$NOTIFY_SOCKET] watchdog=[$WATCHDOG_USEC]\"}\n";

/// What systemd would receive: one datagram per notification.
struct Manager {
    socket: UnixDatagram,
    /// Every message so far, for failure reports.
    seen: Vec<String>,
}

impl Manager {
    /// Binds a socket at `path`, or at an abstract name when `path` starts with `@`.
    fn bind(path: &str) -> Manager {
        let socket = match path.strip_prefix('@') {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
                UnixDatagram::bind_addr(&addr).unwrap()
            }
            None => UnixDatagram::bind(path).unwrap(),
        };
        Manager { socket, seen: Vec::new() }
    }

    /// The next message within `within`, if one comes.
    fn next(&mut self, within: Duration) -> Option<String> {
        self.socket.set_read_timeout(Some(within.max(Duration::from_millis(1)))).unwrap();
        let mut buf = [0u8; 4096];
        let len = self.socket.recv(&mut buf).ok()?;
        let m = String::from_utf8_lossy(&buf[..len]).into_owned();
        self.seen.push(m.clone());
        Some(m)
    }

    /// Waits for a message that `pred` accepts, skipping others; panics after `within`.
    fn expect(&mut self, what: &str, within: Duration, pred: impl Fn(&str) -> bool, context: &dyn Fn() -> String) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(m) if pred(&m) => return m,
                Some(_) => {}
                None => panic!("no {what} within {within:?}; received {:?}\nlog:\n{}", self.seen, context()),
            }
        }
    }

    /// Waits for a message `until` accepts, asserting that none `pred` accepts comes before it
    /// (one sender's datagrams arrive in order): a negative check bounded by the worker's own
    /// progress, not by the test's clock.
    fn none_before(&mut self, what: &str, pred: impl Fn(&str) -> bool, until: impl Fn(&str) -> bool, context: &dyn Fn() -> String) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(m) = self.next(left) else {
                panic!("the marker after {what} never came; received {:?}\nlog:\n{}", self.seen, context())
            };
            assert!(!pred(&m), "{what}: {m:?} arrived; received {:?}\nlog:\n{}", self.seen, context());
            if until(&m) {
                return;
            }
        }
    }

    /// Asserts that no message `pred` accepts arrives for `during`.
    fn none_for(&mut self, what: &str, during: Duration, pred: impl Fn(&str) -> bool, context: &dyn Fn() -> String) {
        let deadline = Instant::now() + during;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            if let Some(m) = self.next(left) {
                assert!(!pred(&m), "{what}: {m:?} arrived; received {:?}\nlog:\n{}", self.seen, context());
            }
        }
    }
}

fn is(first_line: &'static str) -> impl Fn(&str) -> bool {
    move |m: &str| m.lines().next() == Some(first_line)
}

#[test]
fn the_worker_tells_systemd_it_is_ready_reloading_alive_and_stopping() {
    let mut w = Worker::new(EVERY_SECOND);
    let path = w.dir.path().join("notify.sock");
    let mut systemd = Manager::bind(path.to_str().unwrap());
    w.env.push(("NOTIFY_SOCKET".into(), path.display().to_string()));
    // Ping every 150 ms.
    w.env.push(("WATCHDOG_USEC".into(), "300000".into()));
    w.start();

    let ready = systemd.expect("READY=1", Duration::from_secs(5), is("READY=1"), &|| w.log());
    assert!(ready.contains(&format!("STATUS=serving 1 jobs on 127.0.0.1:{}", w.port)), "{ready:?}");
    // Ready comes first: systemd starts what follows the unit only then.
    assert_eq!(systemd.seen.first(), Some(&ready), "{:?}", systemd.seen);
    for _ in 0..3 {
        systemd.expect("a watchdog ping", Duration::from_secs(3), is("WATCHDOG=1"), &|| w.log());
    }
    // The variables are the worker's: the commands of its runs do not inherit them.
    let (code, out, err) = w.ctl(&["jobs", "trigger", "tick", "--wait", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("socket=[] watchdog=[]"), "a run's command saw systemd's variables: {out}");

    // SIGHUP: RELOADING=1 with the monotonic time systemd ≥ 253 requires, then READY=1.
    w.write_jobs(&format!(
        "{EVERY_SECOND}tock:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  every: 1s\n  parameters: {{command: \"echo tock\"}}\n"
    ));
    w.signal("HUP");
    let reloading = systemd.expect("RELOADING=1", Duration::from_secs(5), is("RELOADING=1"), &|| w.log());
    let usec: u64 = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC: {reloading:?}"));
    assert!(usec > 0);
    let ready = systemd.expect("READY=1 after the reload", Duration::from_secs(5), is("READY=1"), &|| w.log());
    assert!(ready.contains("STATUS=reloaded: serving 2 jobs"), "{ready:?}");

    // A config that does not load: the reload still ends with READY=1 (the old config runs),
    // and the status says it was rejected.
    std::fs::write(w.config_path(), "scheduling:\n  jobs:\n    bad:\n      cron: \"every day\"\n").unwrap();
    w.signal("HUP");
    systemd.expect("RELOADING=1", Duration::from_secs(5), is("RELOADING=1"), &|| w.log());
    let ready = systemd.expect("READY=1 after the rejected reload", Duration::from_secs(5), is("READY=1"), &|| w.log());
    assert!(ready.contains("reload rejected"), "{ready:?}");
    systemd.expect("a watchdog ping after the reloads", Duration::from_secs(3), is("WATCHDOG=1"), &|| w.log());

    // SIGTERM: STOPPING=1, then no more pings while it drains; a clean exit.
    w.signal("TERM");
    let stopping = systemd.expect("STOPPING=1", Duration::from_secs(5), is("STOPPING=1"), &|| w.log());
    assert!(stopping.contains("STATUS=draining"), "{stopping:?}");
    // Enough time for the drain (3 s here) and the records after it, whatever the unit says.
    assert!(stopping.contains("EXTEND_TIMEOUT_USEC=33000000"), "{stopping:?}");
    assert_eq!(w.wait_exit(Duration::from_secs(15)), Some(0));
    systemd.none_for("a ping after STOPPING=1", Duration::from_millis(100), is("WATCHDOG=1"), &|| w.log());
}

#[test]
fn an_abstract_notify_socket_is_reached_and_a_watchdog_meant_for_another_process_is_ignored() {
    let mut w = Worker::new(EVERY_SECOND);
    let name = format!("@lamplighter-test-{}-{}", std::process::id(), w.port);
    let mut systemd = Manager::bind(&name);
    w.env.push(("NOTIFY_SOCKET".into(), name.clone()));
    // `WATCHDOG_PID` names another process (a parent that did not clear it): no pings.
    w.env.push(("WATCHDOG_USEC".into(), "200000".into()));
    w.env.push(("WATCHDOG_PID".into(), "1".into()));
    w.start();
    systemd.expect("READY=1 on the abstract socket", Duration::from_secs(5), is("READY=1"), &|| w.log());
    // Three of its per-second ticks run (at 100 ms a ping, some thirty pings' worth), then a
    // reload: no ping comes before the reload's RELOADING=1.
    w.wait_for("three ticks", Duration::from_secs(10), |r| r.iter().filter(|r| r.status == "succeeded").count() >= 3);
    w.signal("HUP");
    systemd.none_before("a watchdog ping meant for another process", is("WATCHDOG=1"), is("RELOADING=1"), &|| w.log());
    w.signal("TERM");
    systemd.expect("STOPPING=1", Duration::from_secs(5), is("STOPPING=1"), &|| w.log());
    assert_eq!(w.wait_exit(Duration::from_secs(15)), Some(0));
}

#[test]
fn watchdog_pings_stop_while_the_database_hangs_and_resume_after() {
    let cluster = Cluster::start();
    let mut w = Worker::new("");
    let text = format!(
        "framework:\n  data_dir: {data}\nworker:\n  shutdown_grace: 3s\n  mcp:\n    port: {port}\n\
         scheduling:\n  storage:\n    provider: postgres\n    connection_string: \"{url}\"\n  jobs:\n    {job}",
        data = w.dir.path().join("data").display(),
        port = w.port,
        url = cluster.url(),
        job = EVERY_SECOND.replace('\n', "\n    "),
    );
    std::fs::write(w.config_path(), text).unwrap();
    let path = w.dir.path().join("notify.sock");
    let mut systemd = Manager::bind(path.to_str().unwrap());
    w.env.push(("NOTIFY_SOCKET".into(), path.display().to_string()));
    w.env.push(("WATCHDOG_USEC".into(), "400000".into()));
    w.start();
    systemd.expect("READY=1", Duration::from_secs(5), is("READY=1"), &|| w.log());
    systemd.expect("a watchdog ping", Duration::from_secs(3), is("WATCHDOG=1"), &|| w.log());

    cluster.freeze();
    // From the moment the worker says its scheduler is stuck (its own decision, not a wait on
    // the test's clock), silence: ten pings' worth while the database hangs.
    crate::support::poll(
        "the worker to see its scheduler stuck",
        Duration::from_secs(10),
        || w.log().contains("has not completed a pass").then_some(()),
        || w.log(),
    );
    systemd.none_for("pings before the stall was seen", Duration::from_millis(50), |_| false, &|| w.log());
    systemd.none_for("a watchdog ping while the database hangs", Duration::from_secs(2), is("WATCHDOG=1"), &|| w.log());
    cluster.thaw();
    systemd.expect("pings again once the database answers", Duration::from_secs(20), is("WATCHDOG=1"), &|| w.log());

    w.signal("TERM");
    systemd.expect("STOPPING=1", Duration::from_secs(5), is("STOPPING=1"), &|| w.log());
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));
}

/// `deploy/systemd/lamplighter.service` with its binary at `bin` (systemd-analyze checks that
/// the executable exists).
fn unit_with_binary(bin: &std::path::Path) -> String {
    let unit = std::fs::read_to_string(crate::support::repo_root().join("deploy/systemd/lamplighter.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/lamplighter "), "the unit's ExecStart moved:\n{unit}");
    unit.replace("/usr/local/bin/lamplighter", &bin.display().to_string())
}

/// The value of every `key=` line of the unit.
fn directives<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines().filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('='))).collect()
}

#[test]
fn the_systemd_unit_verifies_clean_and_is_hardened() {
    let unit = unit_with_binary(&crate::support::bin());
    for (key, value) in [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("Restart", "on-failure"),
        ("KillMode", "mixed"),
        ("StateDirectory", "lamplighter"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
    ] {
        assert_eq!(directives(&unit, key), [value], "{key}= in the unit");
    }
    assert_eq!(directives(&unit, "WatchdogSec").len(), 1, "WatchdogSec= in the unit");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lamplighter.service");
    std::fs::write(&path, &unit).unwrap();
    let analyze = |args: &[&str]| {
        let out =
            std::process::Command::new(crate::deploy::tool("systemd-analyze")).args(args).arg(&path).output().expect("systemd-analyze");
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    // `verify` exits 0 on unknown keys and bad values: any output at all is a finding.
    let (ok, out) = analyze(&["verify", "--man=no"]);
    assert!(ok && out.trim().is_empty(), "systemd-analyze verify:\n{out}");
    // The exposure score (0 = locked down, 10 = none) stays at or below 2.0.
    let (ok, out) = analyze(&["security", "--offline=yes", "--threshold=20", "--no-pager"]);
    assert!(ok, "systemd-analyze security rates the unit above 2.0:\n{out}");
}

/// The unit's `ExecStart` and `ExecReload`, as systemd would run them, on the example config
/// (`deploy/systemd/lamplighter.yaml`) with `STATE_DIRECTORY` set: ready, JSON logs, the data
/// where systemd put the state directory, a reload, a clean stop.
#[test]
fn the_units_command_line_serves_the_example_config() {
    let bin = crate::support::bin();
    let unit = unit_with_binary(&bin);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let port = crate::support::free_port();
    let example = std::fs::read_to_string(crate::support::repo_root().join("deploy/systemd/lamplighter.yaml")).unwrap();
    assert!(example.contains("port: 5100\n"), "the example config's port moved");
    let config = dir.path().join("lamplighter.yaml");
    std::fs::write(&config, example.replace("port: 5100\n", &format!("port: {port}\n"))).unwrap();

    let exec = directives(&unit, "ExecStart")[0].replace("/etc/lamplighter/lamplighter.yaml", &config.display().to_string());
    let mut words = exec.split_whitespace();
    let mut cmd = std::process::Command::new(words.next().unwrap());
    let log = dir.path().join("stderr.log");
    cmd.args(words)
        .current_dir(&state)
        .env("STATE_DIRECTORY", &state)
        .env("NOTIFY_SOCKET", dir.path().join("notify.sock"))
        .env("WATCHDOG_USEC", "2000000")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut systemd = Manager::bind(dir.path().join("notify.sock").to_str().unwrap());
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let ready = systemd.expect("READY=1", Duration::from_secs(20), is("READY=1"), &logs);
    assert!(ready.contains(&format!("serving 1 jobs on 127.0.0.1:{port}")), "{ready:?}\n{}", logs());
    assert!(state.join("lamplighter.db").exists(), "no database in the state directory:\n{}", logs());

    let reload = directives(&unit, "ExecReload")[0].replace("$MAINPID", &child.0.id().to_string());
    let mut words = reload.split_whitespace();
    assert!(std::process::Command::new(words.next().unwrap()).args(words).status().unwrap().success());
    systemd.expect("RELOADING=1", Duration::from_secs(5), is("RELOADING=1"), &logs);
    let ready = systemd.expect("READY=1 after the reload", Duration::from_secs(5), is("READY=1"), &logs);
    assert!(ready.contains("reloaded: serving 1 jobs"), "{ready:?}\n{}", logs());

    assert!(std::process::Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().unwrap().success());
    systemd.expect("STOPPING=1", Duration::from_secs(5), is("STOPPING=1"), &logs);
    assert_eq!(child.0.wait().unwrap().code(), Some(0), "{}", logs());
    // `--log-format json`: every line journald gets is one JSON object.
    let text = logs();
    assert!(text.lines().count() >= 3, "{text}");
    for line in text.lines() {
        assert!(serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.is_object()), "not a JSON log line: {line}");
    }
}
