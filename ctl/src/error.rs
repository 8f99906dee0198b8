//! lampctl's failures and the exit code each one maps to. Callers branch on the kind of
//! failure, never on message text; the message is what the person reads, one line that says
//! what to do.

use std::fmt;

/// Why a command failed. Each kind has one exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The worker answered and said no: a tool error (unknown job, run not cancellable), an
    /// unknown tool, arguments the tool rejects, or a waited-for run that did not succeed. Exit 1.
    WorkerSaidNo,
    /// The command line was wrong (clap reports most of these itself). Exit 2.
    Usage,
    /// The worker could not be reached, did not answer like an MCP worker, or refused the
    /// token. Exit 3.
    Unreachable,
    /// Ctrl-C while waiting. Exit 130, as a shell reports a SIGINT.
    Interrupted,
    /// Something failed on this machine (stdout closed with an error, no runtime). Exit 1.
    Local,
    /// A followed or waited-for run ended without succeeding, or stopped to wait for a
    /// decision: its own code, so a script can tell how it ended ([`RunEnd`]).
    Run(RunEnd),
}

/// How a followed run ended, when not with success (`runs follow`, `--wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// Exit 4.
    Failed,
    /// Exit 5.
    TimedOut,
    /// Exit 6.
    Cancelled,
    /// Waits for approval (or more budget): exit 7.
    WaitingApproval,
    /// Interrupted (a retry may follow) or skipped: exit 8.
    Other,
}

impl Failure {
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Self::WorkerSaidNo | Self::Local => 1,
            Self::Usage => 2,
            Self::Unreachable => 3,
            Self::Interrupted => 130,
            Self::Run(RunEnd::Failed) => 4,
            Self::Run(RunEnd::TimedOut) => 5,
            Self::Run(RunEnd::Cancelled) => 6,
            Self::Run(RunEnd::WaitingApproval) => 7,
            Self::Run(RunEnd::Other) => 8,
        }
    }
}

/// A failure with the message to show after `lampctl: `.
#[derive(Debug)]
pub(crate) struct CtlError {
    failure: Failure,
    message: String,
}

impl CtlError {
    pub(crate) fn new(failure: Failure, message: impl Into<String>) -> Self {
        Self { failure, message: message.into() }
    }

    pub(crate) fn exit_code(&self) -> u8 {
        self.failure.exit_code()
    }
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CtlError {}

/// `text` on one line (control characters and line breaks become spaces) and at most `max`
/// characters, for details quoted from elsewhere (an HTTP body, an error chain).
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let flat = flat.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_has_its_documented_exit_code() {
        let codes: Vec<(Failure, u8)> = [
            Failure::WorkerSaidNo,
            Failure::Usage,
            Failure::Unreachable,
            Failure::Interrupted,
            Failure::Local,
            Failure::Run(RunEnd::Failed),
            Failure::Run(RunEnd::TimedOut),
            Failure::Run(RunEnd::Cancelled),
            Failure::Run(RunEnd::WaitingApproval),
            Failure::Run(RunEnd::Other),
        ]
        .into_iter()
        .map(|f| (f, CtlError::new(f, "x").exit_code()))
        .collect();
        assert_eq!(
            codes,
            vec![
                (Failure::WorkerSaidNo, 1),
                (Failure::Usage, 2),
                (Failure::Unreachable, 3),
                (Failure::Interrupted, 130),
                (Failure::Local, 1),
                (Failure::Run(RunEnd::Failed), 4),
                (Failure::Run(RunEnd::TimedOut), 5),
                (Failure::Run(RunEnd::Cancelled), 6),
                (Failure::Run(RunEnd::WaitingApproval), 7),
                (Failure::Run(RunEnd::Other), 8),
            ]
        );
    }

    #[test]
    fn one_line_flattens_and_shortens() {
        assert_eq!(one_line("a\nb\t c", 80), "a b c");
        assert_eq!(one_line("abcdef", 4), "abc…");
        assert_eq!(one_line("abcd", 4), "abcd");
    }
}
