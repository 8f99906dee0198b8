//! `lampctl`: the MCP client CLI for a lamplighter worker (arrives with the MCP issue).

fn main() {
    eprintln!("lampctl is not implemented yet: it arrives with the MCP control-surface issue");
    std::process::exit(2);
}
