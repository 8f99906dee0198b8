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
}

async fn handle(tick: Tick, job: Data<Job>) -> Result<(), BoxDynError> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    let at = tick.get_timestamp() as i64 * 1000;
    job.starts.lock().map_err(|_| "poisoned")?.push((at, now - at));
    tokio::fs::write(&job.out, "x").await?;
    Ok(())
}

/// Runs `n` jobs on `cron` (6 fields, seconds first) for `seconds`; returns (tick ms, lateness
/// ms) of every start.
pub(crate) fn run(n: usize, cron: &str, seconds: u64, dir: &Path) -> Vec<(i64, i64)> {
    let schedule = cron::Schedule::from_str(cron).expect("cron");
    let starts = Arc::new(Mutex::new(Vec::new()));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    std::fs::create_dir_all(dir).expect("out dir");
    rt.block_on(async {
        for i in 0..n {
            let job = Job { out: dir.join(format!("{i}.txt")), starts: starts.clone() };
            let worker = WorkerBuilder::new(format!("job-{i:05}")).backend(CronScheduler::new(schedule.clone())).data(job).build(handle);
            tokio::spawn(async move {
                let _ = worker.run().await;
            });
        }
        tokio::time::sleep(Duration::from_secs(seconds)).await;
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    starts.lock().expect("starts").clone()
}
