//! Signals shared by every worker of one PostgreSQL database: a local [`Local`] plus
//! `NOTIFY lamplighter` to the other workers (signals batched into few notifications) and one
//! `LISTEN` connection feeding theirs in. A listener that loses its connection cannot know what
//! it missed: its receivers get [`Signal::Lagged`].

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::signals::{Local, Receiver, Signal, Signals};

/// The PostgreSQL channel the workers of one database share.
const CHANNEL: &str = "lamplighter";

/// PostgreSQL's payload limit is 8000 bytes; batches stay under it.
const PAYLOAD_MAX: usize = 7800;

/// The least time between two statements of notices. Each is a transaction of its own that
/// every worker's listener reads (the sender's own too): a drain sent one or two a write of
/// ends, a tenth of the server's time a run (`cargo bench … postgres -- drain`: 56–59 µs a
/// run with them, 49–53 without). Other workers hear of a change at most this much (and the
/// statement before) later.
const NOTICES_APART: Duration = Duration::from_millis(5);

/// One notification: who sent it and what changed.
#[derive(Debug, Serialize, Deserialize)]
struct Notice {
    /// The sending worker; a worker skips its own notices (it had them locally already).
    o: String,
    s: Vec<Signal>,
}

/// Signals shared by every worker of one PostgreSQL database.
#[derive(Debug)]
pub(crate) struct PgSignals {
    local: Local,
    out: mpsc::UnboundedSender<Signal>,
}

impl Signals for PgSignals {
    fn publish(&self, signal: Signal) {
        if signal != Signal::Lagged {
            let _ = self.out.send(signal.clone());
        }
        self.local.publish(signal);
    }

    fn subscribe(&self) -> Receiver {
        self.local.subscribe()
    }
}

impl PgSignals {
    /// Starts the listener and the sender for worker `me`; both stop with `stop`. Returns once
    /// the listener listens, so nothing another worker sends from then on is missed.
    pub(crate) async fn start(pool: PgPool, me: String, stop: CancellationToken) -> Result<Arc<PgSignals>, sqlx::Error> {
        let (out, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(PgSignals { local: Local::new(), out });
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.listen(CHANNEL).await?;
        tokio::spawn(listen(listener, shared.clone(), me.clone(), stop.clone()));
        tokio::spawn(send(pool, rx, me, stop));
        Ok(shared)
    }
}

/// Feeds other workers' notices to the local receivers.
async fn listen(mut listener: PgListener, shared: Arc<PgSignals>, me: String, stop: CancellationToken) {
    let mut failing = false;
    loop {
        let got = tokio::select! {
            r = listener.try_recv() => r,
            () = stop.cancelled() => return,
        };
        match got {
            Ok(Some(n)) => {
                failing = false;
                match serde_json::from_str::<Notice>(n.payload()) {
                    Ok(notice) if notice.o == me => {}
                    Ok(notice) => notice.s.into_iter().for_each(|s| shared.local.publish(s)),
                    // A newer or foreign sender: whatever it meant, look again.
                    Err(_) => shared.local.publish(Signal::Lagged),
                }
            }
            // The connection was lost (and is made again at the next call): what was sent
            // meanwhile is gone, so every receiver reads the database again.
            Ok(None) => {
                tracing::warn!("lost the notification connection to the database; reconnecting");
                shared.local.publish(Signal::Lagged);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot listen for other workers' notifications; retrying every second");
                    failing = true;
                }
                shared.local.publish(Signal::Lagged);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

/// Sends local signals to the other workers, batched ([`Paced`]): whatever is waiting goes in
/// one statement, as few notifications as fit.
async fn send(pool: PgPool, rx: mpsc::UnboundedReceiver<Signal>, me: String, stop: CancellationToken) {
    let mut failing = false;
    let mut batches = Paced { rx, stop, last: None, stopping: false };
    while let Some(batch) = batches.next().await {
        let payloads = payloads(&me, batch);
        match sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) p").bind(CHANNEL).bind(&payloads).execute(&pool).await {
            Ok(_) => failing = false,
            // Hints only: the other workers see the database when they next look (a lost
            // connection tells their listeners to look at once).
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot notify the other workers; they will see the change when they next read");
                    failing = true;
                }
            }
        }
    }
}

/// The signals of `rx` in batches, at most one every [`NOTICES_APART`]: a signal after a quiet
/// while goes at once; those that follow a batch closely wait for the rest of its interval and
/// go together. At `stop`, what is waiting still goes, once (the last ends of a stopping worker
/// are published just before it stops); then none, as when every sender is gone.
struct Paced {
    rx: mpsc::UnboundedReceiver<Signal>,
    stop: CancellationToken,
    /// When the last batch went.
    last: Option<tokio::time::Instant>,
    stopping: bool,
}

impl Paced {
    async fn next(&mut self) -> Option<Vec<Signal>> {
        if self.stopping {
            return None;
        }
        let first = tokio::select! {
            s = self.rx.recv() => s?,
            () = self.stop.cancelled() => {
                self.stopping = true;
                self.rx.try_recv().ok()?
            }
        };
        if let (Some(last), false) = (self.last, self.stopping) {
            tokio::select! {
                () = tokio::time::sleep_until(last + NOTICES_APART) => {}
                () = self.stop.cancelled() => self.stopping = true,
            }
        }
        self.last = Some(tokio::time::Instant::now());
        let mut batch = vec![first];
        while let Ok(s) = self.rx.try_recv() {
            batch.push(s);
        }
        batch.dedup();
        Some(batch)
    }
}

/// `signals` as JSON notices of at most [`PAYLOAD_MAX`] bytes each.
fn payloads(me: &str, signals: Vec<Signal>) -> Vec<String> {
    let mut out = Vec::new();
    let mut batch: Vec<Signal> = Vec::new();
    let mut size = 0;
    for s in signals {
        let len = serde_json::to_string(&s).map(|j| j.len() + 1).unwrap_or(0);
        if !batch.is_empty() && size + len > PAYLOAD_MAX - me.len() - 16 {
            out.push(serde_json::to_string(&Notice { o: me.to_string(), s: std::mem::take(&mut batch) }).unwrap_or_default());
            size = 0;
        }
        size += len;
        batch.push(s);
    }
    if !batch.is_empty() {
        out.push(serde_json::to_string(&Notice { o: me.to_string(), s: batch }).unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first signal goes at once; those right after a batch wait for its interval and go
    /// in one; one after a quiet while goes at once again; one waiting at the stop still goes.
    #[tokio::test(start_paused = true)]
    async fn signals_close_after_a_batch_wait_for_its_interval_and_go_together() {
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        // Each batch handed on: when, after the start, and what.
        type Batches = Vec<(Duration, Vec<Signal>)>;
        let sent: Arc<std::sync::Mutex<Batches>> = Arc::default();
        let t0 = tokio::time::Instant::now();
        let log = sent.clone();
        let mut batches = Paced { rx, stop: stop.clone(), last: None, stopping: false };
        let task = tokio::spawn(async move {
            while let Some(batch) = batches.next().await {
                log.lock().unwrap().push((t0.elapsed(), batch));
            }
        });
        let ms = Duration::from_millis;
        tx.send(Signal::Wake).unwrap();
        tokio::time::sleep(ms(1)).await;
        tx.send(Signal::RunsChanged).unwrap();
        tx.send(Signal::RunFinished("r1".into())).unwrap();
        tokio::time::sleep(ms(2)).await;
        tx.send(Signal::RunFinished("r2".into())).unwrap();
        tokio::time::sleep(ms(30)).await;
        tx.send(Signal::TasksPushed).unwrap();
        tokio::time::sleep(ms(1)).await;
        // Within the interval, and then the stop: handed on at once, not dropped.
        tx.send(Signal::JobChanged).unwrap();
        stop.cancel();
        task.await.unwrap();
        let r = |id: &str| Signal::RunFinished(id.into());
        assert_eq!(
            *sent.lock().unwrap(),
            vec![
                (ms(0), vec![Signal::Wake]),
                (NOTICES_APART, vec![Signal::RunsChanged, r("r1"), r("r2")]),
                (ms(33), vec![Signal::TasksPushed]),
                (ms(34), vec![Signal::JobChanged]),
            ]
        );
    }

    #[test]
    fn notices_stay_under_the_payload_limit_and_keep_every_signal() {
        let mut signals: Vec<Signal> = (0..2000).map(|i| Signal::RunFinished(format!("0199-run-{i}"))).collect();
        // Every kind a worker sends (all but `Lagged`, which is local).
        signals.extend([
            Signal::Wake,
            Signal::JobChanged,
            Signal::jobs_changed(vec!["nightly".into(), "hourly".into()]),
            Signal::TasksPushed,
            Signal::RunsChanged,
            Signal::CancelRequested { run: "r1".into(), why: "asked".into() },
        ]);
        let payloads = payloads("worker-a", signals.clone());
        assert!(payloads.len() > 1, "2000 ends do not fit one notice");
        assert!(payloads.iter().all(|p| !p.is_empty()), "every notice encodes");
        assert!(payloads.iter().all(|p| p.len() < 8000), "PostgreSQL refuses payloads of 8000 bytes or more");
        let back: Vec<Signal> = payloads.iter().flat_map(|p| serde_json::from_str::<Notice>(p).expect("a notice").s).collect();
        assert_eq!(back, signals);
    }
}
