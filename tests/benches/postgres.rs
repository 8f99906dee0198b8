//! PostgreSQL benchmark (issue 12): the run core's burst and sustained loads on PostgreSQL, and
//! the drain of 50,000 queued no-op runs by one and by three workers sharing the database. The
//! real `lamplighter` binary (release build) against a throwaway cluster of the installed
//! server (the test harness's: `fsync`, `synchronous_commit` and `full_page_writes` off).
//!
//! ```text
//! cargo build --release -p lamplighter-worker
//! cargo bench -p lamplighter-tests --bench postgres -- [burst] [sustained] [drain] [--seconds 60]
//! ```
//!
//! - burst / sustained: as in `runcore` (1,000 `file-save` jobs every 10 s / every second,
//!   concurrency 1000); lateness = `started_at − due_at` as the worker records it.
//! - drain: 50,000 runs queued (as manual triggers leave them) while no worker runs, then 1 or
//!   3 workers with `worker.concurrency: 32` each and a near no-op action (`file-read` of a
//!   2-byte file); rate = runs / (first start → last finish). Then the peer on the same
//!   cluster: graphile-worker 0.18 (Node, installed from npm by `peer/graphile.sh` into a cache
//!   folder), the same number of no-op jobs, 1 and 3 processes of concurrency 32, with its
//!   defaults and batched (`localQueue` 100, completions batched).
//! - shares `[--rounds N] [--workers 1,3] [--history N] [--cron EXPR]`: 1,000 `file-save`
//!   jobs every second (or on `--cron`: `'0 0 1 1 *'` keeps them idle) on one worker and on
//!   three sharing the database (alternated, each on a fresh database, `--seconds` measured
//!   after 10 s of warm-up): the workers' CPU together and the server's over the window (and
//!   the server's by process), and every tick of it run exactly once.
//!   `--history N`: each job keeps N runs from before (the default retention keeps 100).
//! - drain `--limit N [--workers N] [--rounds N] [--limited-only]`: the drain with every run in
//!   one limit of N slots (`scheduling.limits`) against none, alternated, twice each, with 1
//!   and 3 workers.
//! - drain `--schema-b 'SQL; …' [--workers N]`: a schema change tried on the same binary, the
//!   drain alone three times as migrated (a) and with the statements applied after the
//!   migrations (b), alternated.
//! - floor `[--rounds N]`: what a run's two row versions alone cost the server, without the
//!   worker: 50,000 runs queued as the drain queues them, then 1 and 3 connections claiming 32
//!   at a time with the bare update that makes them running and ending them 32 a statement with
//!   the bare update that makes them succeeded and noticed; all claims, then all ends
//!   (measured apart), and each connection's claims and ends in turn (together); a sketch of
//!   a claim that writes no row version of the run (offset: a shared place in the queue and a
//!   row a claim of 32 or of 96, the run's end its one write, 32 a statement); each on a
//!   fresh database; and
//!   graphile-worker batched, whole jobs, on the same cluster; the order turned each round.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{SAVE, Worker, bin, cpu_ms, drain_stages, jobs_yaml, now_ms, stat_fields, summary};

use std::time::{Duration, Instant};

use lamplighter_tests::pg::Cluster;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let seconds: u64 = arg("--seconds").map(|s| s.parse().expect("--seconds N")).unwrap_or(60);
    let mut scenarios: Vec<&str> =
        args.iter().map(String::as_str).filter(|a| ["burst", "sustained", "drain", "shares", "floor"].contains(a)).collect();
    if scenarios.is_empty() {
        scenarios = vec!["burst", "sustained", "drain"];
    }
    println!("binary: {}", bin().display());
    let cluster = Cluster::start();
    let version = query(&cluster.url(), "SELECT version()", |r| sqlx::Row::get::<String, _>(r, 0));
    println!("server: {}", version[0]);
    let pm = cluster.postmaster_pid();
    for (i, s) in scenarios.into_iter().enumerate() {
        let db = format!("bench{i}");
        query(&cluster.url(), &format!("CREATE DATABASE {db}"), |_| ());
        let url = cluster.url_of(&db);
        // Another database of this scenario's, for one more drain on the same cluster.
        let fresh = |name: &str| {
            let db = format!("bench{i}{name}");
            query(&cluster.url(), &format!("CREATE DATABASE {db}"), |_| ());
            cluster.url_of(&db)
        };
        match s {
            "burst" => burst(&url, seconds),
            "sustained" => sustained(&url, seconds),
            "shares" => {
                let rounds: usize = arg("--rounds").map_or(2, |r| r.parse().expect("--rounds N"));
                let groups: Vec<usize> =
                    arg("--workers").map_or(vec![1, 3], |w| w.split(',').map(|n| n.parse().expect("--workers N[,N…]")).collect());
                // Runs each job keeps from before (the default retention keeps 100): the
                // history of a worker that has run for a while.
                let history: usize = arg("--history").map_or(0, |h| h.parse().expect("--history N"));
                // `--cron '0 0 1 1 *'`: the same jobs idle, for what each worker costs alone.
                let cron = arg("--cron").unwrap_or_else(|| "* * * * * *".into());
                for round in 0..rounds {
                    for &workers in &groups {
                        shares(&fresh(&format!("s{workers}r{round}")), workers, seconds, pm, history, &cron);
                    }
                }
            }
            // A schema change tried on the same binary: A as migrated, B with the statements
            // applied after the migrations, alternated.
            "drain" if arg("--schema-b").is_some() => {
                let b = arg("--schema-b").unwrap_or_default();
                let workers: usize = arg("--workers").map_or(1, |w| w.parse().expect("--workers N"));
                for round in 0..3 {
                    for (variant, sql) in [("a", ""), ("b", b.as_str())] {
                        println!("\n##### schema {variant}, round {round}");
                        drain(&fresh(&format!("{variant}{round}")), 50_000, workers, pm, sql);
                    }
                }
            }
            // Every run in one limit against none, alternated, one worker then three.
            "drain" if arg("--limit").is_some() => {
                let limit: u32 = arg("--limit").and_then(|l| l.parse().ok()).expect("--limit N");
                let workers: Vec<usize> = arg("--workers").map_or(vec![1, 3], |w| vec![w.parse().expect("--workers N")]);
                let variants: Vec<(&str, Option<u32>)> = if args.iter().any(|a| a == "--limited-only") {
                    vec![("limit", Some(limit))]
                } else {
                    vec![("none", None), ("limit", Some(limit))]
                };
                let rounds: usize = arg("--rounds").map_or(2, |r| r.parse().expect("--rounds N"));
                for workers in workers {
                    for round in 0..rounds {
                        for &(variant, limit) in &variants {
                            println!("\n##### {variant}, {workers} worker(s), round {round}");
                            drain_limited(&fresh(&format!("{variant}{workers}{round}")), 50_000, workers, pm, limit);
                        }
                    }
                }
            }
            "drain" => {
                drain(&url, 50_000, 1, pm, "");
                drain(&fresh("b"), 50_000, 3, pm, "");
                // The peer, on the same cluster, side by side.
                let peer = graphile_install();
                for (processes, mode) in [(1, "default"), (3, "default"), (1, "batched"), (3, "batched")] {
                    graphile(&peer, &fresh(&format!("g{processes}{mode}")), 50_000, processes, mode, pm);
                }
            }
            "floor" => {
                let rounds: usize = arg("--rounds").map_or(1, |r| r.parse().expect("--rounds N"));
                let peer = graphile_install();
                // Each on a fresh database, the order turned round by round.
                for round in 0..rounds {
                    for clients in [1, 3] {
                        let mut parts = vec!["apart", "together", "offset", "offset96", "peer"];
                        parts.rotate_left(round % 5);
                        for part in parts {
                            let url = fresh(&format!("{part}{clients}r{round}"));
                            match part {
                                "peer" => graphile(&peer, &url, 50_000, clients, "batched", pm),
                                "offset" => floor_offset(&url, 50_000, clients, pm, 32),
                                "offset96" => floor_offset(&url, 50_000, clients, pm, 96),
                                _ => floor(&url, 50_000, clients, pm, part == "together"),
                            }
                        }
                    }
                }
            }
            _ => unreachable!(),
        }
    }
}

/// The `floor` scenario (module docs): the server's CPU a run for the bare claims and ends of
/// `n` runs from `clients` connections, all claims then all ends (`together` false: each
/// measured apart) or each connection's in turn. Autovacuum is off for the table (so a window
/// holds only these statements), and the connections are open before a window starts.
fn floor(url: &str, n: usize, clients: usize, pm: u32, together: bool) {
    let how = if together { "each connection's claims and ends in turn" } else { "all claims, then all ends" };
    println!("\n== floor on PostgreSQL: {n} queued runs, {clients} connection(s), 32 runs a statement, {how} ==");
    let (rt, conns) = floor_queue(url, n, clients);
    // Each connection: claims (and, `end_each`, ends what it claimed at once) until the queue
    // is empty; the connection back, with the ids claimed and not ended.
    let claim_all = |conns: Vec<sqlx::PgConnection>, end_each: bool| -> Vec<(sqlx::PgConnection, Vec<String>)> {
        on_each(&rt, conns, move |c, mut conn| async move {
            let mut kept = Vec::new();
            // Where this connection's last claim ended, as the worker's pick keeps it.
            let mut place: Option<(i64, String)> = None;
            loop {
                let (at, after) = place.clone().unwrap_or((i64::MIN, String::new()));
                let picked: Vec<(String, i64)> = sqlx::query_as(FLOOR_CLAIM)
                    .bind(format!("floor-{c}"))
                    .bind(now_ms())
                    .bind(at)
                    .bind(after)
                    .fetch_all(&mut conn)
                    .await
                    .expect("claim");
                if picked.is_empty() {
                    if place.take().is_some() {
                        continue;
                    }
                    break;
                }
                place = picked.iter().max_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0))).map(|(id, at)| (*at, id.clone()));
                let ids: Vec<String> = picked.into_iter().map(|(id, _)| id).collect();
                if end_each {
                    let ended = sqlx::query(FLOOR_END).bind(&ids).bind(now_ms()).execute(&mut conn).await.expect("end");
                    assert_eq!(ended.rows_affected() as usize, ids.len(), "every claimed run ends");
                } else {
                    kept.extend(ids);
                }
            }
            (conn, kept)
        })
    };
    let end_all = |claimed: Vec<(sqlx::PgConnection, Vec<String>)>| {
        on_each(&rt, claimed, |_, (mut conn, ids)| async move {
            for batch in ids.chunks(32) {
                let ended = sqlx::query(FLOOR_END).bind(batch).bind(now_ms()).execute(&mut conn).await.expect("end");
                assert_eq!(ended.rows_affected() as usize, batch.len(), "every claimed run ends");
            }
        })
    };
    if together {
        let left = floor_window(pm, n, "claims and ends", || claim_all(conns, true));
        assert!(left.iter().all(|(_, ids)| ids.is_empty()));
    } else {
        let claimed = floor_window(pm, n, "claims alone", || claim_all(conns, false));
        assert_eq!(claimed.iter().map(|(_, ids)| ids.len()).sum::<usize>(), n, "every run claimed once");
        floor_window(pm, n, "ends alone", || end_all(claimed));
    }
    assert_every_run_ended_once(url, n);
}

/// Runs `work`, and prints `what` it cost the server a run of `n`, and the runs a second.
fn floor_window<T>(pm: u32, n: usize, what: &str, work: impl FnOnce() -> T) -> T {
    let (before, started) = (server_cpu_ms(pm), Instant::now());
    let out = work();
    let (ms, wall) = (server_cpu_ms(pm) - before, started.elapsed());
    println!("{what}: {:.0} µs of the server a run, {:.0} runs/s", ms as f64 * 1000.0 / n as f64, n as f64 / wall.as_secs_f64());
    out
}

/// The floor's `n` runs at `url` all succeeded.
fn assert_every_run_ended_once(url: &str, n: usize) {
    let done = query(url, "SELECT count(*) FROM ll_runs WHERE status = 'succeeded'", |r| sqlx::Row::get::<i64, _>(r, 0))[0];
    assert_eq!(done, n as i64, "every run ended once");
}

/// The floor's database: the schema as the worker migrates it, `n` runs queued as the drain
/// queues them, vacuumed and analyzed, autovacuum off for the table; a runtime and `clients`
/// connections, open.
fn floor_queue(url: &str, n: usize, clients: usize) -> (tokio::runtime::Runtime, Vec<sqlx::PgConnection>) {
    let mut w = Worker::on_postgres_with(url, "", &jobs_yaml(1, "0 0 1 1 *", SAVE), 32);
    w.start();
    w.stop();
    query(url, "ALTER TABLE ll_runs SET (autovacuum_enabled = false)", |_| ());
    queue_drain_runs(url, n, None);
    query(url, "VACUUM ANALYZE ll_runs", |_| ());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(clients).enable_all().build().expect("runtime");
    let conns = rt.block_on(async {
        use sqlx::Connection;
        let mut conns = Vec::new();
        for _ in 0..clients {
            conns.push(sqlx::PgConnection::connect(url).await.expect("connect"));
        }
        conns
    });
    (rt, conns)
}

/// Runs `f` on each of `parts` (a connection, and what it works on) at once, with its index,
/// on `rt`; what each returned, in their order.
fn on_each<P, T, F, Fut>(rt: &tokio::runtime::Runtime, parts: Vec<P>, f: F) -> Vec<T>
where
    F: Fn(usize, P) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    rt.block_on(async {
        let tasks: Vec<_> = parts.into_iter().enumerate().map(|(c, part)| tokio::spawn(f(c, part))).collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("a connection's part"));
        }
        out
    })
}

/// The `floor` scenario's sketch of a claim that writes no row version of the run: one shared
/// place in the queue (a row of its own), moved past the 32 runs a claim takes, and one row a
/// claim naming them; the runs stay `queued` until their end, the one write of each, which
/// also drops the claim's row. Each connection claims and ends in turn. It measures what such
/// a design would cost the server, not a design: the runs handed over behind the place, the
/// takeover of a claim whose worker is gone, and every reader of `running` are not in it.
fn floor_offset(url: &str, n: usize, clients: usize, pm: u32, per_claim: usize) {
    println!(
        "\n== floor on PostgreSQL: {n} queued runs, {clients} connection(s), {per_claim} runs a claim ended 32 a statement, a claim that writes no row version of a run =="
    );
    let (rt, conns) = floor_queue(url, n, clients);
    query(url, "CREATE TABLE floor_place (at bigint NOT NULL, id text NOT NULL)", |_| ());
    query(url, "INSERT INTO floor_place VALUES (0, '')", |_| ());
    query(url, "CREATE TABLE floor_claims (claim bigserial PRIMARY KEY, worker text NOT NULL, runs text[] NOT NULL)", |_| ());
    const CLAIM: &str = "WITH place AS (SELECT at, id FROM floor_place FOR UPDATE),
             picked AS MATERIALIZED (
                 SELECT r.id, r.dispatched_at FROM ll_runs r, place
                 WHERE r.status = 'queued' AND r.dispatched_at IS NOT NULL AND (r.dispatched_at, r.id) > (place.at, place.id)
                 ORDER BY r.dispatched_at, r.id LIMIT $2),
             last AS (SELECT dispatched_at, id FROM picked ORDER BY dispatched_at DESC, id DESC LIMIT 1),
             moved AS (UPDATE floor_place SET at = last.dispatched_at, id = last.id FROM last),
             claimed AS (INSERT INTO floor_claims (worker, runs) SELECT $1, array_agg(id) FROM picked HAVING count(*) > 0 RETURNING claim, runs)
         SELECT claim, runs FROM claimed";
    // The last end of a claim's runs drops its row ($5).
    const END: &str = "WITH ended AS (UPDATE ll_runs SET status = 'succeeded', started_at = $3, finished_at = $3, worker = $4,
                                        next_run_id = '', outcome_seen = 1 WHERE id = ANY($1))
         DELETE FROM floor_claims WHERE claim = $2 AND $5";
    floor_window(pm, n, "claims and ends", || {
        on_each(&rt, conns, move |c, mut conn| async move {
            let worker = format!("floor-{c}");
            loop {
                let claim: Option<(i64, Vec<String>)> =
                    sqlx::query_as(CLAIM).bind(&worker).bind(per_claim as i64).fetch_optional(&mut conn).await.expect("claim");
                let Some((claim, ids)) = claim else { break };
                let batches = ids.chunks(32).count();
                for (i, batch) in ids.chunks(32).enumerate() {
                    let last = i + 1 == batches;
                    let ended = sqlx::query(END)
                        .bind(batch)
                        .bind(claim)
                        .bind(now_ms())
                        .bind(&worker)
                        .bind(last)
                        .execute(&mut conn)
                        .await
                        .expect("end");
                    assert_eq!(ended.rows_affected(), u64::from(last), "the claim's row dropped with its last runs' ends");
                }
            }
        })
    });
    assert_every_run_ended_once(url, n);
}

/// The floor's claim: up to 32 runs handed over after the connection's place (`$3`, `$4`; from
/// the head when it has none), in the hand-over index's order, locked (a materialized pick, as
/// the worker's, so it is run once), made running. The worker's claim also reads its lease,
/// clears the limit columns and returns every column of the run; this one returns its key.
const FLOOR_CLAIM: &str = "WITH picked AS MATERIALIZED (
         SELECT id FROM ll_runs WHERE status = 'queued' AND dispatched_at IS NOT NULL AND (dispatched_at, id) > ($3, $4)
         ORDER BY dispatched_at, id LIMIT 32 FOR UPDATE SKIP LOCKED)
     UPDATE ll_runs SET status = 'running', started_at = $2, worker = $1, epoch = 1
     WHERE id = ANY(ARRAY(SELECT id FROM picked))
     RETURNING id, dispatched_at";

/// The floor's end: runs made succeeded and noticed at their end (no rule, nobody after), found
/// by key alone (with `status = 'running'` beside the key, and every run claimed first, the
/// server chose the index of running runs and read all of them at each end).
const FLOOR_END: &str = "UPDATE ll_runs SET status = 'succeeded', finished_at = $2, next_run_id = '', outcome_seen = 1 WHERE id = ANY($1)";

fn query<T>(url: &str, sql: &str, row: impl Fn(&sqlx::postgres::PgRow) -> T) -> Vec<T> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let pool = sqlx::PgPool::connect(url).await.expect("connect");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(&pool).await.expect("query");
        pool.close().await;
        rows.iter().map(row).collect()
    })
}

/// (scheduled_at, due_at, started_at, finished_at, status) of every run.
type Row = (Option<i64>, i64, Option<i64>, Option<i64>, String);

fn runs(url: &str) -> Vec<Row> {
    use sqlx::Row;
    query(url, "SELECT scheduled_at, due_at, started_at, finished_at, status FROM ll_runs", |r| {
        (r.get("scheduled_at"), r.get("due_at"), r.get("started_at"), r.get("finished_at"), r.get("status"))
    })
}

fn burst(url: &str, seconds: u64) {
    let mut w = Worker::on_postgres(url, &jobs_yaml(1000, "*/10 * * * * *", SAVE), 1000);
    let ready = w.start();
    println!("\n== burst on PostgreSQL: 1,000 jobs due together every 10 s, concurrency 1000, {seconds} s ==");
    println!("start to ready: {} ms", ready.as_millis());
    std::thread::sleep(Duration::from_secs(seconds));
    let exit = w.stop();
    let r = runs(url);
    summary("start lateness ms", r.iter().filter_map(|x| Some(x.2? - x.1)).collect());
    let mut by_tick: std::collections::BTreeMap<i64, (i64, i64, usize)> = Default::default();
    for x in &r {
        if let (Some(t), Some(s)) = (x.0, x.2) {
            let e = by_tick.entry(t).or_insert((i64::MAX, i64::MIN, 0));
            e.0 = e.0.min(s);
            e.1 = e.1.max(s);
            e.2 += 1;
        }
    }
    println!("bursts: {} (runs per burst: {:?})", by_tick.len(), by_tick.values().map(|v| v.2).collect::<Vec<_>>());
    summary("burst spread ms (last start − first start)", by_tick.values().filter(|v| v.2 >= 900).map(|v| v.1 - v.0).collect());
    println!("SIGTERM to exit: {} ms", exit.as_millis());
}

fn sustained(url: &str, seconds: u64) {
    let mut w = Worker::on_postgres(url, &jobs_yaml(1000, "* * * * * *", SAVE), 1000);
    w.start();
    println!("\n== sustained on PostgreSQL: 1,000 jobs every second, concurrency 1000, {seconds} s ==");
    let began = now_ms();
    std::thread::sleep(Duration::from_secs(seconds));
    let exit = w.stop();
    let r = runs(url);
    let late = |from: i64, to: i64| -> Vec<i64> {
        r.iter().filter(|x| x.0.is_some_and(|t| t >= from && t < to)).filter_map(|x| Some(x.2? - x.1)).collect()
    };
    let end = began + seconds as i64 * 1000;
    summary("start lateness ms, whole run", r.iter().filter_map(|x| Some(x.2? - x.1)).collect());
    summary("start lateness ms, first 10 s", late(began, began + 10_000));
    summary("start lateness ms, last 10 s", late(end - 10_000, end));
    let ticks: std::collections::BTreeSet<i64> = r.iter().filter_map(|x| x.0).collect();
    let full = ticks.iter().filter(|t| r.iter().filter(|x| x.0 == Some(**t)).count() == 1000).count();
    let skipped = r.iter().filter(|x| x.4 == "skipped").count();
    let queued = r.iter().filter(|x| x.4 == "queued").count();
    println!("ticks: {} instants, {full} with all 1,000 jobs; runs {} (skipped {skipped}, queued at exit {queued})", ticks.len(), r.len());
    // Where the skips were, by the instant's second in the run: a run still going at its
    // job's next tick is skipped by the overlap policy.
    let mut skips: std::collections::BTreeMap<i64, usize> = Default::default();
    for x in r.iter().filter(|x| x.4 == "skipped") {
        *skips.entry((x.0.unwrap_or(began) - began) / 1000).or_default() += 1;
    }
    if !skips.is_empty() {
        println!("skipped runs by the second of their tick: {skips:?}");
    }
    println!("SIGTERM to exit: {} ms", exit.as_millis());
}

/// 1,000 per-second jobs on `workers` workers sharing `url`: what the window of `seconds` after
/// a warm-up cost the workers together and the server, and whether each tick in it ran once.
fn shares(url: &str, workers: usize, seconds: u64, pm: u32, history: usize, cron: &str) {
    let jobs = jobs_yaml(1000, cron, SAVE);
    let mut ws: Vec<Worker> = (0..workers).map(|_| Worker::on_postgres(url, &jobs, 1000)).collect();
    if history > 0 {
        // The first start applies the migrations; each job's kept runs ended a day ago, noticed.
        ws[0].start();
        ws[0].stop();
        let from = now_ms() - 86_400_000;
        query(
            url,
            &format!(
                "INSERT INTO ll_runs (id, job, trigger, status, scheduled_at, due_at, enqueued_at, attempt, started_at, finished_at, outcome_seen)
                 SELECT '0190a000-0000-7000-8000-' || lpad(i::text, 12, '0'), 'job-' || lpad((i % 1000)::text, 5, '0'), 'cron',
                        'succeeded', {from} + i, {from} + i, {from} + i, 1, {from} + i, {from} + i, 1
                 FROM generate_series(0, {} - 1) i",
                history * 1000
            ),
            |_| (),
        );
        query(url, "ANALYZE ll_runs", |_| ());
    }
    for w in &mut ws {
        w.start();
    }
    let kept = if history > 0 { format!(", {history} runs kept by each job from before") } else { String::new() };
    println!("\n== shares on PostgreSQL: 1,000 jobs on '{cron}', {workers} worker(s) of concurrency 1000{kept}, {seconds} s after 10 s ==");
    std::thread::sleep(Duration::from_secs(10));
    let statements = std::env::var("PG_EXTRA_OPTS").is_ok_and(|o| o.contains("pg_stat_statements"));
    if statements {
        query(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements", |_| ());
        query(url, "SELECT pg_stat_statements_reset()", |_| ());
    }
    let (from, cpu0, by0) = (now_ms(), ws.iter().map(|w| cpu_ms(w.pid())).collect::<Vec<_>>(), server_cpu_by_process(pm));
    let server0 = server_cpu_total(pm, &by0);
    std::thread::sleep(Duration::from_secs(seconds));
    let (to, cpu1, by1) = (now_ms(), ws.iter().map(|w| cpu_ms(w.pid())).collect::<Vec<_>>(), server_cpu_by_process(pm));
    let server1 = server_cpu_total(pm, &by1);
    let activity = server_activity(url);
    if statements {
        top_statements(url);
    }
    for w in &mut ws {
        w.stop();
    }
    let each: Vec<u64> = cpu0.iter().zip(&cpu1).map(|(a, b)| b - a).collect();
    let total: u64 = each.iter().sum();
    let secs = (to - from) as f64 / 1000.0;
    println!("workers' CPU over the window: {total} ms ({:.0} ms a second; each: {each:?})", total as f64 / secs);
    println!("the server's CPU over the window: {} ms ({:.0} ms a second)", server1 - server0, (server1 - server0) as f64 / secs);
    server_cpu_kinds(&activity, &by0, &by1);
    // Every tick of every job whose instant is inside the window: once, and run.
    let r = runs(url);
    let inside = |x: &&Row| x.0.is_some_and(|t| t >= from + 1000 && t < to - 1000);
    let mut per: std::collections::BTreeMap<i64, usize> = Default::default();
    for x in r.iter().filter(inside) {
        *per.entry(x.0.unwrap_or(0)).or_default() += 1;
    }
    let instants = per.len();
    let per_instant: Vec<usize> = per.into_values().collect();
    let mut not_run: std::collections::BTreeMap<&str, usize> = Default::default();
    for x in r.iter().filter(inside).filter(|x| x.4 != "succeeded") {
        *not_run.entry(x.4.as_str()).or_default() += 1;
    }
    println!(
        "ticks in the window: {instants} instants, runs per instant min {} max {}, not succeeded {} {not_run:?}",
        per_instant.iter().min().unwrap_or(&0),
        per_instant.iter().max().unwrap_or(&0),
        not_run.values().sum::<usize>()
    );
}

/// `n` queued runs drained by `workers` workers; `extra`'s statements (`;`-separated, or none)
/// are applied after the migrations.
fn drain(url: &str, n: usize, workers: usize, pm: u32, extra: &str) {
    drain_with(url, n, workers, pm, extra, None);
}

/// The drain with every run in `scheduling.limits.pool` of `limit` slots (none: no limit).
fn drain_limited(url: &str, n: usize, workers: usize, pm: u32, limit: Option<u32>) {
    drain_with(url, n, workers, pm, "", limit);
}

fn drain_with(url: &str, n: usize, workers: usize, pm: u32, extra: &str, limit: Option<u32>) {
    let action =
        "      plugin: file-read\n      action: read\n      parameters: { path: \"tiny.txt\" }\n      retention: { max_runs: 100000 }\n";
    let jobs = jobs_yaml(1, "0 0 1 1 *", action);
    let limits = limit.map(|n| format!("  limits:\n    pool: {n}\n")).unwrap_or_default();
    // `DRAIN_CONCURRENCY` (default 32, as graphile-worker's): each worker's concurrency.
    let concurrency = std::env::var("DRAIN_CONCURRENCY").ok().and_then(|c| c.parse().ok()).unwrap_or(32);
    let mut ws: Vec<Worker> = (0..workers).map(|_| Worker::on_postgres_with(url, &limits, &jobs, concurrency)).collect();
    // The first start applies the migrations.
    ws[0].start();
    ws[0].stop();
    for stmt in extra.split(';').filter(|s| !s.trim().is_empty()) {
        query(url, stmt, |_| ());
    }
    for w in &ws {
        std::fs::create_dir_all(w.dir.path().join("data")).expect("data dir");
        std::fs::write(w.dir.path().join("data/tiny.txt"), "ok").expect("tiny file");
    }
    queue_drain_runs(url, n, limit);
    // The statistics of a table that held its backlog a while, as autovacuum leaves them: the
    // server's choice between a statement's plans follows them (with the table's migrated,
    // empty statistics it chose differently from a real backlog's).
    query(url, "ANALYZE ll_runs", |_| ());
    let limited = limit.map_or_else(String::new, |n| format!(", every run in a limit of {n}"));
    println!(
        "\n== drain on PostgreSQL: {n} queued runs, {workers} worker(s) of concurrency {concurrency}, file-read of 2 bytes{limited} =="
    );
    // With `PG_EXTRA_OPTS='-c shared_preload_libraries=pg_stat_statements'`: where the
    // server's time went, statement by statement.
    let statements = std::env::var("PG_EXTRA_OPTS").is_ok_and(|o| o.contains("pg_stat_statements"));
    if statements {
        query(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements", |_| ());
        query(url, "SELECT pg_stat_statements_reset()", |_| ());
    }
    let server_before = server_cpu_ms(pm);
    let started = Instant::now();
    for w in &mut ws {
        w.start_recording();
    }
    loop {
        std::thread::sleep(Duration::from_millis(250));
        // Whether any is left, stopping at the first: a count of them took 25 ms a poll.
        let left =
            query(url, "SELECT EXISTS (SELECT 1 FROM ll_runs WHERE status IN ('queued', 'running'))", |r| sqlx::Row::get::<bool, _>(r, 0));
        if !left[0] || started.elapsed() > Duration::from_secs(600) {
            break;
        }
    }
    let cpu: u64 = ws.iter().map(|w| cpu_ms(w.pid())).sum();
    let server = server_cpu_ms(pm) - server_before;
    for w in &mut ws {
        w.stop();
    }
    let r = runs(url);
    let first = r.iter().filter_map(|x| x.2).min().unwrap_or(0);
    let last = r.iter().filter_map(|x| x.3).max().unwrap_or(0);
    let done = r.iter().filter(|x| x.4 == "succeeded").count();
    println!("succeeded {done}, other {}; first start → last finish {} ms", r.len() - done, last - first);
    println!("drain rate: {:.0} runs/s", done as f64 / ((last - first).max(1) as f64 / 1000.0));
    println!("workers' CPU (user + system, whole life): {cpu} ms, {:.0} µs per run", cpu as f64 * 1000.0 / done.max(1) as f64);
    println!("the server's CPU over the drain: {server} ms, {:.0} µs per run", server as f64 * 1000.0 / done.max(1) as f64);
    if statements {
        top_statements(url);
    }
    println!("the first worker's writes:");
    drain_stages(&ws[0].internal_events());
}

/// Queues `n` runs of the drain's one job, as a manual trigger of it inserts them: due, and
/// in `limit`'s line at once (`scheduling.limits.pool`) or, with none, in the queue at once.
fn queue_drain_runs(url: &str, n: usize, limit: Option<u32>) {
    let t0 = now_ms();
    let pools = if limit.is_some() { format!("'[[\"pool\",\"\"]]', 'pool', {t0}, NULL") } else { format!("NULL, NULL, NULL, {t0}") };
    query(
        url,
        &format!(
            "INSERT INTO ll_runs (id, job, trigger, status, due_at, enqueued_at, attempt, parameters, limits, limit_wait, limit_wait_since, dispatched_at)
             SELECT '0190b000-0000-7000-8000-' || lpad(i::text, 12, '0'), 'job-00000', 'manual', 'queued', {t0}, {t0}, 1,
                    '{{\"path\":\"tiny.txt\"}}', {pools}
             FROM generate_series(1, {n}) i"
        ),
        |_| (),
    );
}

/// With `PG_EXTRA_OPTS='-c shared_preload_libraries=pg_stat_statements'` and the extension
/// created and reset before: where the server's time went, statement by statement.
fn top_statements(url: &str) {
    let top = query(
        url,
        "SELECT calls, round(total_exec_time)::bigint, round(total_plan_time)::bigint, rows,
                left(regexp_replace(query, '\\s+', ' ', 'g'), 100)
         FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 20",
        |r| {
            use sqlx::Row;
            (r.get::<i64, _>(0), r.get::<i64, _>(1), r.get::<i64, _>(2), r.get::<i64, _>(3), r.get::<String, _>(4))
        },
    );
    // Planning is counted with `-c pg_stat_statements.track_planning=on` too.
    println!("the server's statements by time (calls, ms executing, ms planning, rows, statement):");
    for (calls, ms, plan, rows, q) in top {
        println!("  {calls:>7} {ms:>6} {plan:>6} {rows:>8}  {q}");
    }
}

/// Installs the peer (once, into a cache folder) and returns the folder: its `node` and the
/// driver `graphile_drain.mjs`.
fn graphile_install() -> std::path::PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/peer/graphile.sh");
    let out = std::process::Command::new("bash").arg(script).output().expect("bash");
    assert!(out.status.success(), "installing graphile-worker: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().into()
}

/// graphile-worker draining `n` no-op jobs with `processes` worker processes of concurrency 32
/// each, in `mode` (`default`, or `batched`: its local queue and batched completions).
fn graphile(peer: &std::path::Path, url: &str, n: usize, processes: usize, mode: &str, pm: u32) {
    let node = |args: &[&str]| {
        let mut c = std::process::Command::new(peer.join("node_modules/.bin/node"));
        c.arg(peer.join("graphile_drain.mjs")).args(args);
        c
    };
    let out = node(&["queue", url, &n.to_string()]).output().expect("node");
    assert!(out.status.success(), "queueing graphile-worker jobs: {}", String::from_utf8_lossy(&out.stderr));
    println!("\n-- peer: graphile-worker 0.18 ({mode}), {n} queued no-op jobs, {processes} process(es) of concurrency 32 --");
    let server_before = server_cpu_ms(pm);
    // The worker processes' own CPU: what this process's waited-for children used.
    let peer_before = own_children_cpu_ms();
    let children: Vec<std::process::Child> =
        (0..processes).map(|_| node(&["work", url, "32", mode]).stdout(std::process::Stdio::piped()).spawn().expect("node")).collect();
    let (mut done, mut first, mut last) = (0i64, i64::MAX, 0i64);
    for child in children {
        let out = child.wait_with_output().expect("graphile-worker");
        assert!(out.status.success(), "graphile-worker failed");
        // Its last line (graphile-worker logs to stdout before it).
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no summary line in:\n{text}"));
        let v: serde_json::Value = serde_json::from_str(line).expect("its summary line");
        let get = |k: &str| v[k].as_i64().unwrap_or(0);
        done += get("done");
        if get("done") > 0 {
            first = first.min(get("first"));
            last = last.max(get("last"));
        }
    }
    let server = server_cpu_ms(pm) - server_before;
    let peer_cpu = own_children_cpu_ms() - peer_before;
    println!("done {done}; first start → last end {} ms", last - first);
    println!("drain rate: {:.0} jobs/s", done as f64 / ((last - first).max(1) as f64 / 1000.0));
    println!(
        "the server's CPU over the drain (with the processes' start and end): {server} ms, {:.0} µs per job",
        server as f64 * 1000.0 / done.max(1) as f64
    );
    println!(
        "the worker processes' CPU (user + system, whole life): {peer_cpu} ms, {:.0} µs per job",
        peer_cpu as f64 * 1000.0 / done.max(1) as f64
    );
}

/// CPU time (user + system, ms) of this process's children that have exited and been waited
/// for.
fn own_children_cpu_ms() -> u64 {
    let st = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    stat_fields(&st).children_ms
}

/// CPU time (user + system, ms) the PostgreSQL server of postmaster `pm` has used: the
/// postmaster's, its live children's, and its children's that have exited (a backend whose
/// client went).
fn server_cpu_ms(pm: u32) -> u64 {
    server_cpu_total(pm, &server_cpu_by_process(pm))
}

/// [`server_cpu_ms`] with its live children's CPU as [`server_cpu_by_process`] read it.
fn server_cpu_total(pm: u32, children: &std::collections::BTreeMap<u32, u64>) -> u64 {
    // The postmaster outlives every measurement: unreadable, the figure would be a false zero.
    let st = std::fs::read_to_string(format!("/proc/{pm}/stat"))
        .unwrap_or_else(|e| panic!("the server's CPU time: cannot read /proc/{pm}/stat (did PostgreSQL stop?): {e}"));
    let own = stat_fields(&st);
    own.utime_ms + own.stime_ms + own.children_ms + children.values().sum::<u64>()
}

/// CPU time (ms) of each live child of postmaster `pm`, by pid.
fn server_cpu_by_process(pm: u32) -> std::collections::BTreeMap<u32, u64> {
    let mut by = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            let f = stat_fields(&st);
            if f.ppid == pm {
                by.insert(pid, f.utime_ms + f.stime_ms);
            }
        }
    }
    by
}

/// What each of the server's processes is, by pid: its backend type and what it last ran.
fn server_activity(url: &str) -> std::collections::BTreeMap<u32, String> {
    query(
        url,
        "SELECT pid, coalesce(backend_type, '') || ': ' || left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 40) FROM pg_stat_activity",
        |r| {
            use sqlx::Row;
            (r.get::<i32, _>(0) as u32, r.get::<String, _>(1))
        },
    )
    .into_iter()
    .collect()
}

/// Where the server's CPU between `before` and `after` went, by kind of process: a
/// background process by its title, a client's backend by what it last ran (`LISTEN` for a
/// worker's notification connection), a backend that came or went in between as such.
fn server_cpu_kinds(
    activity: &std::collections::BTreeMap<u32, String>,
    before: &std::collections::BTreeMap<u32, u64>,
    after: &std::collections::BTreeMap<u32, u64>,
) {
    let mut kinds: std::collections::BTreeMap<String, (u64, usize)> = Default::default();
    for (pid, ms) in after {
        let kind = match before.get(pid) {
            None => format!("(started in the window) {}", activity.get(pid).map_or("", String::as_str)),
            Some(_) => activity.get(pid).cloned().unwrap_or_else(|| "(not in pg_stat_activity)".into()),
        };
        let e = kinds.entry(kind).or_default();
        e.0 += ms - before.get(pid).copied().unwrap_or(0);
        e.1 += 1;
    }
    let gone: u64 = before.iter().filter(|(p, _)| !after.contains_key(p)).count() as u64;
    println!(
        "the server's CPU by process kind (ms over the window, processes){}:",
        if gone > 0 { format!(" ({gone} exited meanwhile)") } else { String::new() }
    );
    let mut sorted: Vec<_> = kinds.into_iter().collect();
    sorted.sort_by_key(|(_, (ms, _))| std::cmp::Reverse(*ms));
    for (kind, (ms, n)) in sorted {
        println!("  {ms:>7} {n:>3}  {kind}");
    }
}
