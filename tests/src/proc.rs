//! Starting the real worker in tests and benchmarks: its stderr is copied line by line to a log
//! file, and the caller waits for the line saying it is ready — an event from the process,
//! not a poll on a timer.

// Starting processes is this module's job.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// What the worker logs (at `info`) once it serves: storage open, engine running, port bound.
pub const READY_LINE: &str = "lamplighter ready";

/// Spawns `cmd` with its stderr appended to `log`, then waits up to `within` for a stderr line
/// containing `marker`. A process that exits (its stderr ends) or stays silent past `within` is
/// killed, and the error carries its log.
pub fn spawn_until(cmd: &mut Command, log: &Path, marker: &str, within: Duration) -> Result<Child, String> {
    let mut child = cmd.stderr(Stdio::piped()).spawn().map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let (seen, wait) = mpsc::channel();
    let wanted = marker.to_owned();
    std::thread::spawn(move || {
        let mut seen = Some(seen);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(file, "{line}");
            if line.contains(&wanted)
                && let Some(tx) = seen.take()
            {
                let _ = tx.send(());
            }
        }
        // Dropping `seen` here (stderr ended: the process exited) wakes the waiter too.
    });
    match wait.recv_timeout(within) {
        Ok(()) => Ok(child),
        Err(why) => {
            let _ = child.kill();
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            let what = match why {
                mpsc::RecvTimeoutError::Timeout => format!("no \"{marker}\" line within {within:?}"),
                mpsc::RecvTimeoutError::Disconnected => format!("exited ({status}) before \"{marker}\""),
            };
            Err(format!("{what}:\n{}", std::fs::read_to_string(log).unwrap_or_default()))
        }
    }
}

/// A child process killed (and reaped) when this is dropped: a test that fails midway leaves
/// no server behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
