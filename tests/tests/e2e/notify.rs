//! Being told, on the real binaries: notifications reach a real HTTP receiver once per event
//! (failure after N in a row, recovery) with the fields a receiver needs; a receiver that is
//! down at first, and a worker killed with SIGKILL before it could send, still get it sent
//! once; notifications that run a workflow and an agent (scripted provider); `runs follow`
//! showing a command's output before the command ends; the exit codes of `follow` and `--wait`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use lamplighter_tests::llm::{Reply, ScriptedLlm, messages};
use lamplighter_tests::webhook::Receiver;
use serde_json::Value;

use crate::support::{Worker, ctl_bin, free_port, poll};

/// A shell job that fails its first `fails` runs, then succeeds (a counter in its working
/// directory), with `notify` (YAML flow) as its rules and no retries.
fn flaky(name: &str, fails: u32, notify: &str) -> String {
    format!(
        "{name}:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  retries: {{max: 0}}\n  parameters: {{command: \"echo x >> n-{name}; test $(wc -l < n-{name}) -gt {fails}\"}}\n  notify: {notify}\n"
    )
}

/// (event, status, attempts) of every notification, oldest first.
fn notifications(w: &Worker) -> Vec<(String, String, i64)> {
    let sql = "SELECT event || '|' || status || '|' || attempts FROM ll_notifications ORDER BY created_at, key";
    let rows = crate::support::sql_lines(&w.db(), sql).unwrap_or_else(|e| panic!("{e}\nlog:\n{}", w.log()));
    rows.lines()
        .map(|l| {
            let p: Vec<&str> = l.split('|').collect();
            (p[0].to_owned(), p[1].to_owned(), p[2].parse().unwrap_or(-1))
        })
        .collect()
}

#[test]
fn a_failure_streak_and_its_recovery_reach_a_webhook_once_each() {
    let hook = Receiver::start();
    let notify = format!(
        "[{{on: failure, after_consecutive: 2, to: {{webhook: {{url: \"{}\", headers: {{Authorization: \"Bearer ${{HOOK_TOKEN}}\"}}}}}}}}, {{on: recovery, to: {{webhook: \"{}\"}}}}]",
        hook.url("/hook"),
        hook.url("/recovered")
    );
    let mut w = Worker::new(&flaky("flaky", 2, &notify));
    w.env.push(("HOOK_TOKEN".into(), "s3cret".into()));
    w.start();
    // Two failures (exit 4: failed), then a success (exit 0).
    for expected in [4, 4, 0] {
        let (code, out, err) = w.ctl(&["jobs", "trigger", "flaky", "--wait"]);
        assert_eq!(code, expected, "{out}{err}");
    }
    let got = hook.wait_for(2, Duration::from_secs(20)).unwrap_or_else(|got| panic!("two notifications, got {got:?}\n{}", w.log()));
    let got: Vec<_> = ["/hook", "/recovered"]
        .iter()
        .map(|p| got.iter().find(|r| r.path == *p).unwrap_or_else(|| panic!("nothing at {p}: {got:?}")).clone())
        .collect();
    let runs = w.runs();
    assert_eq!(runs.iter().filter(|r| r.job == "flaky").count(), 3);
    let (failure, recovery) = (&got[0], &got[1]);
    assert_eq!(failure.path, "/hook");
    assert_eq!(failure.header("authorization"), Some("Bearer s3cret"), "the header, its ${{ENV}} filled in");
    let b = &failure.body;
    assert_eq!((b["event"].as_str(), b["job"].as_str(), b["status"].as_str()), (Some("failure"), Some("flaky"), Some("failed")));
    assert_eq!(b["consecutive_failures"], 2, "only the second failure in a row is told");
    assert_eq!(b["attempt"], 1);
    assert!(b["error"].as_str().is_some_and(|e| e.contains("exited with code 1")), "{b}");
    assert!(b["duration_ms"].as_i64().is_some_and(|d| d >= 0), "{b}");
    let run_id = b["run_id"].as_str().expect("run_id").to_owned();
    assert_eq!(b["command"].as_str(), Some(format!("lampctl runs show {run_id}").as_str()));
    assert_eq!(failure.header("idempotency-key"), b["key"].as_str(), "the event's key, for a receiver to tell a repeat");
    assert_eq!(recovery.path, "/recovered");
    assert_eq!((recovery.body["event"].as_str(), recovery.body["status"].as_str()), (Some("recovery"), Some("succeeded")));
    // Recorded once each, delivered; and `runs show` says so.
    let rows = poll(
        "both delivered",
        Duration::from_secs(10),
        || Some(notifications(&w)).filter(|n| n.iter().all(|(_, s, _)| s == "delivered")),
        || w.log(),
    );
    assert_eq!(rows, [("failure".to_owned(), "delivered".to_owned(), 1), ("recovery".to_owned(), "delivered".to_owned(), 1)]);
    let (code, shown, err) = w.ctl(&["runs", "show", &run_id]);
    assert_eq!(code, 0, "{err}");
    assert!(shown.contains("notifications:") && shown.contains("webhook http://127.0.0.1:") && shown.contains("HTTP 200"), "{shown}");
    assert!(!shown.contains("/hook"), "a webhook's path is not shown (it may be the secret): {shown}");
    // The worker goes on noticing: the next run's success (its own rule, added by a reload) is
    // told after both; neither of them comes again.
    let notify = format!(
        "[{{on: failure, after_consecutive: 2, to: {{webhook: {{url: \"{}\", headers: {{Authorization: \"Bearer ${{HOOK_TOKEN}}\"}}}}}}}}, {{on: recovery, to: {{webhook: \"{}\"}}}}, {{on: success, to: {{webhook: \"{}\"}}}}]",
        hook.url("/hook"),
        hook.url("/recovered"),
        hook.url("/ok")
    );
    w.write_jobs(&flaky("flaky", 2, &notify));
    let (code, out, err) = w.ctl(&["config", "reload"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, _) = w.ctl(&["jobs", "trigger", "flaky", "--wait"]);
    assert_eq!(code, 0);
    let got = hook.wait_for(3, Duration::from_secs(20)).unwrap_or_else(|got| panic!("{got:?}\n{}", w.log()));
    poll(
        "the third delivered",
        Duration::from_secs(10),
        || Some(notifications(&w)).filter(|n| n.len() == 3 && n[2].1 == "delivered"),
        || w.log(),
    );
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths.len(), 3, "nothing sent twice: {paths:?}");
    assert_eq!(paths[2], "/ok", "{paths:?}");
}

#[test]
fn a_notification_outlives_a_receiver_that_is_down_and_a_worker_killed_before_sending() {
    let port = free_port();
    let notify = format!("[{{on: failure, to: {{webhook: \"http://127.0.0.1:{port}/hook\"}}}}]");
    let mut w = Worker::new(&flaky("broken", 99, &notify));
    w.start();
    let (code, out, err) = w.ctl(&["jobs", "trigger", "broken", "--wait"]);
    assert_eq!(code, 4, "{out}{err}");
    // Nobody listens: the send fails and is tried again, with backoff.
    poll(
        "the notification retried",
        Duration::from_secs(20),
        || notifications(&w).first().filter(|(_, s, n)| s == "pending" && *n >= 2).cloned(),
        || w.log(),
    );
    // The worker dies before the receiver comes back.
    w.signal("KILL");
    w.wait_exit(Duration::from_secs(10));
    let hook = Receiver::start_on(port);
    w.start();
    let got = hook.wait_for(1, Duration::from_secs(30)).unwrap_or_else(|_| panic!("the notification did not come\n{}", w.log()));
    assert_eq!(got[0].body["event"], "failure");
    let rows = poll(
        "delivered",
        Duration::from_secs(10),
        || Some(notifications(&w)).filter(|n| n.first().is_some_and(|(_, s, _)| s == "delivered")),
        || w.log(),
    );
    assert!(rows[0].2 >= 3, "it was tried before and after the kill: {rows:?}");
    // A receiver that refuses for good (404) is given up on at once, visibly.
    hook.answer(404);
    let (code, _, _) = w.ctl(&["jobs", "trigger", "broken", "--wait"]);
    assert_eq!(code, 4);
    let rows = poll(
        "the second given up",
        Duration::from_secs(30),
        || Some(notifications(&w)).filter(|n| n.len() == 2 && n[1].1 == "abandoned"),
        || w.log(),
    );
    assert_eq!(rows[1].2, 1, "a 404 is not tried again");
    // Taken once: the first delivered, after it the second refused, and nothing more.
    assert_eq!(hook.got().len(), 1, "sent once");
    assert!(w.log().contains("notification given up"), "{}", w.log());
}

/// The risky window: the receiver took the POST, and the worker died before it could record
/// the delivery. README: such a send goes again with the same key, so a receiver that keeps
/// keys acts once — at least once, never recorded twice.
#[test]
fn a_worker_killed_after_the_receiver_took_a_notification_sends_it_again_with_the_same_key() {
    let hook = Receiver::start();
    hook.hold();
    let notify = format!("[{{on: failure, to: {{webhook: \"{}\"}}}}]", hook.url("/hook"));
    let mut w = Worker::new(&flaky("broken", 99, &notify));
    w.start();
    let (code, out, err) = w.ctl(&["jobs", "trigger", "broken", "--wait"]);
    assert_eq!(code, 4, "{out}{err}");
    let taken = hook.wait_for(1, Duration::from_secs(20)).unwrap_or_else(|_| panic!("the receiver took nothing\n{}", w.log()));
    // Taken, never answered: the worker has claimed it and cannot know it arrived.
    assert_eq!(notifications(&w), [("failure".to_owned(), "sending".to_owned(), 1)]);
    w.signal("KILL");
    w.wait_exit(Duration::from_secs(10));
    hook.answer(200);
    let restarted = crate::support::now_ms();
    w.start();
    let got = hook.wait_for(2, Duration::from_secs(90)).unwrap_or_else(|got| panic!("not sent again: {got:?}\n{}", w.log()));
    // At the restart: the claim of a worker that is gone is void (not held for its 60 s).
    assert!(got[1].arrived_ms - restarted < 20_000, "sent again {} ms after the restart", got[1].arrived_ms - restarted);
    let key = |r: &lamplighter_tests::webhook::Received| r.header("idempotency-key").map(str::to_owned);
    assert!(key(&taken[0]).is_some(), "{:?}", taken[0].headers);
    assert_eq!(key(&got[1]), key(&taken[0]), "sent again with the same key");
    assert_eq!(got[1].body["key"], taken[0].body["key"]);
    poll(
        "delivered",
        Duration::from_secs(10),
        || Some(notifications(&w)).filter(|n| n == &[("failure".to_owned(), "delivered".to_owned(), 2)]),
        || format!("{:?}\n{}", notifications(&w), w.log()),
    );
    // Later passes send it no more: the next failure's notice comes, alone, after it.
    let (code, _, _) = w.ctl(&["jobs", "trigger", "broken", "--wait"]);
    assert_eq!(code, 4);
    let got = hook.wait_for(3, Duration::from_secs(20)).unwrap_or_else(|got| panic!("{got:?}\n{}", w.log()));
    poll(
        "the second delivered",
        Duration::from_secs(10),
        || Some(notifications(&w)).filter(|n| n.len() == 2 && n[1].1 == "delivered"),
        || w.log(),
    );
    let keys: Vec<Option<String>> = got.iter().map(key).collect();
    assert_eq!(got.len(), 3, "{keys:?}");
    assert_ne!(keys[2], keys[0], "a new event, a new key");
}

/// `success`, `approval_waiting` and `budget_asked` each reach their receiver once, with what a
/// receiver needs to act (the step waiting, the budget's question), and nothing is sent twice
/// while the worker goes on noticing runs.
#[test]
fn success_approval_waiting_and_budget_asked_each_reach_a_webhook_once() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let llm = rt.block_on(ScriptedLlm::start((1, 1), |req| {
        // A second tool call goes over `max_tool_calls: 1`: the agent asks.
        if messages(req).iter().filter(|m| m["role"] == "tool").count() < 2 {
            Reply::Tools(vec![("shell-exec__run".into(), r#"{"command": "echo spend"}"#.into())])
        } else {
            Reply::Text("spent".into())
        }
    }));
    let hook = Receiver::start();
    let to = |path: &str| format!("{{webhook: \"{}\"}}", hook.url(path));
    let top = format!(
        "ai:\n  default_model: m\n  providers:\n    p:\n      base_url: {}\n      models:\n        m: {{id: scripted-model}}\n\
         agents:\n  spender:\n    system_prompt: Spend.\n    plugins: [shell-exec]\n    allowed_commands: ['echo*']\n    budget: {{max_tool_calls: 1, on_budget: ask}}\n\
         workflows:\n  gated:\n    steps:\n      - {{id: gate, type: approval, input: \"Ship it?\"}}\n      - {{id: done, type: plugin, plugin: file-save, action: save, parameters: {{path: shipped.txt, content: yes}}}}\n",
        llm.base_url()
    );
    let jobs = format!(
        "ok:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {{command: \"echo fine\"}}\n  notify: [{{on: success, to: {}}}]\n\
         ship:\n  type: workflow\n  workflow: gated\n  notify: [{{on: approval_waiting, to: {}}}]\n\
         spend:\n  type: agent\n  agent: spender\n  input: go\n  notify: [{{on: budget_asked, to: {}}}]\n",
        to("/success"),
        to("/approval"),
        to("/budget")
    );
    let mut w = Worker::new("");
    w.write_full(&top, &jobs, "");
    w.start();
    let (code, out, err) = w.ctl(&["jobs", "trigger", "ok", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    for job in ["ship", "spend"] {
        let (code, out, err) = w.ctl(&["jobs", "trigger", job]);
        assert_eq!(code, 0, "{job}: {out}{err}");
    }
    let got = hook
        .wait_for(3, Duration::from_secs(30))
        .unwrap_or_else(|got| panic!("three notifications, got {got:?}\n{:#?}\n{}", w.runs(), w.log()));
    let by_path = |path: &str| got.iter().find(|r| r.path == path).unwrap_or_else(|| panic!("nothing at {path}: {got:?}")).body.clone();
    let success = by_path("/success");
    assert_eq!(
        (success["event"].as_str(), success["job"].as_str(), success["status"].as_str()),
        (Some("success"), Some("ok"), Some("succeeded")),
        "{success}"
    );
    let approval = by_path("/approval");
    assert_eq!((approval["event"].as_str(), approval["job"].as_str()), (Some("approval_waiting"), Some("ship")), "{approval}");
    assert!(approval.to_string().contains("gate"), "the waiting step is named: {approval}");
    let budget = by_path("/budget");
    assert_eq!((budget["event"].as_str(), budget["job"].as_str()), (Some("budget_asked"), Some("spend")), "{budget}");
    assert!(budget.to_string().contains("agent:budget-1"), "the budget's step is named: {budget}");
    // The worker goes on noticing runs (another success is told) and sends none of these again.
    let (code, _, _) = w.ctl(&["jobs", "trigger", "ok", "--wait"]);
    assert_eq!(code, 0);
    let got = hook.wait_for(4, Duration::from_secs(20)).unwrap_or_else(|got| panic!("{got:?}\n{}", w.log()));
    let rows = poll(
        "all four delivered",
        Duration::from_secs(10),
        || Some(notifications(&w)).filter(|n| n.len() == 4 && n.iter().all(|(_, s, _)| s == "delivered")),
        || format!("{:?}\n{}", notifications(&w), w.log()),
    );
    let mut events: Vec<&str> = rows.iter().map(|(e, _, _)| e.as_str()).collect();
    events.sort_unstable();
    assert_eq!(events, ["approval_waiting", "budget_asked", "success", "success"]);
    assert_eq!(got.len(), 4, "each sent once: {got:?}");
    drop(rt);
}

#[test]
fn notifications_run_a_workflow_and_an_agent_with_the_event() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let llm = rt.block_on(ScriptedLlm::start((5, 3), |_| Reply::Text("paged the on-call".into())));
    let top = format!(
        "ai:\n  default_model: default\n  providers:\n    scripted:\n      base_url: {}\n      models:\n        default: {{id: scripted-model}}\nagents:\n  pager:\n    system_prompt: Page the on-call about the event you are given.\nworkflows:\n  page:\n    steps:\n      - id: note\n        type: plugin\n        plugin: file-save\n        action: save\n        parameters: {{path: paged.txt, content: \"${{input.job}} ${{input.event}} ${{input.status}}\"}}\n",
        llm.base_url()
    );
    let w = {
        let mut w = Worker::new("");
        w.write_full(&top, &flaky("nightly", 99, "[{on: failure, to: {workflow: page}}, {on: failure, to: {agent: pager}}]"), "");
        w.start();
        w
    };
    let (code, _, _) = w.ctl(&["jobs", "trigger", "nightly", "--wait"]);
    assert_eq!(code, 4);
    let runs = w.wait_for("the workflow and the agent ran", Duration::from_secs(30), |r| {
        ["workflow:page", "agent:pager"].iter().all(|j| r.iter().any(|x| x.job == *j && x.status == "succeeded"))
    });
    assert_eq!(runs.len(), 3, "one run each, however often the event is noticed: {runs:#?}");
    let paged = std::fs::read_to_string(w.dir.path().join("data/paged.txt")).unwrap_or_default();
    assert_eq!(paged, "nightly failure failed");
    let asked = llm.seen();
    assert_eq!(asked.len(), 1);
    let user =
        messages(&asked[0].body).iter().find(|m| m["role"] == "user").and_then(|m| m["content"].as_str()).unwrap_or_default().to_owned();
    let event: Value = serde_json::from_str(&user).unwrap_or_else(|e| panic!("the agent is given the event as JSON ({e}): {user}"));
    assert_eq!((event["event"].as_str(), event["job"].as_str()), (Some("failure"), Some("nightly")));
    let rows = notifications(&w);
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|(_, s, _)| s == "delivered"), "{rows:?}");
}

#[test]
fn runs_follow_shows_a_commands_output_before_it_ends_and_exits_by_how_the_run_ended() {
    let job = "slow:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  retries: {max: 0}\n  parameters: {command: \"echo first-line; echo to-stderr >&2; while [ ! -f go ]; do sleep 0.05; done; echo last-line; test -f fail && exit 3; exit 0\", timeout_seconds: 60}\n";
    let mut w = Worker::new(job);
    w.start();
    let (code, out, err) = w.ctl(&["-o", "json", "jobs", "trigger", "slow"]);
    assert_eq!(code, 0, "{out}{err}");
    let id = serde_json::from_str::<Value>(&out).unwrap()["run_id"].as_str().unwrap().to_owned();
    let mut follow = Command::new(ctl_bin())
        .args(["--url", &w.url(), "runs", "follow", &id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lampctl");
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    // stdout and stderr are read apart: either line may come first.
    while !(seen.iter().any(|l: &String| l.contains("to-stderr")) && seen.iter().any(|l: &String| l.contains("first-line"))) {
        let line = lines.next().expect("follow goes on").expect("a line");
        seen.push(line);
    }
    // The command still runs (it waits for `go`), and its first lines are on the screen.
    assert_eq!(w.runs().iter().find(|r| r.job == "slow").map(|r| r.status.clone()).as_deref(), Some("running"));
    assert!(seen.iter().any(|l| l == "  │ first-line"), "{seen:?}");
    assert!(seen.iter().any(|l| l == "  ! to-stderr"), "{seen:?}");
    std::fs::write(w.dir.path().join("data/go"), "").unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l == "  │ last-line"), "{rest:?}");
    assert_eq!(follow.wait().unwrap().code(), Some(0), "succeeded: 0");
    // The log is kept with the run.
    let (_, out, _) = w.ctl(&["-o", "json", "runs", "show", &id]);
    let log: Vec<String> = serde_json::from_str::<Value>(&out).unwrap()["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap().to_owned())
        .collect();
    // stdout and stderr are two pipes: their first lines may come in either order.
    let mut first_two = log[..2.min(log.len())].to_vec();
    first_two.sort();
    assert_eq!(
        (first_two, log.get(2).map(String::as_str), log.len()),
        (vec!["first-line".to_owned(), "to-stderr".to_owned()], Some("last-line"), 3)
    );
    // A failed run: `--wait` streams it too, and exits 4.
    std::fs::write(w.dir.path().join("data/fail"), "").unwrap();
    let (code, out, err) = w.ctl(&["jobs", "trigger", "slow", "--wait"]);
    assert_eq!(code, 4, "failed: 4\n{out}{err}");
    assert!(err.contains("  │ first-line") && err.contains("failed"), "{err}");
    // A cancelled one exits 6 (the run is cancelled while `follow` waits).
    std::fs::remove_file(w.dir.path().join("data/go")).unwrap();
    let (_, out, _) = w.ctl(&["-o", "json", "jobs", "trigger", "slow"]);
    let id = serde_json::from_str::<Value>(&out).unwrap()["run_id"].as_str().unwrap().to_owned();
    let follow = Command::new(ctl_bin()).args(["--url", &w.url(), "runs", "follow", &id]).stdout(Stdio::piped()).spawn().expect("lampctl");
    poll("the run to start", Duration::from_secs(10), || w.runs().iter().any(|r| r.status == "running").then_some(()), || w.log());
    let (code, _, err) = w.ctl(&["runs", "cancel", &id]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(follow.wait_with_output().unwrap().status.code(), Some(6), "cancelled: 6");
}

#[test]
fn a_run_resumed_after_an_approval_keeps_one_log() {
    let top = "workflows:\n  two:\n    steps:\n      - {id: a, type: plugin, plugin: shell-exec, action: run, parameters: {command: \"echo before\"}}\n      - {id: gate, type: approval}\n      - {id: b, type: plugin, plugin: shell-exec, action: run, parameters: {command: \"echo after\"}}\n";
    let mut w = Worker::new("");
    w.write_full(top, "both:\n  workflow: two\n", "");
    w.start();
    let (code, out, err) = w.ctl(&["-o", "json", "jobs", "trigger", "both", "--wait"]);
    assert_eq!(code, 7, "waits for approval: 7\n{out}{err}");
    let id = serde_json::from_str::<Value>(&out).unwrap()["run_id"].as_str().unwrap().to_owned();
    let (code, _, err) = w.ctl(&["approvals", "approve", &id]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = w.ctl(&["runs", "follow", &id]);
    assert_eq!(code, 0, "{out}{err}");
    let (_, out, _) = w.ctl(&["-o", "json", "runs", "show", &id]);
    let log: Vec<(u64, String)> = serde_json::from_str::<Value>(&out).unwrap()["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["seq"].as_u64().unwrap(), l["text"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(log, [(1, "before".to_owned()), (2, "after".to_owned())]);
}
