//! The threads the file actions' work runs on (`file-read`, `file-save`): off the
//! runtime's threads, since a file system can block (a disk under writeback, a network mount),
//! and woken only when the work waiting needs another thread.
//!
//! Tokio's blocking pool wakes an idle thread for every call while one is idle, and the caller's
//! task is woken from that thread when it is done: two thread wakes and two context switches
//! for a 2-byte read. Measured on the PostgreSQL drain of 50,000 `file-read` runs
//! (BENCHMARKS.md), that hand-over was about a third of the worker's CPU a run (the work done
//! on the runtime's thread instead, tried and not kept: a stuck file system would stall the
//! ticks); this pool takes back about half of it. Here a
//! thread that finishes a piece of work takes the next one waiting before it sleeps, and a
//! sleeping thread is woken (or a new one started, up to the pool's size) only when more work
//! waits than the threads awake could each take one of ([`Pool::BACKLOG`]): so a burst's
//! claims fill a few threads, not one each, and a piece of work stuck in the file system holds
//! back at most that many others, for at most [`Pool::HELD`], before another thread takes them.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// One piece of work, with its answer's sending side inside.
type Work = Box<dyn FnOnce() + Send>;

/// A pool of threads for short blocking work.
pub(crate) struct Pool {
    state: Mutex<State>,
    wake: Condvar,
    /// Most threads at once.
    size: usize,
    /// How long a thread with nothing to do waits before it ends.
    keep_alive: Duration,
    name: &'static str,
}

struct State {
    waiting: VecDeque<Work>,
    /// Threads started and not ended.
    threads: usize,
    /// Threads waiting on `wake`, those woken and not yet running included.
    sleeping: usize,
    /// Of `sleeping`, those told to wake.
    woken: usize,
    /// Threads running a piece of work.
    busy: usize,
}

impl State {
    /// Threads that will take the next piece of work without being woken: awake between
    /// pieces, or woken and on their way.
    fn ready(&self) -> usize {
        self.threads - self.sleeping - self.busy + self.woken
    }
}

/// A piece of work's state, given up on when its caller stops waiting, however it stops (a
/// drop included): a thread that comes to it then passes it by.
struct Abandon(Arc<AtomicU8>);

impl Abandon {
    /// Whether the work was still waiting, and now never runs.
    fn give_up(&self) -> bool {
        self.0.compare_exchange(WAITING, DROPPED, SeqCst, SeqCst).is_ok()
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        self.give_up();
    }
}

/// Where a piece of work is: waiting for a thread, taken by one, or dropped by its caller.
const WAITING: u8 = 0;
const RUNNING: u8 = 1;
const DROPPED: u8 = 2;

/// Why the work gave no answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// Cancelled before a thread took it: it never ran.
    Cancelled,
    Panicked,
    /// The pool's thread could not be started, or went with the work.
    Lost,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stopped::Cancelled => "it was cancelled",
            Stopped::Panicked => "it panicked",
            Stopped::Lost => "its thread went",
        })
    }
}

impl Pool {
    /// How many pieces of work may wait for each thread awake (busy or between pieces) before
    /// another is woken. At 1, a piece stuck in the file system holds back at most one other,
    /// for at most [`Pool::HELD`].
    const BACKLOG: usize = 1;

    /// How long a piece of work waits before a thread is woken for it whatever the backlog:
    /// the threads awake may all be stuck (a hung mount) while a lone piece waits.
    const HELD: Duration = Duration::from_millis(10);

    pub(crate) const fn new(name: &'static str, size: usize, keep_alive: Duration) -> Self {
        Self {
            state: Mutex::new(State { waiting: VecDeque::new(), threads: 0, sleeping: 0, woken: 0, busy: 0 }),
            wake: Condvar::new(),
            size,
            keep_alive,
            name,
        }
    }

    /// The file actions' pool: four threads a core (at least 8), the bound the tokio pool had
    /// through a semaphore; a thread idle for 10 s ends.
    pub(crate) fn files() -> &'static Pool {
        static FILES: OnceLock<Pool> = OnceLock::new();
        FILES.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
            Pool::new("ll-files", (4 * cores).max(8), Duration::from_secs(10))
        })
    }

    /// Runs `work` on one of the pool's threads and waits for its answer. Cancelled, or this
    /// future dropped (a run's timeout drops its target), before a thread took it, the work is
    /// never run ([`Stopped::Cancelled`]); once running, it is waited for (the file actions
    /// look at the cancel themselves), so a write that began is answered by its outcome.
    pub(crate) async fn run<T: Send + 'static>(
        &'static self,
        cancel: &CancellationToken,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Stopped> {
        let (tx, mut rx) = oneshot::channel();
        let taken = Arc::new(AtomicU8::new(WAITING));
        let claim = taken.clone();
        self.push(Box::new(move || {
            if claim.compare_exchange(WAITING, RUNNING, SeqCst, SeqCst).is_ok() {
                let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|_| Stopped::Panicked));
            }
        }));
        let abandon = Abandon(taken);
        // Work still waiting after `HELD` is behind threads that are slow or stuck: one more
        // thread is woken for it, once.
        let held = tokio::time::sleep(Self::HELD);
        tokio::pin!(held);
        let mut nudged = false;
        loop {
            tokio::select! {
                answer = &mut rx => return answer.unwrap_or(Err(Stopped::Lost)),
                () = cancel.cancelled() => break,
                () = &mut held, if !nudged => {
                    nudged = true;
                    if abandon.0.load(SeqCst) == WAITING {
                        self.wake_one(self.lock());
                    }
                }
            }
        }
        if abandon.give_up() {
            return Err(Stopped::Cancelled);
        }
        rx.await.unwrap_or(Err(Stopped::Lost))
    }

    /// Queues `work`, and wakes or starts a thread for it if the threads awake have enough.
    fn push(&'static self, work: Work) {
        let mut st = self.lock();
        st.waiting.push_back(work);
        if st.waiting.len() > Self::BACKLOG * (st.ready() + st.busy) {
            self.wake_one(st);
        }
    }

    /// Wakes a sleeping thread, or starts one if the pool has room.
    fn wake_one(&'static self, mut st: MutexGuard<'_, State>) {
        if st.sleeping > st.woken {
            st.woken += 1;
            self.wake.notify_one();
        } else if st.threads < self.size {
            st.threads += 1;
            drop(st);
            if let Err(e) = std::thread::Builder::new().name(self.name.into()).spawn(move || self.serve()) {
                let mut st = self.lock();
                st.threads -= 1;
                tracing::error!(pool = self.name, threads = st.threads, error = %e, "cannot start a thread for file work");
                // With no thread at all nothing would take the work: it is dropped (outside
                // the lock), and its callers answered (`Stopped::Lost`).
                if st.threads == 0 {
                    let lost = std::mem::take(&mut st.waiting);
                    drop(st);
                    drop(lost);
                }
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A thread's life: the work waiting, first come first served, then a sleep until woken
    /// or until `keep_alive` passes with nothing to do.
    fn serve(&self) {
        behind_the_runtime();
        let mut st = self.lock();
        loop {
            if let Some(work) = st.waiting.pop_front() {
                st.busy += 1;
                drop(st);
                // The work catches its own panics; this catches one from a drop after it (its
                // answer's, or an abandoned work's captures), which would end the thread with
                // it counted busy.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                st = self.lock();
                st.busy -= 1;
                continue;
            }
            st.sleeping += 1;
            let (back, waited) = self.wake.wait_timeout(st, self.keep_alive).unwrap_or_else(std::sync::PoisonError::into_inner);
            st = back;
            st.sleeping -= 1;
            // Told to or not, this thread is awake now: one fewer to count as woken (if another
            // was told and wakes too, a later call may wake one thread more than it needed).
            st.woken = st.woken.saturating_sub(1).min(st.sleeping);
            if waited.timed_out() && st.waiting.is_empty() {
                st.threads -= 1;
                return;
            }
        }
    }
}

/// Lowers the calling thread's priority by [`NICER`]: the file work of a burst's runs yields
/// the cores to the runtime's threads, which are recording the burst's other starts. Measured
/// (`runcore -- burst`, BENCHMARKS.md): at the runtime's priority, the pool's threads, which
/// now take the next work without the runtime, put 2–8 ms on a burst's p99; at +5 none showed,
/// and the drain kept its gain.
fn behind_the_runtime() {
    let me = Some(rustix::thread::gettid());
    let now = rustix::process::getpriority_process(me).unwrap_or(0);
    if let Err(e) = rustix::process::setpriority_process(me, (now + NICER).min(19)) {
        tracing::debug!(error = %e, "cannot lower a file thread's priority");
    }
}

/// How much lower the file threads' priority is than the runtime's.
const NICER: i32 = 5;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    fn pool(size: usize, keep_alive: Duration) -> &'static Pool {
        Box::leak(Box::new(Pool::new("ll-test-pool", size, keep_alive)))
    }

    /// `work` run on `p`, as a task of its own, answered within 10 s.
    fn spawn<T: Send + 'static + std::fmt::Debug>(
        p: &'static Pool,
        cancel: &CancellationToken,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> tokio::task::JoinHandle<Result<T, Stopped>> {
        let cancel = cancel.clone();
        tokio::spawn(
            async move { tokio::time::timeout(Duration::from_secs(10), p.run(&cancel, work)).await.expect("an answer within 10 s") },
        )
    }

    /// A gate a piece of work waits at until the test opens it.
    fn gate() -> (Arc<(Mutex<bool>, Condvar)>, impl Fn()) {
        let g = Arc::new((Mutex::new(false), Condvar::new()));
        let opener = g.clone();
        (g, move || {
            *opener.0.lock().unwrap() = true;
            opener.1.notify_all();
        })
    }

    fn wait_at(g: &(Mutex<bool>, Condvar)) {
        let mut open = g.0.lock().unwrap();
        while !*open {
            open = g.1.wait(open).unwrap();
        }
    }

    /// Until `p`'s state is `done` (checked every millisecond, for at most 10 s; `what` names
    /// it for the failure).
    async fn until(p: &Pool, what: &str, done: impl Fn(&State) -> bool) {
        let began = Instant::now();
        while !done(&p.lock()) {
            assert!(began.elapsed() < Duration::from_secs(10), "never: {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Until `busy` threads are running work.
    async fn until_busy(p: &Pool, busy: usize) {
        until(p, &format!("{busy} pieces of work running at once"), |st| st.busy >= busy).await;
    }

    /// Until a piece of work waits for a thread.
    async fn until_waiting(p: &Pool) {
        until(p, "a piece of work queued", |st| !st.waiting.is_empty()).await;
    }

    /// A piece of work stuck at a gate on one of a pool's threads.
    struct Stuck<O: Fn()> {
        task: tokio::task::JoinHandle<Result<(), Stopped>>,
        open: O,
    }

    impl<O: Fn()> Stuck<O> {
        /// Checks it is still stuck, opens its gate, and checks it answers.
        async fn release(self) {
            assert!(!self.task.is_finished(), "the stuck piece of work is still running");
            (self.open)();
            assert_eq!(self.task.await.unwrap(), Ok(()));
        }
    }

    /// A piece of work stuck at a gate on one of `p`'s threads, running once this returns.
    async fn stuck_on(p: &'static Pool, cancel: &CancellationToken) -> Stuck<impl Fn()> {
        let (g, open) = gate();
        let task = spawn(p, cancel, move || wait_at(&g));
        until_busy(p, 1).await;
        Stuck { task, open }
    }

    #[tokio::test]
    async fn work_answers_and_a_panic_is_an_answer() {
        let (p, none) = (pool(2, Duration::from_secs(10)), CancellationToken::new());
        assert_eq!(p.run(&none, || 2 + 2).await, Ok(4));
        assert_eq!(p.run(&none, || -> u8 { panic!("boom") }).await, Err(Stopped::Panicked));
        // The thread that ran the panic serves on.
        assert_eq!(p.run(&none, || "still here").await, Ok("still here"));
        assert_eq!(p.lock().threads, 1, "one piece at a time needs one thread");
    }

    /// One piece of work stuck in the file system holds back at most `BACKLOG` others: the next
    /// one queued behind it starts another thread at once.
    #[tokio::test]
    async fn a_stuck_piece_of_work_holds_back_at_most_one_other() {
        let (p, none) = (pool(4, Duration::from_secs(10)), CancellationToken::new());
        let stuck = stuck_on(p, &none).await;
        let (tx, rx) = std::sync::mpsc::channel();
        let answer = |what: &'static str| -> Work {
            let tx = tx.clone();
            Box::new(move || tx.send(what).expect("the test waits"))
        };
        p.push(answer("behind"));
        assert_eq!(p.lock().threads, 1, "one piece may wait behind the busy thread");
        p.push(answer("next"));
        assert_eq!(p.lock().threads, 2, "the second piece behind it starts a thread");
        let mut got =
            [rx.recv_timeout(Duration::from_secs(10)).expect("an answer"), rx.recv_timeout(Duration::from_secs(10)).expect("an answer")];
        got.sort_unstable();
        assert_eq!(got, ["behind", "next"], "both answered while the first is stuck");
        stuck.release().await;
    }

    /// A lone piece of work behind a stuck thread is not held for good: a thread is woken for
    /// it after `HELD`.
    #[tokio::test]
    async fn a_lone_piece_behind_a_stuck_thread_is_taken() {
        let (p, none) = (pool(4, Duration::from_secs(10)), CancellationToken::new());
        let stuck = stuck_on(p, &none).await;
        assert_eq!(spawn(p, &none, || "taken").await.unwrap(), Ok("taken"));
        stuck.release().await;
    }

    /// Work whose caller went (its future dropped, as a run's timeout drops its target) before
    /// a thread took it never runs.
    #[tokio::test]
    async fn work_whose_caller_went_never_runs() {
        let (p, none) = (pool(1, Duration::from_secs(10)), CancellationToken::new());
        let ran = Arc::new(AtomicUsize::new(0));
        let stuck = stuck_on(p, &none).await;
        let gone = spawn(p, &none, {
            let ran = ran.clone();
            move || ran.fetch_add(1, Ordering::SeqCst)
        });
        until_waiting(p).await;
        gone.abort();
        assert!(gone.await.is_err_and(|e| e.is_cancelled()));
        stuck.release().await;
        // Served in order on the one thread: once this answers, the dropped one was passed.
        assert_eq!(p.run(&none, || "after").await, Ok("after"));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the work of a caller that went never ran");
    }

    #[tokio::test]
    async fn no_more_threads_than_the_pools_size() {
        let (p, none) = (pool(3, Duration::from_secs(10)), CancellationToken::new());
        let (g, open) = gate();
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let all: Vec<_> = (0..12)
            .map(|_| {
                let (g, now, most) = (g.clone(), now.clone(), most.clone());
                spawn(p, &none, move || {
                    most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    wait_at(&g);
                    now.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        until_busy(p, 3).await;
        {
            let st = p.lock();
            assert_eq!((st.threads, st.waiting.len()), (3, 9), "three threads, the rest waiting");
        }
        open();
        for one in all {
            assert_eq!(one.await.unwrap(), Ok(()));
        }
        assert_eq!(most.load(Ordering::SeqCst), 3, "at most the pool's size ran at once");
    }

    /// Work cancelled before a thread took it never runs; work cancelled while it runs is
    /// waited for, and answers with what it did.
    #[tokio::test]
    async fn a_cancel_drops_waiting_work_and_waits_for_running_work() {
        let (p, none) = (pool(1, Duration::from_secs(10)), CancellationToken::new());
        let (g, open) = gate();
        let ran = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let stuck = spawn(p, &stop, move || {
            wait_at(&g);
            "finished"
        });
        until_busy(p, 1).await;
        let waiting = spawn(p, &stop, {
            let ran = ran.clone();
            move || ran.fetch_add(1, Ordering::SeqCst)
        });
        until_waiting(p).await;
        stop.cancel();
        assert_eq!(waiting.await.unwrap(), Err(Stopped::Cancelled));
        assert!(!stuck.is_finished(), "the running piece is waited for");
        open();
        assert_eq!(stuck.await.unwrap(), Ok("finished"));
        // Served in order on the one thread: once this answers, the cancelled one was passed.
        assert_eq!(p.run(&none, || "after").await, Ok("after"));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the cancelled work never ran");
    }

    #[tokio::test]
    async fn an_idle_thread_ends_after_its_keep_alive() {
        let (p, none) = (pool(2, Duration::from_millis(50)), CancellationToken::new());
        assert_eq!(p.run(&none, || 1).await, Ok(1));
        until(p, "the idle thread ended", |st| st.threads == 0).await;
        // And the pool starts one again for the next piece.
        assert_eq!(p.run(&none, || 2).await, Ok(2));
    }
}
