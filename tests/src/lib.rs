//! Fixtures the test suites share: a scripted OpenAI-compatible server ([`llm`]), a throwaway
//! PostgreSQL cluster ([`pg`]) and a stdio MCP server (the `mcp-fixture` binary). End-to-end
//! tests live in `tests/e2e/`.

pub mod llm;
pub mod pg;
