//! End-to-end tests: they start the real `lamplighter` binary in a temporary data directory
//! and check what a user would see — runs in the database, exit codes, messages.

// They start the real binaries: that is their job, so they may spawn processes directly.
#![allow(clippy::disallowed_methods)]

mod support;

mod agents;
mod alerts;
mod calendars;
mod chaos;
mod config_cli;
mod conformance;
mod contract;
mod deadlines;
mod deploy;
mod faults;
mod lifecycle;
mod manage_jobs;
mod mcp;
mod notify;
mod oauth;
mod packaging;
mod postgres;
mod real_llm;
mod remote;
mod resources;
mod systemd;
mod tasks;
mod telemetry;
mod together;
mod tour;
mod workflows;
