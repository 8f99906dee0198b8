//! Jobs that work together (SPEC §4a): jobs that run after others, once per upstream outcome,
//! with the upstream runs in their input — across kill -9 too.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Worker, sql_lines};

/// (run id, the upstream run id in its input) of each run of `job` with trigger `after`.
fn after_runs(w: &Worker, job: &str, upstream: &str) -> Vec<(String, String)> {
    let sql = format!(
        "SELECT id || ' ' || coalesce(json_extract(input, '$.upstream.{upstream}.run_id'), '-') FROM ll_runs \
         WHERE job = '{job}' AND trigger = 'after' ORDER BY id"
    );
    let text = sql_lines(&w.db(), &sql).unwrap_or_else(|e| panic!("{e}\n{}", w.log()));
    text.lines().filter_map(|l| l.split_once(' ')).map(|(a, b)| (a.to_owned(), b.to_owned())).collect()
}

fn ids(w: &Worker, job: &str, status: &str) -> Vec<String> {
    let mut v: Vec<String> = w.runs().into_iter().filter(|r| r.job == job && r.status == status).map(|r| r.id).collect();
    v.sort();
    v
}

/// Each upstream run that counts has exactly one downstream run, whose input names it.
fn exactly_once(w: &Worker, job: &str, upstream: &str, counted: &[String]) {
    let runs = after_runs(w, job, upstream);
    let mut by_upstream: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, up) in &runs {
        *by_upstream.entry(up.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = by_upstream.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{job}: an upstream outcome ran it twice: {twice:?}");
    let used: Vec<&str> = by_upstream.keys().copied().collect();
    let counted: Vec<&str> = counted.iter().map(String::as_str).collect();
    assert_eq!(used, counted, "{job}: one run per counted outcome of {upstream}");
}

const CHAIN: &str = "extract:
  type: plugin
  plugin: shell-exec
  action: run
  every: 1s
  retries: {max: 0}
  parameters: {command: \"test ! -f FAIL\"}
load:
  after: [extract]
  type: plugin
  plugin: file-save
  action: save
  input: {table: sales}
  parameters: {path: load.txt, content: l}
alarm:
  after: {jobs: [extract], on: failure}
  type: plugin
  plugin: file-save
  action: save
  parameters: {path: alarm.txt, content: a}
a:
  type: plugin
  plugin: file-save
  action: save
  parameters: {path: a.txt, content: a}
b:
  type: plugin
  plugin: file-save
  action: save
  parameters: {path: b.txt, content: b}
sum:
  after: {jobs: [a, b], within: 1h}
  type: plugin
  plugin: file-save
  action: save
  parameters: {path: sum.txt, content: s}";

/// A chain on SQLite: `load` runs once after each success of `extract`, `alarm` once after
/// each failure, each with the upstream run in its input; `sum` runs once both `a` and `b`
/// have a new outcome; `jobs show` says what each waits for and what runs after it.
#[test]
fn jobs_run_after_each_qualifying_upstream_outcome_once() {
    let fail = tempfile::tempdir().unwrap();
    let flag = fail.path().join("fail");
    let mut w = Worker::new(&CHAIN.replace("FAIL", &flag.display().to_string()));
    w.start();
    w.wait_for("three extracts", Duration::from_secs(15), |r| {
        r.iter().filter(|r| r.job == "extract" && r.status == "succeeded").count() >= 3
    });
    std::fs::write(&flag, "").unwrap();
    w.wait_for("two failed extracts", Duration::from_secs(15), |r| {
        r.iter().filter(|r| r.job == "extract" && r.status == "failed").count() >= 2
    });
    std::fs::remove_file(&flag).unwrap();
    let before = w.runs().iter().filter(|r| r.job == "extract" && r.status == "succeeded").count();
    w.wait_for("extract to succeed again", Duration::from_secs(15), |r| {
        r.iter().filter(|r| r.job == "extract" && r.status == "succeeded").count() > before
    });
    assert_eq!(w.ctl(&["jobs", "pause", "extract"]).0, 0);
    // Settled: every ended extract run noticed, and what it started ended.
    crate::support::poll(
        "every outcome of extract to be followed",
        Duration::from_secs(15),
        || {
            let ok = ids(&w, "extract", "succeeded").len() == after_runs(&w, "load", "extract").len()
                && ids(&w, "extract", "failed").len() == after_runs(&w, "alarm", "extract").len()
                && !w.runs().iter().any(|r| matches!(r.status.as_str(), "queued" | "running"));
            ok.then_some(())
        },
        || format!("runs: {:#?}\n{}", w.runs(), w.log()),
    );
    exactly_once(&w, "load", "extract", &ids(&w, "extract", "succeeded"));
    exactly_once(&w, "alarm", "extract", &ids(&w, "extract", "failed"));
    assert!(w.runs().iter().filter(|r| r.job == "load").all(|r| r.status == "succeeded" && r.trigger == "after"));
    let input = sql_lines(&w.db(), "SELECT input FROM ll_runs WHERE job = 'load' LIMIT 1").unwrap();
    let input: Value = serde_json::from_str(&input).unwrap();
    assert_eq!(input["table"], "sales", "the job's own input is kept: {input}");
    assert_eq!(input["upstream"]["extract"]["status"], "succeeded", "{input}");

    // Fan-in: a alone waits (and says for what); b completes the set: one run.
    let (code, out, err) = w.ctl(&["jobs", "trigger", "a", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    // a's outcome is noticed just after its end (the notice pass): looked at until it is.
    let (out, sum) = crate::support::poll(
        "a's outcome to be noticed for sum",
        Duration::from_secs(10),
        || {
            let (_, out, _) = w.ctl(&["jobs", "show", "sum", "-o", "json"]);
            let sum: Value = serde_json::from_str(&out).ok()?;
            sum["after"]["pending"].as_array().is_some_and(|p| !p.is_empty()).then_some((out, sum))
        },
        || w.log(),
    );
    assert_eq!(sum["schedule"], "after a, b within 1h", "{out}");
    assert_eq!(sum["after"]["waiting_for"], serde_json::json!(["b"]), "{out}");
    assert_eq!(sum["after"]["pending"][0]["job"], "a", "{out}");
    let (_, table, _) = w.ctl(&["jobs", "show", "sum"]);
    assert!(table.contains("upstream:") && table.contains("waits for b"), "{table}");
    assert!(after_runs(&w, "sum", "a").is_empty());
    let (code, out, err) = w.ctl(&["jobs", "trigger", "b", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    w.wait_for("sum to run once", Duration::from_secs(10), |r| r.iter().any(|r| r.job == "sum" && r.status == "succeeded"));
    let sums = after_runs(&w, "sum", "b");
    assert_eq!(sums.len(), 1, "{sums:?}");
    let (_, out, _) = w.ctl(&["jobs", "show", "extract", "-o", "json"]);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["downstream"], serde_json::json!(["alarm", "load"]), "{out}");
}

/// Exactly once across kill -9: the worker is killed three times while `extract` runs every
/// second; after each restart the outcomes not yet followed are, and none twice.
#[test]
fn after_runs_are_started_once_per_outcome_across_kill_9() {
    let mut w = Worker::new(&CHAIN.replace("FAIL", "/nonexistent/never"));
    w.start();
    let mut kills = 0;
    for round in 1..=3 {
        w.wait_for("extracts this round", Duration::from_secs(20), |r| {
            r.iter().filter(|r| r.job == "extract" && r.status == "succeeded").count() >= 2 * round
        });
        w.signal("KILL");
        assert_eq!(w.wait_exit(Duration::from_secs(10)), None, "killed by the signal");
        kills += 1;
        w.start();
    }
    assert_eq!(kills, 3);
    w.wait_for("extract after the last restart", Duration::from_secs(20), |r| {
        r.iter().filter(|r| r.job == "extract" && r.status == "succeeded").count() >= 8
    });
    assert_eq!(w.ctl(&["jobs", "pause", "extract"]).0, 0);
    crate::support::poll(
        "every success of extract to be followed",
        Duration::from_secs(15),
        || (ids(&w, "extract", "succeeded").len() == after_runs(&w, "load", "extract").len()).then_some(()),
        || format!("runs: {:#?}\n{}", w.runs(), w.log()),
    );
    exactly_once(&w, "load", "extract", &ids(&w, "extract", "succeeded"));
    // Interrupted by the kills, extract runs are failures: alarm followed each once.
    exactly_once(&w, "alarm", "extract", &{
        let mut failed = ids(&w, "extract", "interrupted");
        failed.extend(ids(&w, "extract", "failed"));
        failed.sort();
        failed
    });
}

/// Runtime jobs take `after` as file jobs do: one naming a job that does not exist, or closing
/// a cycle, is refused naming the field; one whose upstream is deleted is shown unavailable,
/// saying why, rather than waiting for ever.
#[test]
fn runtime_jobs_run_after_others_and_their_mistakes_are_refused() {
    let mut w = Worker::new("");
    w.write_config(
        "extract:\n  type: plugin\n  plugin: file-save\n  action: save\n  parameters: {path: e.txt, content: e}",
        "manage_jobs:\n  enabled: true\n",
    );
    w.start();
    let def = |name: &str, text: &str| {
        let file = w.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, format!("{text}\nplugin: file-save\naction: save\nparameters: {{path: {name}.txt, content: x}}\n")).unwrap();
        file.display().to_string()
    };
    let create = |name: &str, text: &str| w.ctl(&["jobs", "create", name, "-f", &def(name, text)]);
    let (code, out, err) = create("load", "after: [extract]");
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = create("bad", "after: [extrakt]");
    assert_ne!(code, 0);
    assert!(err.contains("after: names job \"extrakt\", which is not defined (did you mean \"extract\"?)"), "{err}");
    let (code, out, err) = create("report", "after: [load]");
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = w.ctl(&["jobs", "edit", "load", "-f", &def("load", "after: [report]")]);
    assert_ne!(code, 0);
    assert!(err.contains("after: makes a cycle: load → report → load"), "{err}");

    let (code, out, err) = w.ctl(&["jobs", "trigger", "extract", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    w.wait_for("load, then report", Duration::from_secs(10), |r| {
        ["load", "report"].iter().all(|j| r.iter().any(|r| r.job == *j && r.trigger == "after" && r.status == "succeeded"))
    });
    assert_eq!(after_runs(&w, "report", "load").len(), 1);

    let (code, out, err) = w.ctl(&["jobs", "delete", "load"]);
    assert_eq!(code, 0, "{out}{err}");
    let (_, out, _) = w.ctl(&["jobs", "show", "report", "-o", "json"]);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["disabled"], "job \"report\": after names job \"load\", which is not defined", "{out}");
}

/// Each command of a run that takes a limit writes `<pid> S|E <ns> <label>` to `trace`.
fn traced(trace: &std::path::Path, label: &str, hold: &str) -> String {
    format!(
        "echo \\\"$$ S $(date +%s%N) {label}\\\" >> {t}; sleep {hold}; echo \\\"$$ E $(date +%s%N) {label}\\\" >> {t}",
        t = trace.display()
    )
}

/// The intervals (start, end, label) the trace holds, by start.
pub(crate) fn intervals(trace: &std::path::Path) -> Vec<(i64, i64, String)> {
    let text = std::fs::read_to_string(trace).unwrap_or_else(|e| panic!("cannot read {}: {e}", trace.display()));
    let mut by_pid: BTreeMap<String, (Option<i64>, Option<i64>, String)> = BTreeMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [pid, mark, ns, label] = parts[..] else { panic!("a bad trace line {line:?}") };
        let e = by_pid.entry(pid.to_owned()).or_insert((None, None, label.to_owned()));
        let ns: i64 = ns.parse().unwrap_or_else(|_| panic!("a bad time in {line:?}"));
        if mark == "S" { e.0 = Some(ns) } else { e.1 = Some(ns) }
    }
    let mut out: Vec<(i64, i64, String)> = by_pid
        .into_values()
        .map(|(s, e, label)| (s.expect("a start"), e.unwrap_or_else(|| panic!("{label} started and never ended")), label))
        .collect();
    out.sort();
    out
}

/// No two of these intervals overlap.
pub(crate) fn one_at_a_time(intervals: &[(i64, i64, String)]) {
    for w in intervals.windows(2) {
        assert!(w[1].0 >= w[0].1, "two runs held the one slot at once: {:?} and {:?}", w[0], w[1]);
    }
}

/// Limits on SQLite: two jobs sharing a limit of 1 never run at once and both make progress;
/// a run that waits says for what and who holds the slot (`runs list`, `runs show`, `limits
/// list`); a keyed limit holds one run per key; runtime jobs take limits, and an unknown one is
/// refused with a did-you-mean.
#[test]
fn runs_that_share_a_limit_take_turns_and_say_what_they_wait_for() {
    let traces = tempfile::tempdir().unwrap();
    let (trace, keyed) = (traces.path().join("warehouse"), traces.path().join("tenant"));
    let jobs = format!(
        "ja:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  limits: [warehouse]\n  overlap: allow\n  parameters: {{command: \"{a}\"}}\n\
         jb:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  limits: [warehouse]\n  overlap: allow\n  parameters: {{command: \"{b}\"}}\n\
         sync:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  limits: [{{name: tenant, key: \"${{input.tenant}}\"}}]\n  overlap: allow\n  parameters: {{command: \"{k}\"}}",
        a = traced(&trace, "ja", "0.4"),
        b = traced(&trace, "jb", "0.4"),
        k = traced(&keyed, "sync", "1.5"),
    );
    let mut w = Worker::new("");
    w.write_scheduling("", "limits:\n  warehouse: 1\n  tenant: 1", &jobs, "manage_jobs:\n  enabled: true\n");
    w.start();
    let mut triggered = Vec::new();
    for job in ["ja", "jb", "ja", "jb", "ja", "jb"] {
        let (code, out, err) = w.ctl(&["jobs", "trigger", job, "-o", "json"]);
        assert_eq!(code, 0, "{out}{err}");
        triggered.push(serde_json::from_str::<Value>(&out).unwrap()["run_id"].as_str().unwrap().to_owned());
    }
    // While one holds the slot, the others wait, saying so.
    let (out, waiting) = crate::support::poll(
        "a run to wait for the warehouse",
        Duration::from_secs(10),
        || {
            let (_, out, _) = w.ctl(&["runs", "list", "-o", "json"]);
            let page: Value = serde_json::from_str(&out).ok()?;
            let waiting = page["runs"].as_array()?.iter().find(|r| r["waiting_for"].is_string())?.clone();
            Some((out, waiting))
        },
        || w.log(),
    );
    let id = waiting["id"].as_str().unwrap();
    assert_eq!(waiting["status"], "queued", "{out}");
    let why = waiting["waiting_for"].as_str().unwrap();
    assert!(why.starts_with("waiting for limit \"warehouse\": 1 of 1 held by "), "{why}");
    let (_, shown, _) = w.ctl(&["runs", "show", id]);
    assert!(shown.contains("waiting") && shown.contains("limit \"warehouse\""), "{shown}");
    let (_, table, _) = w.ctl(&["runs", "list"]);
    assert!(table.contains("waiting for limit \"warehouse\""), "{table}");
    let (code, out, err) = w.ctl(&["limits", "list", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let limits: Value = serde_json::from_str(&out).unwrap();
    let warehouse = limits["limits"].as_array().unwrap().iter().find(|l| l["name"] == "warehouse").expect("warehouse listed").clone();
    assert_eq!(warehouse["slots"], 1, "{out}");
    assert!(warehouse["held"].as_u64() <= Some(1) && warehouse["waiting"].as_u64() >= Some(1), "{out}");
    let (_, table, _) = w.ctl(&["limits", "list"]);
    assert!(table.contains("LIMIT") && table.contains("warehouse"), "{table}");

    w.wait_for("the six runs to end", Duration::from_secs(30), |r| {
        triggered.iter().all(|id| r.iter().any(|r| &r.id == id && r.status == "succeeded"))
    });
    let runs = intervals(&trace);
    assert_eq!(runs.len(), 6, "{runs:?}");
    one_at_a_time(&runs);
    assert_eq!(runs.iter().filter(|r| r.2 == "ja").count(), 3, "both jobs ran all of theirs");

    // Keyed: acme's two runs take turns, bolt's runs beside acme's first.
    for tenant in ["acme", "acme", "bolt"] {
        let input = format!("{{\"tenant\":\"{tenant}\"}}");
        let (code, out, err) = w.ctl(&["jobs", "trigger", "sync", "--input", &input]);
        assert_eq!(code, 0, "{out}{err}");
    }
    w.wait_for("the three syncs to end", Duration::from_secs(30), |r| {
        r.iter().filter(|r| r.job == "sync" && r.status == "succeeded").count() == 3
    });
    let tenant_of = sql_lines(&w.db(), "SELECT json_extract(input, '$.tenant') || ' ' || started_at || ' ' || finished_at FROM ll_runs WHERE job = 'sync' ORDER BY started_at").unwrap();
    let spans: Vec<(String, i64, i64)> = tenant_of
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            (p[0].to_owned(), p[1].parse().unwrap(), p[2].parse().unwrap())
        })
        .collect();
    let acme: Vec<&(String, i64, i64)> = spans.iter().filter(|s| s.0 == "acme").collect();
    assert!(acme[1].1 >= acme[0].2, "acme's runs took turns: {spans:?}");
    let bolt = spans.iter().find(|s| s.0 == "bolt").unwrap();
    assert!(bolt.1 < acme[0].2, "bolt did not wait for acme's key: {spans:?}");

    // Runtime jobs take limits as files do.
    let file = w.dir.path().join("etl.yaml");
    std::fs::write(&file, "plugin: file-save\naction: save\nlimits: [warehose]\nparameters: {path: e.txt, content: e}\n").unwrap();
    let (code, _, err) = w.ctl(&["jobs", "create", "etl", "-f", &file.display().to_string()]);
    assert_ne!(code, 0);
    assert!(
        err.contains("limits names limit \"warehose\", which scheduling.limits does not define (did you mean \"warehouse\"?)"),
        "{err}"
    );
    std::fs::write(&file, "plugin: file-save\naction: save\nlimits: [warehouse]\nparameters: {path: e.txt, content: e}\n").unwrap();
    let (code, out, err) = w.ctl(&["jobs", "create", "etl", "-f", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = w.ctl(&["jobs", "trigger", "etl", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    let taken = sql_lines(&w.db(), "SELECT limits FROM ll_runs WHERE job = 'etl'").unwrap();
    assert_eq!(taken.trim(), "[[\"warehouse\",\"\"]]", "the runtime job's run took the warehouse");
}

/// A workflow step's limits on SQLite: the runs do their first steps side by side, take turns
/// at the step that holds the GPU (the run that waits is queued again, saying for what, and
/// resumes at that step without doing the first again), and give the slot back when the step
/// ends, not when the run does.
#[test]
fn a_workflow_step_holds_its_limit_only_while_it_runs() {
    let traces = tempfile::tempdir().unwrap();
    let trace = traces.path().join("steps");
    let step = |id: &str, hold: &str, limits: &str| {
        format!(
            "      - id: {id}\n        type: plugin\n        plugin: shell-exec\n        action: run\n{limits}        parameters: {{command: \"{c}\"}}\n",
            c = traced(&trace, id, hold)
        )
    };
    let top = format!(
        "workflows:\n  render:\n    steps:\n{}{}{}",
        step("prep", "0.6", ""),
        step("paint", "0.5", "        limits: [gpu]\n"),
        step("post", "0.8", "")
    );
    let mut w = Worker::new("");
    w.write_scheduling(&top, "limits:\n  gpu: 1", "render:\n  workflow: render\n  overlap: allow", "");
    w.start();
    let mut triggered = Vec::new();
    for _ in 0..3 {
        let (code, out, err) = w.ctl(&["jobs", "trigger", "render", "-o", "json"]);
        assert_eq!(code, 0, "{out}{err}");
        triggered.push(serde_json::from_str::<Value>(&out).unwrap()["run_id"].as_str().unwrap().to_owned());
    }
    // A run at the GPU step while another holds the slot is queued again, and says why.
    let (out, waiting) = crate::support::poll(
        "a run to wait for the gpu at its step",
        Duration::from_secs(15),
        || {
            let (_, out, _) = w.ctl(&["runs", "list", "-o", "json"]);
            let page: Value = serde_json::from_str(&out).ok()?;
            let waiting = page["runs"].as_array()?.iter().find(|r| r["waiting_for"].is_string())?.clone();
            Some((out, waiting))
        },
        || w.log(),
    );
    assert_eq!(waiting["status"], "queued", "{out}");
    let why = waiting["waiting_for"].as_str().unwrap();
    assert!(why.starts_with("waiting for limit \"gpu\": 1 of 1 held by "), "{why}");
    let (_, shown, _) = w.ctl(&["runs", "show", waiting["id"].as_str().unwrap()]);
    assert!(shown.contains("prep") && shown.contains("succeeded"), "its first step is done: {shown}");

    w.wait_for("the three runs to end", Duration::from_secs(40), |r| {
        triggered.iter().all(|id| r.iter().any(|r| &r.id == id && r.status == "succeeded"))
    });
    let steps = intervals(&trace);
    let of = |label: &str| steps.iter().filter(|s| s.2 == label).cloned().collect::<Vec<_>>();
    let (prep, paint, post) = (of("prep"), of("paint"), of("post"));
    assert_eq!((prep.len(), paint.len(), post.len()), (3, 3, 3), "each step once a run, none again on resume: {steps:?}");
    one_at_a_time(&paint);
    assert!(prep[1].0 < prep[0].1 && prep[2].0 < prep[0].1, "the first steps ran side by side: {prep:?}");
    // A run's post step comes after its paint step: one beside another's paint means the
    // slot was given back when the step ended.
    assert!(
        post.iter().any(|p| paint.iter().any(|g| p.0 < g.1 && g.0 < p.1)),
        "the GPU was held until the runs ended: paint {paint:?}, post {post:?}"
    );
    let (code, out, err) = w.ctl(&["limits", "list", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let limits: Value = serde_json::from_str(&out).unwrap();
    let gpu = limits["limits"].as_array().unwrap().iter().find(|l| l["name"] == "gpu").expect("gpu listed").clone();
    assert_eq!((gpu["held"].as_u64(), gpu["waiting"].as_u64()), (Some(0), Some(0)), "{out}");
    let left = sql_lines(&w.db(), "SELECT CAST(count(*) AS TEXT) FROM ll_run_limits").unwrap();
    assert_eq!(left.trim(), "0", "no slot row outlives its step");
}
