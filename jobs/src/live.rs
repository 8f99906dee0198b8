//! A run's live output: the lines its commands print, recorded as they come (in small batches,
//! a tenth of a second apart) so that `runs follow` and MCP clients following the run see them
//! before the command ends, and kept with the run afterwards. Bounded: an attempt keeps the
//! first [`LOG_CAP`] bytes, and a last line says how much was left out.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use lamplighter_contract::OutputLine;
use lamplighter_plugins::{OutputSink, OutputStream};

use crate::signals::{Signal, Signals};
use crate::store::Records;

/// The most bytes of output one attempt keeps.
pub(crate) const LOG_CAP: usize = 1024 * 1024;
/// How long lines gather before they are written together.
const BATCH: Duration = Duration::from_millis(100);

/// One attempt's output log. Lines come in through [`LiveOutput::sink`]; a writer task, started
/// with the first line, records them; [`LiveOutput::finish`] writes the rest before the run's
/// end is recorded.
pub(crate) struct LiveOutput {
    run_id: String,
    store: Arc<dyn Records>,
    signals: Arc<dyn Signals>,
    /// The run's: a stopped run stops waiting for a write that does not go through.
    cancel: CancellationToken,
    state: Mutex<State>,
    more: Notify,
    /// The run's work stopped: the writer hands over to `finish`.
    closing: Notify,
    /// The last line an earlier execution of the run recorded (a run resumed after an
    /// approval keeps its id): this one's lines are numbered after it. Known (0) for a run that
    /// starts afresh; read at the first write of a resumed one.
    base: tokio::sync::OnceCell<u64>,
}

#[derive(Default)]
struct State {
    pending: Vec<OutputLine>,
    seq: u64,
    kept: usize,
    dropped_lines: u64,
    dropped_bytes: u64,
    writer: Option<tokio::task::JoinHandle<()>>,
    closed: bool,
}

impl LiveOutput {
    /// The log of run `run_id`'s execution; `resumed`: an earlier execution of it (before a wait
    /// for a decision) may have printed already.
    pub(crate) fn new(
        run_id: &str,
        resumed: bool,
        store: Arc<dyn Records>,
        signals: Arc<dyn Signals>,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            run_id: run_id.to_owned(),
            store,
            signals,
            cancel,
            state: Mutex::new(State::default()),
            more: Notify::new(),
            closing: Notify::new(),
            base: if resumed { tokio::sync::OnceCell::new() } else { tokio::sync::OnceCell::new_with(Some(0)) },
        })
    }

    /// Stops the writer when dropped, unless [`LiveOutput::finish`] ran: the run's work ended
    /// some other way (a panic) and nobody will finish the log.
    pub(crate) fn guard(self: &Arc<Self>) -> WriterGuard {
        WriterGuard(self.clone())
    }

    /// Where a plugin action's command sends its lines.
    pub(crate) fn sink(self: &Arc<Self>) -> OutputSink {
        let me = self.clone();
        Arc::new(move |stream, text: &str| me.push(stream, text))
    }

    fn push(self: &Arc<Self>, stream: OutputStream, text: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.closed {
            return;
        }
        if s.kept + text.len() > LOG_CAP {
            s.dropped_lines += 1;
            s.dropped_bytes += text.len() as u64;
            return;
        }
        s.kept += text.len();
        s.seq += 1;
        let stream = match stream {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        };
        let line = OutputLine { seq: s.seq, stream: stream.into(), at: Utc::now(), text: text.to_owned() };
        s.pending.push(line);
        if s.writer.is_none() {
            let me = self.clone();
            s.writer = Some(tokio::spawn(async move { me.write_loop().await }));
        }
        drop(s);
        self.more.notify_one();
    }

    async fn write_loop(self: Arc<Self>) {
        loop {
            self.more.notified().await;
            // Let a burst gather: one write (and one notice to followers) per batch. The end of
            // the run cuts the wait short.
            tokio::select! {
                () = tokio::time::sleep(BATCH) => {}
                () = self.closing.notified() => {}
                () = self.cancel.cancelled() => {}
            }
            let (lines, closed) = {
                let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                (std::mem::take(&mut s.pending), s.closed)
            };
            if closed {
                // What it took goes back, for `finish` to write after what came before.
                self.state.lock().unwrap_or_else(|e| e.into_inner()).pending.splice(0..0, lines);
                return;
            }
            if !self.write(&lines).await {
                // Kept for the next batch (the database is down for now; nothing is held up).
                self.state.lock().unwrap_or_else(|e| e.into_inner()).pending.splice(0..0, lines);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => self.more.notify_one(),
                    () = self.closing.notified() => return,
                    () = self.cancel.cancelled() => return,
                }
            }
        }
    }

    /// One attempt: the log must never hold up a run or its end (a database that is down is
    /// the recorder's to wait out, with the run's end). True when recorded.
    async fn write(&self, lines: &[OutputLine]) -> bool {
        if lines.is_empty() {
            return true;
        }
        let base = match self.base.get() {
            Some(b) => *b,
            None => match self.store.output(&self.run_id).await {
                Ok(earlier) => *self.base.get_or_init(|| async { earlier.last().map_or(0, |l| l.seq) }).await,
                Err(e) => {
                    tracing::debug!(run = %self.run_id, error = %e, "cannot read the run's earlier output");
                    return false;
                }
            },
        };
        let numbered: Vec<OutputLine>;
        let lines = if base == 0 {
            lines
        } else {
            numbered = lines.iter().map(|l| OutputLine { seq: l.seq + base, ..l.clone() }).collect();
            &numbered
        };
        match self.store.append_output(&self.run_id, lines).await {
            Ok(()) => {
                self.signals.publish(Signal::RunProgress(self.run_id.clone()));
                true
            }
            Err(e) => {
                tracing::debug!(run = %self.run_id, lines = lines.len(), error = %e, "output not recorded yet");
                false
            }
        }
    }

    /// Writes what is left (and a line saying what the cap dropped): call once the run's work
    /// stopped, before its end is recorded, so a follower sees every line before the end.
    pub(crate) async fn finish(&self) {
        let (writer, lines) = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            s.closed = true;
            if s.dropped_lines > 0 {
                s.seq += 1;
                let text = format!(
                    "[… {} more lines ({} bytes) not recorded: a run's log keeps the first {} MiB of its output]",
                    s.dropped_lines,
                    s.dropped_bytes,
                    LOG_CAP / (1024 * 1024)
                );
                let line = OutputLine { seq: s.seq, stream: "lamplighter".into(), at: Utc::now(), text };
                s.pending.push(line);
            }
            (s.writer.take(), std::mem::take(&mut s.pending))
        };
        if let Some(writer) = writer {
            // It stops at once, handing back what it had taken; all is written here, in order.
            self.closing.notify_one();
            self.more.notify_one();
            let _ = writer.await;
        }
        let lines = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let mut all = std::mem::take(&mut s.pending);
            all.extend(lines);
            all
        };
        if !self.write(&lines).await {
            tracing::warn!(run = %self.run_id, lines = lines.len(), "the run's last output lines are not recorded: the database refused them");
        }
    }
}

/// See [`LiveOutput::guard`].
pub(crate) struct WriterGuard(Arc<LiveOutput>);

impl Drop for WriterGuard {
    fn drop(&mut self) {
        if let Some(writer) = self.0.state.lock().unwrap_or_else(|e| e.into_inner()).writer.take() {
            writer.abort();
        }
    }
}
