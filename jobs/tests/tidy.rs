//! Invariants of the code's shape that ARCHITECTURE.md states, checked on the source.

use std::path::{Path, PathBuf};

/// The `.rs` files under `dir`, with their text.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = e.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                out.push((path, text));
            }
        }
    }
    assert!(!out.is_empty(), "no sources under {}", dir.display());
    out
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// Whether `text` holds `word` with no identifier character on either side.
fn has_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word)
        .any(|(i, _)| !text[..i].chars().next_back().is_some_and(ident) && !text[i + word.len()..].chars().next().is_some_and(ident))
}

/// What follows each `lamplighter_contract::` (or `wire::`) up to the end of its path or of its
/// `{…}` list.
fn contract_paths(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for prefix in ["lamplighter_contract::", "wire::"] {
        for (i, _) in text.match_indices(prefix) {
            let rest = &text[i + prefix.len()..];
            let end = if rest.starts_with('{') {
                rest.find('}').map_or(rest.len(), |e| e + 1)
            } else {
                rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len())
            };
            out.push(&rest[..end]);
        }
    }
    out
}

/// The engine works on its domain `Run` (typed owner and follow-up); the contract's `Run`, the
/// wire's, is made from it in `run.rs` (`to_wire`) and handed out by the service only.
#[test]
fn the_contracts_run_appears_only_at_the_service_edge() {
    let src = workspace().join("jobs/src");
    let allowed = [src.join("run.rs"), src.join("service.rs")];
    let mut found = Vec::new();
    let mut at_edge = 0;
    for (path, text) in sources(&src) {
        let names_it = contract_paths(&text).iter().any(|p| has_word(p, "Run"));
        if names_it && allowed.contains(&path) {
            at_edge += 1;
        } else if names_it {
            found.push(path.display().to_string());
        }
    }
    assert_eq!(found, Vec::<String>::new(), "the contract's Run named in the engine");
    assert_eq!(at_edge, allowed.len(), "the check no longer sees the edge: does it still read the imports?");
}

/// The worker starts processes in one module, which gives each a process group and kills it
/// (clippy's `disallowed-methods` holds the same line; this also catches other spawners).
/// lampctl, a foreground CLI, starts the user's editor and a context's token command itself.
#[test]
fn the_worker_starts_processes_in_one_module() {
    let root = workspace();
    let the_module = root.join("plugins/src/builtin/process.rs");
    let mut found = Vec::new();
    let mut seen_in_module = false;
    for krate in ["config/src", "jobs/src", "plugins/src", "worker/src"] {
        for (path, text) in sources(&root.join(krate)) {
            let spawns =
                ["Command::new", "TokioChildProcess", "process::Command", "posix_spawn", "fork("].iter().any(|w| has_word(&text, w));
            if path == the_module {
                seen_in_module = spawns;
            } else if spawns {
                found.push(path.display().to_string());
            }
        }
    }
    assert!(seen_in_module, "the check no longer sees the module that starts processes");
    assert_eq!(found, Vec::<String>::new(), "processes started outside {}", the_module.display());
}

/// Metrics, spans and hook calls are made in `events.rs` only: the rest of the engine tells the
/// `Observer` what happened (and carries a span's context along with `with_context`). Log
/// lines are written where they happen; the stages that tests and benches read are typed
/// internal events (`InternalEvent`), never log text.
#[test]
fn metrics_spans_and_hooks_are_made_in_events_only() {
    let src = workspace().join("jobs/src");
    let events = src.join("events.rs");
    let makers = ["opentelemetry::metrics", "opentelemetry::trace", "KeyValue", "BoxedTracer", "run_hooks", "span_builder"];
    let mut found = Vec::new();
    let mut seen_in_events = 0;
    for (path, text) in sources(&src) {
        let made: Vec<&str> = makers.iter().copied().filter(|w| has_word(&text, w)).collect();
        if path == events {
            seen_in_events = made.len();
        } else if !made.is_empty() {
            found.push(format!("{}: {}", path.display(), made.join(", ")));
        }
    }
    assert!(seen_in_events >= 4, "the check no longer sees what events.rs makes them with");
    assert_eq!(found, Vec::<String>::new(), "metrics, spans or hooks made outside events.rs");
}
