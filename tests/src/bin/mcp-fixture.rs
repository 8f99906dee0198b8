//! A stdio MCP server for tests. Tools: `echo {text}`; `note {text}` appends a line to the
//! file named by `$FIXTURE_NOTES` (a side effect a test can count); `fail` answers a tool
//! error; `crash` prints to stderr and exits mid-call. Started with `--refuse`, it prints why
//! to stderr and exits before speaking MCP (a server that never starts).

use std::io::Write;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{ErrorData, ServerHandler, ServiceExt, tool, tool_handler, tool_router};

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Text {
    /// The text.
    text: String,
}

#[derive(Clone)]
struct Fixture;

#[tool_router]
impl Fixture {
    /// Echoes the text back.
    #[tool(description = "Echo the text back")]
    async fn echo(&self, Parameters(a): Parameters<Text>) -> String {
        format!("echo: {}", a.text)
    }

    #[tool(description = "Append the text as a line to the notes file")]
    async fn note(&self, Parameters(a): Parameters<Text>) -> Result<String, ErrorData> {
        let path = std::env::var("FIXTURE_NOTES").map_err(|_| ErrorData::internal_error("FIXTURE_NOTES is not set", None))?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        writeln!(f, "{}", a.text).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok("noted".into())
    }

    #[tool(description = "Always fails")]
    async fn fail(&self) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::error(vec![ContentBlock::text("the fixture failed on purpose")]))
    }

    #[tool(description = "Exits in the middle of the call")]
    async fn crash(&self) -> String {
        eprintln!("fixture: crashing on purpose");
        std::process::exit(3)
    }
}

#[tool_handler(name = "fixture", version = "0.1.0")]
impl ServerHandler for Fixture {}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--refuse") {
        eprintln!("fixture: refusing to start: FIXTURE_KEY is wrong");
        std::process::exit(1);
    }
    eprintln!("fixture: starting");
    match Fixture.serve(rmcp::transport::stdio()).await {
        Ok(service) => {
            let _ = service.waiting().await;
        }
        Err(e) => eprintln!("fixture: {e}"),
    }
}
