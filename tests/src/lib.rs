//! Fixtures the test suites share: storage faults under a live process ([`faultfs`]), a scripted OpenAI-compatible server ([`llm`]), a real OTLP
//! receiver ([`otlp`]), a throwaway
//! PostgreSQL cluster ([`pg`]), starting the worker until it says it is ready ([`proc`]), snapshot
//! files ([`snapshot`]), what the machine must have ([`setup`]), a webhook receiver
//! ([`webhook`]) and a stdio MCP server (the
//! `mcp-fixture` binary). End-to-end
//! tests live in `tests/e2e/`.

pub mod faultfs;
pub mod llm;
pub mod otlp;
pub mod pg;
pub mod pki;
pub mod proc;
pub mod proxy;
pub mod setup;
pub mod snapshot;
pub mod webhook;
