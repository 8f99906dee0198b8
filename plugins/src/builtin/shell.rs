//! `shell-exec.run`: runs a command line through `sh -c`, after checking it against the
//! context's allowlist with the Linggen rules (no command substitution or newlines; every
//! segment between `|`, `;`, `&`, `&&`, `||` must start with an allowed command).
//!
//! The check splits on separator characters without understanding quotes, so it errs on the
//! side of refusing: `echo "a;b"` is checked as `echo "a` and `b"`.

use std::time::Duration;

use serde_json::{Value, json};

use super::params::Params;
use super::process::{self, RunError};
use crate::{ActionContext, ActionError};

const DEFAULT_TIMEOUT_SECONDS: u64 = 120;
const MAX_TIMEOUT_SECONDS: u64 = 24 * 60 * 60;
/// How much of stderr a failure message quotes.
const STDERR_TAIL: usize = 2000;

/// Substrings that let a command run other commands the segment check cannot see.
const FORBIDDEN: &[(&str, &str)] = &[
    ("$(", "command substitution \"$(\" is not allowed"),
    ("`", "command substitution with backticks is not allowed"),
    ("\n", "newlines are not allowed"),
    ("\r", "carriage returns are not allowed"),
    ("<(", "process substitution \"<(\" is not allowed"),
    (">(", "process substitution \">(\" is not allowed"),
];

pub(crate) async fn run(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let command = params.required_str("command")?;
    if command.trim().is_empty() {
        return Err(params.invalid("command", "is empty"));
    }
    if command.contains('\0') {
        return Err(params.invalid("command", "contains a NUL byte"));
    }
    let seconds = params.int_in("timeout_seconds", DEFAULT_TIMEOUT_SECONDS, 1, MAX_TIMEOUT_SECONDS)?;
    check_allowed(params.action(), command, &ctx.allowed_commands)?;

    let output = match process::run("sh", &["-c", command], &ctx.working_directory, &[], Duration::from_secs(seconds), &ctx.cancel).await {
        Ok(output) => output,
        Err(RunError::Timeout) => {
            return Err(ActionError::Timeout { action: params.action().to_owned(), seconds });
        }
        Err(RunError::Cancelled) => {
            return Err(ActionError::Cancelled { action: params.action().to_owned() });
        }
        Err(RunError::Spawn(e)) => {
            return Err(params.failed(format!("could not start \"sh\" in \"{}\": {e}", ctx.working_directory.display())));
        }
        Err(RunError::Wait(e)) => {
            return Err(params.failed(format!("could not wait for \"sh\": {e}")));
        }
    };
    match output.exit_code {
        Some(0) => Ok(json!({ "exit_code": 0, "stdout": output.stdout, "stderr": output.stderr, "truncated": output.truncated })),
        Some(code) => Err(params.failed(format!("command exited with code {code}{}", stderr_tail(&output.stderr)))),
        None => Err(params.failed(format!("command was killed by a signal{}", stderr_tail(&output.stderr)))),
    }
}

fn stderr_tail(stderr: &str) -> String {
    let trimmed = stderr.trim_end();
    if trimmed.is_empty() {
        return String::new();
    }
    let mut start = trimmed.len().saturating_sub(STDERR_TAIL);
    while !trimmed.is_char_boundary(start) {
        start += 1;
    }
    let prefix = if start > 0 { "…" } else { "" };
    format!("; stderr: {prefix}{}", &trimmed[start..])
}

/// Applies the allowlist; an empty allowlist allows any command.
fn check_allowed(action: &str, command: &str, allowed: &[String]) -> Result<(), ActionError> {
    if allowed.is_empty() {
        return Ok(());
    }
    let refuse = |cmd: &str, reason: String| ActionError::CommandNotAllowed { action: action.to_owned(), command: cmd.to_owned(), reason };
    for (needle, reason) in FORBIDDEN {
        if command.contains(needle) {
            return Err(refuse(command, (*reason).to_owned()));
        }
    }
    for segment in segments(command) {
        let Some(first) = segment.split_whitespace().next() else {
            continue;
        };
        if !allowed.iter().any(|pattern| matches_pattern(pattern, first)) {
            let list = allowed.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(", ");
            return Err(refuse(first, format!("it is not in the allowed commands ({list})")));
        }
    }
    Ok(())
}

/// Splits on `|`, `;` and `&` (so `&&` and `||` too), except an `&` right after `>` or `<`,
/// which duplicates a file descriptor (`2>&1`, `>&2`) rather than separating commands.
fn segments(command: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut previous = None;
    for (i, c) in command.char_indices() {
        let separator = matches!(c, '|' | ';') || (c == '&' && !matches!(previous, Some('>' | '<')));
        if separator {
            out.push(&command[start..i]);
            start = i + c.len_utf8();
        }
        previous = Some(c);
    }
    out.push(&command[start..]);
    out
}

/// `prefix*` matches by prefix, anything else exactly; both ignore ASCII case.
fn matches_pattern(pattern: &str, command: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => {
            command.len() >= prefix.len() && command.is_char_boundary(prefix.len()) && command[..prefix.len()].eq_ignore_ascii_case(prefix)
        }
        None => pattern.eq_ignore_ascii_case(command),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn allowlist_allows_listed_commands() {
        let allowed = allow(&["ls", "git*", "ECHO", "grep"]);
        for ok in [
            "ls",
            "ls -la",
            "LS /tmp",
            "git status",
            "git-lfs ls-files",
            "echo hi",
            "ls | grep x",
            "ls; echo done",
            "ls && echo ok",
            "ls || echo no",
            "  ls  ",
            "ls 2>&1 | grep x",
            "echo err >&2",
        ] {
            assert_eq!(check_allowed("s.r", ok, &allowed), Ok(()), "{ok:?}");
        }
        assert_eq!(check_allowed("s.r", "anything at all; rm -rf /", &[]), Ok(()));
    }

    #[test]
    fn allowlist_rejects_injection_attempts() {
        let allowed = allow(&["ls", "echo", "git*"]);
        let cases = [
            ("ls; rm -rf /", "rm"),
            ("ls $(whoami)", "ls $(whoami)"),
            ("ls `id`", "ls `id`"),
            ("ls\nrm x", "ls\nrm x"),
            ("ls\r\nrm x", "ls\r\nrm x"),
            ("ls && curl x", "curl"),
            ("ls || curl x", "curl"),
            ("ls | sh", "sh"),
            ("ls & rm x", "rm"),
            ("echo $(rm x)", "echo $(rm x)"),
            ("cat <(rm x)", "cat <(rm x)"),
            ("rm -rf /", "rm"),
            ("/bin/ls", "/bin/ls"),
            ("FOO=1 rm x", "FOO=1"),
            ("(rm x)", "(rm"),
            ("lsblk", "lsblk"),
            ("echo \"a;rm x\"", "rm"),
            ("ls 2>&1&rm x", "rm"),
            ("ls &>out", ">out"),
        ];
        for (command, offending) in cases {
            match check_allowed("s.r", command, &allowed) {
                Err(ActionError::CommandNotAllowed { command: c, .. }) => {
                    assert_eq!(c, offending, "{command:?}")
                }
                other => panic!("{command:?} should be refused, got {other:?}"),
            }
        }
    }

    #[test]
    fn refusal_message_lists_the_allowlist() {
        let err = check_allowed("shell-exec.run", "rm x", &allow(&["ls", "git*"])).expect_err("refused");
        assert_eq!(err.to_string(), "shell-exec.run: command \"rm\" is not allowed: it is not in the allowed commands (\"ls\", \"git*\")");
    }

    #[test]
    fn stderr_tail_keeps_the_end() {
        let long = format!("{}END", "é".repeat(STDERR_TAIL));
        let tail = stderr_tail(&long);
        assert!(tail.starts_with("; stderr: …") && tail.ends_with("END"), "{tail}");
        assert_eq!(stderr_tail("  \n"), "");
    }
}
