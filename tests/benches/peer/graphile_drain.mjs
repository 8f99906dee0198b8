// The peer of the PostgreSQL drain bench (benches/postgres.rs): graphile-worker 0.18, on the
// same throwaway cluster, draining the same number of no-op jobs.
//
//   node graphile_drain.mjs queue URL N                  installs its schema, queues N jobs
//   node graphile_drain.mjs work URL CONCURRENCY MODE    works until the queue is empty
//
// MODE `default`: graphile-worker's defaults. MODE `batched`: a local queue of 100 jobs
// fetched at once, and completions sent in batches (its documented high-throughput settings).
// `work` prints one JSON line: {"done": jobs it ran, "first": ms of its first start, "last": ms
// of its last end}.
import { makeWorkerUtils, run } from "graphile-worker";

const [mode, connectionString, a, b] = process.argv.slice(2);

if (mode === "queue") {
  const n = Number(a);
  const utils = await makeWorkerUtils({ connectionString });
  await utils.migrate();
  const specs = Array.from({ length: n }, () => ({ identifier: "noop", payload: {} }));
  for (let i = 0; i < specs.length; i += 5000) {
    await utils.addJobs(specs.slice(i, i + 5000));
  }
  // The statistics of a table that held its backlog a while, as autovacuum leaves them (the
  // Lamplighter drain analyzes its table too): prepared statements' plans follow them.
  await utils.withPgClient((c) => c.query("ANALYZE graphile_worker._private_jobs"));
  await utils.release();
} else if (mode === "work") {
  const concurrency = Number(a);
  const batched = b === "batched";
  let done = 0;
  let first = 0;
  let last = 0;
  const preset = batched
    ? { worker: { localQueue: { size: 100 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } }
    : { worker: {} };
  const runner = await run({
    connectionString,
    concurrency,
    noHandleSignals: true,
    pollInterval: 1000,
    preset,
    taskList: {
      noop: async () => {
        if (first === 0) first = Date.now();
        done += 1;
        last = Date.now();
      },
    },
  });
  const utils = await makeWorkerUtils({ connectionString });
  // Until no job is left (queued or locked): then this process is done.
  for (;;) {
    await new Promise((r) => setTimeout(r, 100));
    const { rows } = await utils.withPgClient((c) => c.query("SELECT count(*)::int AS n FROM graphile_worker.jobs"));
    if (rows[0].n === 0) break;
  }
  await runner.stop();
  await utils.release();
  console.log(JSON.stringify({ done, first, last }));
} else {
  console.error("usage: graphile_drain.mjs queue URL N | work URL CONCURRENCY default|batched");
  process.exit(2);
}
