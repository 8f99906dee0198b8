//! End-to-end tests: they start the real `lamplighter` binary in a temporary data directory
//! and check what a user would see — runs in the database, exit codes, messages.

mod support;

mod config_cli;
mod lifecycle;
