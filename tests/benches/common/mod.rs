//! What both benchmarks need to drive the real binary: where it is, whether it is ready,
//! how much memory it holds.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

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
pub(crate) fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

/// CPU time (user + system) the process has used so far, in ms (clock ticks of 10 ms).
pub(crate) fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    (ticks(11) + ticks(12)) * 10
}
