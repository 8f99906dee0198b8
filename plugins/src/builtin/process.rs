//! The one place the worker starts processes: commands ([`run`]) and long-lived servers spoken
//! to over their stdin and stdout ([`start_server`], an agent's MCP servers). Each child runs in
//! its own process group so that a timeout, a cancellation, or the end of the call (or of the
//! server's use) kills everything it started, not just the direct child; a command's output is
//! captured with a cap so a chatty command cannot exhaust memory.
#![allow(clippy::disallowed_methods, reason = "the one module that starts processes")]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio_util::sync::CancellationToken;

use crate::{OutputSink, OutputStream};

/// Most bytes kept of each of stdout and stderr.
pub(crate) const OUTPUT_CAP: usize = 1024 * 1024;

/// How long to wait for the output pipes to close once the group is dead.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub(crate) struct Output {
    /// `None` when the process was killed by a signal.
    pub(crate) exit_code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    /// True when either stream was longer than [`OUTPUT_CAP`].
    pub(crate) truncated: bool,
}

#[derive(Debug)]
pub(crate) enum RunError {
    Spawn(std::io::Error),
    Wait(std::io::Error),
    Timeout,
    Cancelled,
}

/// Runs `program` with `args` in `cwd`, no stdin, until it exits, `timeout` passes or `cancel`
/// fires. On every path the child's process group is killed before returning.
pub(crate) async fn run(
    program: &str,
    args: &[&str],
    cwd: &Path,
    env: &[(&str, &str)],
    timeout: Duration,
    cancel: &CancellationToken,
    lines: Option<&OutputSink>,
) -> Result<Output, RunError> {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for var in crate::WORKER_ONLY_ENV {
        command.env_remove(var);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().map_err(RunError::Spawn)?;
    // Kills the group however this call ends, a dropped future included (the run was stopped
    // from outside: a fence, a drain, a timeout on the engine's clock).
    let group = child.id().map(GroupKill);
    let tee = |stream| lines.map(|sink| Lines { sink: sink.clone(), stream, partial: Vec::new() });
    let stdout = child.stdout.take().map(|s| tokio::spawn(read_capped(s, tee(OutputStream::Stdout))));
    let stderr = child.stderr.take().map(|s| tokio::spawn(read_capped(s, tee(OutputStream::Stderr))));

    let outcome = tokio::select! {
        status = child.wait() => status.map_err(RunError::Wait),
        () = tokio::time::sleep(timeout) => Err(RunError::Timeout),
        () = cancel.cancelled() => Err(RunError::Cancelled),
    };
    // Kill the group on every path: after a timeout or cancel to stop the work, after a normal
    // exit to stop background processes the command left behind, so no action outlives its call.
    drop(group);
    if outcome.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    let status = outcome?;

    let (stdout, stdout_truncated) = collect(stdout).await;
    let (stderr, stderr_truncated) = collect(stderr).await;
    Ok(Output { exit_code: status.code(), stdout, stderr, truncated: stdout_truncated || stderr_truncated })
}

/// A server started by [`start_server`]: its pipes, and the process itself, which is killed with
/// everything it started when this is dropped.
pub struct ServerProcess {
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    _group: Option<GroupKill>,
    _child: Child,
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProcess").field("pid", &self._child.id()).finish_non_exhaustive()
    }
}

/// Starts `program` with `args` and `env` added to the worker's environment (less what is the
/// worker's alone), its stdin, stdout and stderr piped to the caller, in a process group of its
/// own.
pub fn start_server<'a>(
    program: &str,
    args: &[String],
    env: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> std::io::Result<ServerProcess> {
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).kill_on_drop(true);
    for var in crate::WORKER_ONLY_ENV {
        command.env_remove(var);
    }
    command.envs(env);
    let mut child = command.spawn()?;
    Ok(ServerProcess {
        stdin: child.stdin.take(),
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
        _group: child.id().map(GroupKill),
        _child: child,
    })
}

/// A process group, sent SIGKILL (through `kill(1)`, since the crate forbids `unsafe`) when
/// dropped.
struct GroupKill(u32);

impl Drop for GroupKill {
    // `kill` must run to the end inside `drop`.
    fn drop(&mut self) {
        let pgid = self.0;
        let kill = move || {
            let result = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if let Err(e) = result {
                tracing::warn!(pgid, error = %e, "could not run \"kill\" to stop a process group");
            }
        };
        // Off the async threads: a fence stops many runs at once. Inline if no thread starts.
        if let Err(e) = std::thread::Builder::new().name("kill-group".into()).spawn(kill) {
            tracing::warn!(pgid, error = %e, "cannot start a thread to stop a process group; stopping it here");
            let result = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).status();
            if let Err(e) = result {
                tracing::warn!(pgid, error = %e, "could not run \"kill\" to stop a process group");
            }
        }
    }
}

async fn collect(task: Option<tokio::task::JoinHandle<(Vec<u8>, bool)>>) -> (String, bool) {
    let Some(mut task) = task else {
        return (String::new(), false);
    };
    match tokio::time::timeout(DRAIN_GRACE, &mut task).await {
        Ok(Ok((bytes, truncated))) => (String::from_utf8_lossy(&bytes).into_owned(), truncated),
        Ok(Err(_)) => (String::new(), true),
        // A process outside the group (e.g. one that called setsid) still holds the pipe.
        Err(_) => {
            task.abort();
            (String::new(), true)
        }
    }
}

/// Reads to the end, keeping the first [`OUTPUT_CAP`] bytes and discarding the rest so the
/// child never blocks on a full pipe; every line also goes to `lines` as it comes.
async fn read_capped(mut stream: impl AsyncRead + Unpin, mut lines: Option<Lines>) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(lines) = &mut lines {
                    lines.feed(&buf[..n]);
                }
                let room = OUTPUT_CAP.saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    if let Some(lines) = &mut lines {
        lines.end();
    }
    (kept, truncated)
}

/// The longest line handed on whole; a longer one is handed on in pieces of this size.
const LINE_MAX: usize = 16 * 1024;

/// Cuts a stream into lines for an [`OutputSink`].
struct Lines {
    sink: OutputSink,
    stream: OutputStream,
    partial: Vec<u8>,
}

impl Lines {
    fn feed(&mut self, mut chunk: &[u8]) {
        while let Some(at) = chunk.iter().position(|b| *b == b'\n') {
            self.partial.extend_from_slice(&chunk[..at]);
            self.emit();
            chunk = &chunk[at + 1..];
        }
        self.partial.extend_from_slice(chunk);
        while self.partial.len() >= LINE_MAX {
            let rest = self.partial.split_off(LINE_MAX);
            self.emit();
            self.partial = rest;
        }
    }

    fn emit(&mut self) {
        let line = String::from_utf8_lossy(&self.partial);
        (self.sink)(self.stream, line.strip_suffix('\r').unwrap_or(&line));
        self.partial.clear();
    }

    /// The last line, if it had no line break.
    fn end(&mut self) {
        if !self.partial.is_empty() {
            self.emit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn output_is_cut_into_lines_as_it_comes() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = got.clone();
        let sink: OutputSink = Arc::new(move |s, l: &str| seen.lock().unwrap().push((s, l.to_owned())));
        let mut lines = Lines { sink, stream: OutputStream::Stderr, partial: Vec::new() };
        lines.feed(b"one\r\ntw");
        assert_eq!(got.lock().unwrap().len(), 1, "a line is handed on when its break comes");
        lines.feed(b"o\n\nthree");
        lines.end();
        let texts: Vec<String> = got.lock().unwrap().iter().map(|(_, l)| l.clone()).collect();
        assert_eq!(texts, ["one", "two", "", "three"]);
        lines.feed(&vec![b'x'; LINE_MAX * 2 + 5]);
        lines.end();
        let sizes: Vec<usize> = got.lock().unwrap().iter().skip(4).map(|(_, l)| l.len()).collect();
        assert_eq!(sizes, [LINE_MAX, LINE_MAX, 5], "a line without end is handed on in bounded pieces");
    }
}
