//! The in-memory peer of the burst benches: apalis-cron 1.0, built into the bench (a dev-only
//! dependency), so that one command measures both side by side.
//!
//! The same load as Lamplighter's: `n` jobs on one cron expression, each an apalis worker of
//! its own on a `CronScheduler`, in a multi-threaded tokio runtime on this machine's cores.
//! Each handler records its start (the tick's lateness: now − the tick's instant), then
//! writes its file as `file-save` does. Nothing is persisted: a tick is not recorded before
//! its handler runs, and a restart loses what was due (apalis-cron computes the next tick from
//! now). That is the difference the figures put a price on.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use apalis::prelude::*;
use apalis_cron::{CronScheduler, Tick};

#[derive(Clone)]
struct Job {
    /// Where the handler writes its file.
    out: PathBuf,
    /// (tick ms, lateness ms) of every start.
    starts: Arc<Mutex<Vec<(i64, i64)>>>,
    /// Told when the expected number of starts of ticks from the given ms on are recorded.
    all_started: Arc<(tokio::sync::Notify, usize, i64, std::sync::atomic::AtomicUsize)>,
}

async fn handle(tick: Tick, job: Data<Job>) -> Result<(), BoxDynError> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    let at = tick.get_timestamp() as i64 * 1000;
    job.starts.lock().map_err(|_| "poisoned")?.push((at, now - at));
    let counted = at >= job.all_started.2;
    if counted && job.all_started.3.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == job.all_started.1 {
        job.all_started.0.notify_one();
    }
    tokio::fs::write(&job.out, "x").await?;
    Ok(())
}

/// Runs `n` jobs on `cron` (6 fields, seconds first) through the ticks of the next `seconds`,
/// until each has started them all; returns (tick ms, lateness ms) of every start.
pub(crate) fn run(n: usize, cron: &str, seconds: u64, dir: &Path) -> Vec<(i64, i64)> {
    let schedule = cron::Schedule::from_str(cron).expect("cron");
    // The workers compute their first tick from when they start: the ticks after a second's
    // margin, within the window.
    let from = chrono::Utc::now() + chrono::Duration::seconds(1);
    let ticks = schedule.after(&from).take_while(|t| *t < from + chrono::Duration::seconds(seconds as i64)).count();
    let all_started = Arc::new((tokio::sync::Notify::new(), n * ticks, from.timestamp_millis(), Default::default()));
    let starts = Arc::new(Mutex::new(Vec::new()));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    std::fs::create_dir_all(dir).expect("out dir");
    rt.block_on(async {
        for i in 0..n {
            let job = Job { out: dir.join(format!("{i}.txt")), starts: starts.clone(), all_started: all_started.clone() };
            let worker = WorkerBuilder::new(format!("job-{i:05}")).backend(CronScheduler::new(schedule.clone())).data(job).build(handle);
            tokio::spawn(async move {
                let _ = worker.run().await;
            });
        }
        // Every start of the window's ticks, or a tick's worth past the window at most.
        let _ = tokio::time::timeout(Duration::from_secs(seconds + 10), all_started.0.notified()).await;
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    starts.lock().expect("starts").clone()
}
