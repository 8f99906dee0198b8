//! `shell-exec.run`: runs a command line through `sh -c`, after checking it against the
//! context's allowlist with the Linggen rules.
//!
//! The allowlist, when not empty:
//! - refuses `$(`, backticks, `<(`, `>(`, `${`, backslashes, newlines and carriage returns
//!   anywhere in the line, quoted or not, since they run commands the segment check cannot see
//!   (or, for a backslash, change how `sh` reads what this check sees);
//! - reads the line as `sh` does: quotes (`'…'`, `"…"`) group words, and the line is split
//!   into segments on the operators outside quotes, `|`, `;` and `&` (so `||`, `&&`, `|&` and a
//!   background `&` too, but not the `&` of `2>&1` or `>&2`); a quote left open is refused;
//! - requires every non-empty segment to match a pattern, by the seed's rule, on the segment's
//!   words as `sh` will pass them (quotes removed, by `shell-words`, joined by one space): a
//!   pattern is an exact match, ASCII case ignored (`git status` allows only `git status`; `git`
//!   only a bare `git`), or `prefix*`, a segment that starts with `prefix` (`dotnet build*`
//!   allows `dotnet build --configuration Release`). Words are split on space and tab only, as
//!   `sh` splits them, so a no-break space cannot hide a second word.
//!
//! Deliberately conservative choices, documented rather than worked around:
//! - Redirections (`>`, `>>`, `<`) are not checked: the seed's rules restrict which programs
//!   start, not which files they touch, and `ls > notes.txt` is ordinary use (under `ls*`). A
//!   command that may write anywhere is contained by the operating system user the worker runs
//!   as, not by this list. File plugins, not the shell, are what confine paths to the working
//!   directory.
//! - A background `&` is a separator like `;`, so what follows it is checked too; anything left
//!   running in the background is killed with the process group when the call ends.
//! - A `#` comment is checked like the rest of its line.
//!
//! An empty allowlist allows any command, as in the seed.

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
    // An escape changes how `sh` splits what this check sees (`echo \\>& rm x` runs `rm`).
    ("\\", "backslash escapes are not allowed"),
    // `${x=…}` and `${PATH:…}` evaluate arbitrary expressions in some shells.
    ("${", "parameter expansion \"${\" is not allowed"),
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

    let timeout = Duration::from_secs(seconds);
    let output = match process::run("sh", &["-c", command], &ctx.working_directory, &[], timeout, &ctx.cancel, ctx.output.as_ref()).await {
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
    let Some(segments) = segments(command) else {
        return Err(refuse(command, "a quote is left open".to_owned()));
    };
    for segment in segments {
        let Ok(words) = shell_words::split(segment) else {
            return Err(refuse(segment.trim(), "its quoting does not parse".to_owned()));
        };
        // `shell-words` also splits on a newline, which `FORBIDDEN` keeps out; any other blank
        // it does not split on stays inside the word, as `sh` keeps it.
        if words.is_empty() || split_words(segment).is_empty() {
            continue;
        }
        if !allowed.iter().any(|pattern| matches_pattern(pattern, &words)) {
            let list = allowed.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(", ");
            return Err(refuse(segment.trim(), format!("it matches none of the allowed commands ({list})")));
        }
    }
    Ok(())
}

/// Splits on `|`, `;` and `&` outside quotes (so `&&` and `||` too), except an `&` between
/// `>`/`<` and a digit or `-`, which duplicates a file descriptor (`2>&1`, `>&2`) rather than
/// separating commands. `None` when a quote is left open. (Backslashes never reach here.)
fn segments(command: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut previous = None;
    let mut quote: Option<char> = None;
    for (i, c) in command.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None => {
                let duplicates =
                    matches!(previous, Some('>' | '<')) && command[i + 1..].chars().next().is_some_and(|n| n.is_ascii_digit() || n == '-');
                if matches!(c, '|' | ';') || (c == '&' && !duplicates) {
                    out.push(&command[start..i]);
                    start = i + c.len_utf8();
                }
            }
        }
        previous = Some(c);
    }
    if quote.is_some() {
        return None;
    }
    out.push(&command[start..]);
    Some(out)
}

/// The characters `sh` separates words with. Other whitespace (a no-break space, a vertical
/// tab) is part of a word for `sh`, and so it is here.
const BLANKS: [char; 2] = [' ', '\t'];

fn split_words(text: &str) -> Vec<&str> {
    text.split(BLANKS).filter(|w| !w.is_empty()).collect()
}

/// The seed's rule: `prefix*` matches a segment starting with `prefix`; any other pattern
/// matches the whole segment. Blanks are collapsed on both sides and ASCII case is ignored.
fn matches_pattern(pattern: &str, words: &[String]) -> bool {
    // A path as the program (`mkdir/../../bin/sh` under `mkdir*`) runs something else than the
    // pattern names, unless the pattern itself names a path.
    let pattern_program = split_words(pattern).first().map(|w| w.trim_end_matches('*')).unwrap_or_default();
    if words.first().is_some_and(|w| w.contains('/')) && !pattern_program.contains('/') {
        return false;
    }
    let segment = words.join(" ");
    match pattern.trim_start_matches(BLANKS).strip_suffix('*') {
        // `git *` keeps its blank: `git` with arguments, not `gitk`.
        Some(prefix) => {
            let prefix = collapse(prefix);
            segment.len() >= prefix.len() && segment.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
        }
        None => split_words(pattern).join(" ").eq_ignore_ascii_case(&segment),
    }
}

/// Runs of blanks as one space, a trailing one kept.
fn collapse(text: &str) -> String {
    let mut out = split_words(text).join(" ");
    if text.ends_with(BLANKS) && !out.is_empty() {
        out.push(' ');
    }
    out
}

/// What a pattern without `*` allows now that the seed's exact rule applies, for a config
/// whose one-word pattern (`git`) once allowed any arguments: `None` for a pattern that meant
/// the same under both readings.
pub fn loose_pattern_warning(pattern: &str) -> Option<String> {
    let words = split_words(pattern);
    if pattern.trim_end().ends_with('*') || words.len() != 1 {
        return None;
    }
    let word = words[0];
    Some(format!(
        "allowed_commands pattern \"{pattern}\" allows only the bare command \"{word}\", with no arguments (an exact match, as in the seed); to allow arguments write \"{word} *\""
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn allowlist_allows_listed_commands() {
        let allowed = allow(&["ls*", "git *", "ECHO*", "grep*", "date"]);
        for ok in [
            "ls",
            "ls -la",
            "LS /tmp",
            "git status",
            "echo hi",
            "date",
            "DATE",
            "ls | grep x",
            "ls; echo done",
            "ls && echo ok",
            "ls || echo no",
            "  ls  ",
            "\tls\t-la",
            "ls 2>&1 | grep x",
            "echo err >&2",
            "ls > listing.txt",
            "ls &",
            "ls;",
        ] {
            assert_eq!(check_allowed("s.r", ok, &allowed), Ok(()), "{ok:?}");
        }
        assert_eq!(check_allowed("s.r", "anything at all; rm -rf /", &[]), Ok(()));
    }

    /// The seed's rule: a pattern without `*` is an exact match of the whole command, so a
    /// one-word pattern no longer allows arguments (`git` does not allow `git push --force`);
    /// `git *` allows git with arguments but not `gitk`.
    #[test]
    fn a_pattern_without_a_star_is_an_exact_match() {
        let allowed = allow(&["git", "date", "git *"]);
        assert_eq!(check_allowed("s.r", "git", &allowed), Ok(()));
        assert_eq!(check_allowed("s.r", "git push --force", &allowed), Ok(()), "under `git *`");
        let exact = allow(&["git", "date"]);
        for refused in ["git push --force", "date -u", "gitk", "datex"] {
            match check_allowed("s.r", refused, &exact) {
                Err(ActionError::CommandNotAllowed { command, .. }) => assert_eq!(command, refused),
                other => panic!("{refused:?} should be refused, got {other:?}"),
            }
        }
        assert!(check_allowed("s.r", "gitk", &allow(&["git *"])).is_err());
        assert_eq!(
            loose_pattern_warning("git").as_deref(),
            Some(
                "allowed_commands pattern \"git\" allows only the bare command \"git\", with no arguments (an exact match, as in the seed); to allow arguments write \"git *\""
            )
        );
        for fine in ["git*", "git *", "git status", "dotnet build*"] {
            assert_eq!(loose_pattern_warning(fine), None, "{fine}");
        }
    }

    /// Quotes group words as `sh` groups them: an operator inside quotes is an argument, not a
    /// separator, and the words matched are those `sh` passes (quotes removed).
    #[test]
    fn quoting_is_read_as_sh_reads_it() {
        let allowed = allow(&["sh -c*", "echo*", "ls*"]);
        for ok in [
            "sh -c 'for i in 1 2; do echo $i; done'",
            "echo \"a;b\"",
            "echo 'a|b' && ls",
            "echo 'a && b' \"c || d\"",
            "'ls' -la",
            "\"echo\" hi",
            "e'ch'o hi",
            "echo ''",
        ] {
            assert_eq!(check_allowed("s.r", ok, &allowed), Ok(()), "{ok:?}");
        }
        // Hostile quoting: every command that runs is still checked.
        let cases = [
            ("echo 'a'; rm x", "rm x"),
            ("echo \"a\";rm x", "rm x"),
            ("echo 'a;'b'';rm x", "rm x"),
            ("echo \"'\"; rm x", "rm x"),
            ("echo '\"'; rm x", "rm x"),
            ("echo 'unclosed; rm x", "echo 'unclosed; rm x"),
            ("echo \"unclosed; rm x", "echo \"unclosed; rm x"),
            ("echo \"$(rm x)\"", "echo \"$(rm x)\""),
            ("echo \"`rm x`\"", "echo \"`rm x`\""),
            ("echo 'a\\'; rm x", "echo 'a\\'; rm x"),
            ("'rm' x", "'rm' x"),
            ("r'm' x", "r'm' x"),
            ("'/bin/sh' -c id", "'/bin/sh' -c id"),
            ("ls | 'sh'", "'sh'"),
            ("ls \"&\" & rm x", "rm x"),
        ];
        for (command, offending) in cases {
            match check_allowed("s.r", command, &allowed) {
                Err(ActionError::CommandNotAllowed { command: c, .. }) => assert_eq!(c, offending, "{command:?}"),
                other => panic!("{command:?} should be refused, got {other:?}"),
            }
        }
    }

    /// The seed's own patterns (`reference/gantri-config/agents/coding-*.yaml`) have spaces.
    #[test]
    fn multi_word_patterns_match_the_start_of_the_segment() {
        let allowed = allow(&["dotnet build*", "npm run build*", "cargo test*", "git status", "mkdir*"]);
        for ok in [
            "dotnet build",
            "dotnet build --configuration Release",
            "DOTNET  Build -c Release",
            "npm run build",
            "cargo test -p lamplighter-plugins && git status",
            "git status",
            "GIT\tSTATUS",
            "mkdir -p out/x",
        ] {
            assert_eq!(check_allowed("s.r", ok, &allowed), Ok(()), "{ok:?}");
        }
        for (command, offending) in [
            ("dotnet publish", "dotnet publish"),
            ("dotnet", "dotnet"),
            ("npm run test", "npm run test"),
            ("npm install", "npm install"),
            ("git status --short", "git status --short"),
            ("git push", "git push"),
            ("cargo test; cargo publish", "cargo publish"),
        ] {
            match check_allowed("s.r", command, &allowed) {
                Err(ActionError::CommandNotAllowed { command: c, .. }) => assert_eq!(c, offending, "{command:?}"),
                other => panic!("{command:?} should be refused, got {other:?}"),
            }
        }
    }

    /// Regression: patterns with a space never matched, since only the first word was compared,
    /// so `deploy/quickstart/lamplighter.yaml`'s own job was refused.
    #[test]
    fn quickstart_job_with_multi_word_prefixes_is_allowed() {
        let allowed = allow(&["git log*", "git status*", "date*"]);
        let command =
            "date -u > data/repo-report.txt && git log --oneline -5 >> data/repo-report.txt && git status --short >> data/repo-report.txt";
        assert_eq!(check_allowed("s.r", command, &allowed), Ok(()));
    }

    /// Each attempt is refused, and the error names the part that was refused: the whole line
    /// for a forbidden construct, else the first segment that matches no pattern.
    #[test]
    fn allowlist_rejects_injection_attempts() {
        let allowed = allow(&["ls", "ls *", "echo", "echo *", "git*", "cat", "cat *"]);
        let cases = [
            // separators, spaced and unspaced
            ("ls; rm -rf /", "rm -rf /"),
            ("ls;rm x", "rm x"),
            ("ls && curl x", "curl x"),
            ("ls&&curl x", "curl x"),
            ("ls || curl x", "curl x"),
            ("ls||curl x", "curl x"),
            ("ls | sh", "sh"),
            ("ls|sh", "sh"),
            ("ls |& sh", "sh"),
            ("ls & rm x", "rm x"),
            ("ls 2>&1&rm x", "rm x"),
            ("ls >&2; rm x", "rm x"),
            ("ls ; ; rm x", "rm x"),
            ("ls && echo ok || rm -rf ~", "rm -rf ~"),
            ("echo ok | xargs rm", "xargs rm"),
            ("ls | tee /etc/cron.d/x", "tee /etc/cron.d/x"),
            ("git status; RM x", "RM x"),
            // found in review: an escaped `>` before `&`, a path as the program, `${…}`
            ("echo \\>& rm -rf x", "echo \\>& rm -rf x"),
            ("echo \\<& rm -rf x", "echo \\<& rm -rf x"),
            ("echo >& rm -rf x", "rm -rf x"),
            ("git init git && git/../../../../bin/sh -c id", "git/../../../../bin/sh -c id"),
            ("ls ${x=a[\\$\\(id\\)]} ${PATH:x}", "ls ${x=a[\\$\\(id\\)]} ${PATH:x}"),
            ("ls ${IFS}", "ls ${IFS}"),
            // command and process substitution, anywhere
            ("ls $(whoami)", "ls $(whoami)"),
            ("echo $(rm x)", "echo $(rm x)"),
            ("echo ${IFS}$(id)", "echo ${IFS}$(id)"),
            ("echo $((1+1))", "echo $((1+1))"),
            ("ls `id`", "ls `id`"),
            ("echo `rm x`", "echo `rm x`"),
            ("cat <(rm x)", "cat <(rm x)"),
            ("ls >(rm x)", "ls >(rm x)"),
            // line breaks
            ("ls\nrm x", "ls\nrm x"),
            ("ls\r\nrm x", "ls\r\nrm x"),
            ("ls\rrm x", "ls\rrm x"),
            ("ls <<EOF\nx\nEOF", "ls <<EOF\nx\nEOF"),
            // a first word that is not the allowed command
            ("rm -rf /", "rm -rf /"),
            ("/bin/ls", "/bin/ls"),
            ("./ls", "./ls"),
            ("\\ls", "\\ls"),
            ("FOO=1 rm x", "FOO=1 rm x"),
            ("env rm x", "env rm x"),
            ("sudo ls", "sudo ls"),
            ("exec rm x", "exec rm x"),
            ("eval ls", "eval ls"),
            ("(rm x)", "(rm x)"),
            ("{ rm x; }", "{ rm x"),
            ("!rm x", "!rm x"),
            ("rm${IFS}x", "rm${IFS}x"),
            ("ls${IFS}&&${IFS}rm", "ls${IFS}&&${IFS}rm"),
            ("lsblk", "lsblk"),
            ("ls\u{a0}-la", "ls\u{a0}-la"),
            ("ls\u{b}x", "ls\u{b}x"),
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
        assert_eq!(
            err.to_string(),
            "shell-exec.run: command \"rm x\" is not allowed: it matches none of the allowed commands (\"ls\", \"git*\")"
        );
        let err = check_allowed("shell-exec.run", "ls $(id)", &allow(&["ls"])).expect_err("refused");
        assert_eq!(err.to_string(), "shell-exec.run: command \"ls $(id)\" is not allowed: command substitution \"$(\" is not allowed");
    }

    #[test]
    fn stderr_tail_keeps_the_end() {
        let long = format!("{}END", "é".repeat(STDERR_TAIL));
        let tail = stderr_tail(&long);
        assert!(tail.starts_with("; stderr: …") && tail.ends_with("END"), "{tail}");
        assert_eq!(stderr_tail("  \n"), "");
    }
}
