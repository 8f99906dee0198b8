//! Diagnostics: every problem found while loading a config, with where it is and how to fix it.

use std::fmt;
use std::path::{Path, PathBuf};

/// A place in a config file. Lines and columns are 1-based, as editors show them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.col)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One finding. `message` names the item, says what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Where the problem is, when it can be pinned to a file.
    pub location: Option<Location>,
    pub message: String,
}

impl Diagnostic {
    pub fn error(location: Option<Location>, message: impl Into<String>) -> Self {
        Self { severity: Severity::Error, location, message: message.into() }
    }

    pub fn warning(location: Option<Location>, message: impl Into<String>) -> Self {
        Self { severity: Severity::Warning, location, message: message.into() }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        match &self.location {
            Some(loc) => write!(f, "{loc}: {level}: {}", self.message),
            None => write!(f, "{level}: {}", self.message),
        }
    }
}

/// All the errors of one load, in file order. Returned instead of a config when any error
/// was found; warnings found on the way are kept so that they can be shown too.
#[derive(Debug, Clone)]
pub struct ConfigErrors(pub Vec<Diagnostic>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.iter().filter(|d| d.is_error()).count();
        writeln!(f, "{n} error(s) in configuration")?;
        for d in &self.0 {
            writeln!(f, "  {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// "did you mean" for a misspelt name, or an empty string when nothing is close.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let best = candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(name, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((_, c)) => format!(" (did you mean \"{c}\"?)"),
        None => String::new(),
    }
}

/// `"a", "b"` for error messages that list what exists.
pub(crate) fn quoted_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let v: Vec<String> = names.into_iter().map(|n| format!("\"{n}\"")).collect();
    if v.is_empty() { "none".to_string() } else { v.join(", ") }
}

pub(crate) fn display_path(p: &Path) -> String {
    p.display().to_string()
}
