//! Logging setup: human-readable on a terminal, JSON lines for journald and containers.
//! `RUST_LOG` overrides the config's `framework.log_level`.

use tracing_subscriber::EnvFilter;

use crate::LogFormat;

pub(crate) fn init(format: LogFormat, level: Option<&str>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let l = level.unwrap_or("info");
        EnvFilter::new(format!("{l},sqlx=warn,apalis=warn,apalis_sqlite=warn,apalis_core=warn"))
    });
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Human => builder.try_init(),
    };
}
