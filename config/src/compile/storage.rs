//! Compiles `scheduling.storage`.

use std::path::Path;

use super::{Compiler, DEFAULT_PG_POOL_SIZE, DEFAULT_PG_STATEMENT_TIMEOUT, StorageConfig, duration};
use crate::ai::Secret;
use crate::raw;

impl Compiler<'_> {
    pub(super) fn storage(&mut self, s: Option<&raw::Storage>, data_dir: &Path, cwd: &Path) -> StorageConfig {
        let provider = s.and_then(|s| s.provider.clone()).unwrap_or_else(|| "sqlite".into());
        // Blank is unset: `connection_string: ${DATABASE_URL:-}` with nothing set means the default.
        let conn = s.and_then(|s| s.connection_string.clone()).filter(|c| !c.trim().is_empty());
        match provider.to_ascii_lowercase().as_str() {
            "sqlite" => {
                let path = match conn.as_deref() {
                    None => data_dir.join("lamplighter.db"),
                    Some(c) => {
                        let c = c.trim();
                        let p = c
                            .strip_prefix("Data Source=")
                            .or_else(|| c.strip_prefix("sqlite://"))
                            .or_else(|| c.strip_prefix("sqlite:"))
                            .unwrap_or(c);
                        let p = p.split(['?', ';']).next().unwrap_or(p);
                        cwd.join(p)
                    }
                };
                StorageConfig::Sqlite { path }
            }
            "postgres" | "postgresql" => {
                let at = |k: &'static str| -> Vec<&str> { vec!["scheduling", "storage", k] };
                let url = match conn.as_deref().map(str::trim) {
                    Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => u.to_string(),
                    Some(u) => {
                        let shown = if u.starts_with("Data Source=") { "a SQLite \"Data Source=…\"" } else { "not a postgres:// URL" };
                        self.err(
                            &at("connection_string"),
                            format!("storage provider \"postgres\" needs a postgres:// URL in connection_string; this is {shown}"),
                        );
                        String::new()
                    }
                    None => {
                        self.err(
                            &at("provider"),
                            "storage provider \"postgres\" needs scheduling.storage.connection_string (a postgres:// URL, e.g. ${DATABASE_URL})"
                                .into(),
                        );
                        String::new()
                    }
                };
                let pool_size = match s.and_then(|s| s.pool_size) {
                    None => DEFAULT_PG_POOL_SIZE,
                    Some(n) if (1..=1000).contains(&n) => n,
                    Some(n) => {
                        self.err(&at("pool_size"), format!("pool_size {n} is outside 1–1000"));
                        DEFAULT_PG_POOL_SIZE
                    }
                };
                let statement_timeout = match s.and_then(|s| s.statement_timeout.as_deref()).map(duration) {
                    None => DEFAULT_PG_STATEMENT_TIMEOUT,
                    Some(Ok(d)) if !d.is_zero() => d,
                    Some(Ok(_)) => {
                        self.err(&at("statement_timeout"), "statement_timeout must be more than 0s".into());
                        DEFAULT_PG_STATEMENT_TIMEOUT
                    }
                    Some(Err(e)) => {
                        self.err(&at("statement_timeout"), format!("statement_timeout {e}"));
                        DEFAULT_PG_STATEMENT_TIMEOUT
                    }
                };
                StorageConfig::Postgres { url: Secret::new(url), pool_size, statement_timeout }
            }
            other => {
                self.err(
                    &["scheduling", "storage", "provider"],
                    format!("storage provider \"{other}\" is not supported; use \"sqlite\" or \"postgres\""),
                );
                StorageConfig::Sqlite { path: data_dir.join("lamplighter.db") }
            }
        }
    }
}
