//! What each fuzz target asserts for one input. A panic here is a finding: the code under
//! test panicked, or broke an invariant stated below. Used by the fuzz targets and, through
//! `#[path]`, by `tests/tests/fuzz_corpus.rs` in the main workspace.

use std::path::Path;

use chrono::{DateTime, Utc};
use lamplighter_config::{KeepMerged, LoadOptions, Schedule, Template, Var};

/// Config loading: `input` split at the first `0xff` byte into the root file and a second
/// file it may import (`other.yaml`). Loading never panics; a refusal has at least one
/// error, and every diagnostic says something.
pub fn config_load(dir: &Path, input: &[u8]) {
    let (root, other) = match input.iter().position(|&b| b == 0xff) {
        Some(i) => (&input[..i], &input[i + 1..]),
        None => (input, &[][..]),
    };
    let path = dir.join("lamplighter.yaml");
    std::fs::write(&path, root).expect("write the root file");
    std::fs::write(dir.join("other.yaml"), other).expect("write the imported file");
    let opts = LoadOptions { path: Some(path), cwd: Some(dir.to_path_buf()), ..Default::default() };
    // A fixed environment: `${SET}` and `${SET_EMPTY}` resolve, anything else is unset.
    let env = |name: &str| match name {
        "SET" => Some("value".to_owned()),
        "SET_EMPTY" => Some(String::new()),
        "DATABASE_URL" => Some("postgres://u:p@localhost:5432/db".to_owned()),
        _ => None,
    };
    let whole = lamplighter_config::load_with_env(&opts, env);
    match &whole {
        Ok(loaded) => {
            // A loaded config can be shown (secrets redacted) without panicking.
            let _ = lamplighter_config::show(&loaded.config);
        }
        Err(errors) => {
            assert!(!errors.0.is_empty(), "a refused config without an error");
            for d in &errors.0 {
                assert!(!d.to_string().trim().is_empty(), "an empty diagnostic");
            }
        }
    }
    // A worker's load (each job read from its YAML and compiled in turn) finds the same.
    let lean = lamplighter_config::load_with_env(&LoadOptions { merged: KeepMerged::WithoutJobs, ..opts }, env);
    match (&whole, &lean) {
        (Ok(a), Ok(b)) => assert_eq!(a.config.jobs, b.config.jobs, "the jobs differ between the two ways of loading"),
        (Err(a), Err(b)) => {
            let text = |e: &lamplighter_config::ConfigErrors| e.0.iter().map(ToString::to_string).collect::<Vec<_>>();
            assert_eq!(text(a), text(b), "the errors differ between the two ways of loading");
        }
        _ => panic!("one way of loading refused what the other took: {:?} / {:?}", whole.is_ok(), lean.is_ok()),
    }
}

/// Cron, `every` and `at` parsing, in any IANA zone, and the fire times that follow: the first
/// byte picks the kind, the next eight the instant to start from, the rest is the expression
/// and (for cron) the zone after a `\n`. A parsed schedule's next fire is strictly later than
/// the instant asked about, and upcoming fires strictly increase.
pub fn schedule(input: &[u8]) {
    if input.len() < 9 {
        return;
    }
    let kind = input[0] % 3;
    let mut secs = [0u8; 8];
    secs.copy_from_slice(&input[1..9]);
    // Any instant from 1900 to 2200: the range a scheduler is asked about.
    let t = DateTime::<Utc>::from_timestamp(-2_208_988_800 + (i64::from_le_bytes(secs).rem_euclid(9_467_280_000)), 0).expect("in range");
    let text = String::from_utf8_lossy(&input[9..]);
    let parsed = match kind {
        0 => {
            let (expr, tz) = text.split_once('\n').unwrap_or((&text, "UTC"));
            Schedule::cron(expr, tz)
        }
        1 => Schedule::every(&text),
        _ => Schedule::at(&text),
    };
    let Ok(schedule) = parsed else { return };
    let upcoming = schedule.upcoming(t, 4);
    let mut before = t;
    for next in &upcoming {
        assert!(*next > before, "{:?} after {t}: {upcoming:?}", schedule.spec());
        before = *next;
    }
    // Asked again, from each fire: the same answers.
    for pair in upcoming.windows(2) {
        assert_eq!(schedule.next_after(pair[0]), Some(pair[1]), "{:?}", schedule.spec());
    }
    if let Some(first) = upcoming.first() {
        assert_eq!(schedule.next_after(t), Some(*first), "{:?}", schedule.spec());
        // Between `t` and its next fire the remembered answer is used: it must be the answer
        // a schedule without memory gives.
        let between = *first - chrono::Duration::milliseconds(1);
        if between > t {
            assert_eq!(schedule.next_after(between), schedule.clone().next_after(between), "{:?}", schedule.spec());
        }
    }
}

/// Template parsing and rendering (`${input.a}`, `${steps.x.output}`, `${env.X}`, `${run.id}`):
/// parsing keeps the text as written, rendering with no values gives it back unchanged, and
/// rendering with values replaces exactly the references.
pub fn template(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    let template = Template::parse(&text);
    assert_eq!(template.as_str(), text, "the template as written");
    assert_eq!(template.render(|_| None), text, "rendering without values changed the text");
    // Every reference is offered to the renderer exactly once, in order, and replaced by
    // what it gives back: with empty values, what is left is the text between references.
    let refs: Vec<Var> = template.vars().cloned().collect();
    let mut offered = Vec::new();
    let rendered = template.render(|var| {
        offered.push(var.clone());
        Some(String::new())
    });
    assert_eq!(offered, refs, "{text:?}");
    let texts: String = template
        .parts()
        .iter()
        .filter_map(|p| match p {
            lamplighter_config::Part::Text(t) => Some(t.as_str()),
            lamplighter_config::Part::Ref { .. } => None,
        })
        .collect();
    assert_eq!(rendered, texts, "{text:?}");
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) {
        let _ = lamplighter_config::Templated::parse(&value).vars();
    }
}

/// A WASM plugin call's output, as the guest controls it: the first twelve bytes are the
/// return code, output pointer and length it hands back (little-endian i32), the rest its
/// memory. Reading never panics; only a zero code with in-bounds valid JSON is a result, and
/// a failure names the plugin and stays short whatever the guest wrote.
pub fn wasm_output(input: &[u8]) {
    if input.len() < 12 {
        return;
    }
    let word = |i: usize| i32::from_le_bytes([input[i], input[i + 1], input[i + 2], input[i + 3]]);
    let (code, ptr, len) = (word(0), word(4), word(8));
    let memory = &input[12..];
    match crate::wasm_output::read("fuzz", code, ptr, len, memory) {
        Ok(value) => {
            assert_eq!(code, 0, "a failed call gave a result");
            let (start, len) = (ptr as u32 as usize, len as u32 as usize);
            let expected: serde_json::Value = serde_json::from_slice(&memory[start..start + len]).expect("the output is JSON");
            assert_eq!(value, expected);
        }
        Err(message) => {
            assert!(message.starts_with("plugin \"fuzz\" "), "{message}");
            assert!(message.chars().count() <= crate::wasm_output::MAX_ERROR_TEXT + 200, "{} chars", message.chars().count());
        }
    }
}

/// MCP tool arguments, as any client may send them: the first byte picks the tool (one past
/// the last is a tool that does not exist), the rest is the `arguments` object as JSON text.
/// Checking never panics and gives the same answer twice. An accepted call has its counts and
/// wait within range, a cursor that is a run id, a known status, the job it names, and would be
/// refused with one more (unknown) field; a refusal says something, and names its field when it
/// blames one.
pub fn mcp_args(input: &[u8]) {
    use lamplighter_contract::RunStatus;
    use lamplighter_contract::args::{TOOLS, check, is_run_id};
    use serde_json::Value;

    let Some((&pick, json)) = input.split_first() else { return };
    let tool = TOOLS.get(pick as usize % (TOOLS.len() + 1)).copied().unwrap_or("no_such_tool");
    let Ok(Value::Object(arguments)) = serde_json::from_slice::<Value>(json) else { return };
    let result = check(tool, arguments.clone());
    assert_eq!(result, check(tool, arguments.clone()), "{tool}: the same arguments checked twice differ");
    match result {
        Ok(checked) => {
            assert!(TOOLS.contains(&tool), "an unknown tool was accepted");
            let max = match tool {
                "list_jobs" => Some(1000),
                "list_runs" => Some(200),
                "get_job" | "scheduler_job_status" | "preview_schedule" => Some(100),
                _ => None,
            };
            assert_eq!(checked.count.is_some(), max.is_some(), "{tool}: {checked:?}");
            if let (Some(n), Some(max)) = (checked.count, max) {
                assert!((1..=max).contains(&n), "{tool}: count {n} outside 1..={max}");
            }
            if let Some(t) = checked.timeout {
                assert!((1..=86_400).contains(&t.as_secs()), "{tool}: timeout {t:?}");
                assert_eq!(arguments.get("wait"), Some(&Value::Bool(true)), "{tool}: a timeout without wait");
            }
            if tool == "list_runs" {
                assert!(checked.subject.is_empty() || is_run_id(&checked.subject), "cursor {:?} accepted", checked.subject);
                if let Some(s) = arguments.get("status").and_then(Value::as_str) {
                    assert!(s.parse::<RunStatus>().is_ok(), "status {s:?} accepted");
                }
            }
            let named = ["name", "job_name"].iter().filter_map(|k| arguments.get(*k).and_then(Value::as_str)).collect::<Vec<_>>();
            if !named.is_empty() && tool != "run_workflow" {
                assert!(named.iter().all(|n| *n == checked.subject), "{tool}: named {named:?}, checked {:?}", checked.subject);
            }
            let mut more = arguments;
            let extra = (0..).map(|i| format!("zz_unknown_{i}")).find(|k| !more.contains_key(k)).unwrap_or_default();
            more.insert(extra.clone(), Value::Null);
            let refused = check(tool, more).expect_err("an unknown field was accepted");
            assert!(refused.message.contains(&format!("unknown field `{extra}`")), "{tool}: {}", refused.message);
        }
        Err(e) => {
            assert!(!e.message.trim().is_empty(), "{tool}: an empty refusal");
            if let Some(field) = &e.field {
                let last = field.rsplit('.').next().unwrap_or(field);
                assert!(e.message.contains(last), "{tool}: the refusal blames `{field}` without naming it: {}", e.message);
            }
        }
    }
}

/// An iCalendar file as a calendar's `ics:` reads it: never a panic; a refusal names a line of
/// the file (1 to its number of lines) and says what to do.
pub fn ics(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    if let Err((line, message)) = lamplighter_config::ics_days(&text) {
        let lines = text.split('\n').count().max(1);
        assert!((1..=lines).contains(&line), "line {line} of {lines}: {message}");
        assert!(!message.trim().is_empty(), "an empty message");
    }
}
