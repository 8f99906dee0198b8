"""The peer for the MCP benchmark (issue 14): the official Python MCP SDK's server, with the
same two tools and answer shapes as Lamplighter's (`get_job`, `list_jobs` over N jobs), served
over Streamable HTTP with the SDK's defaults.

    python mcp_sdk_server.py PORT [JOBS]      # needs `pip install mcp` (2.x)
"""

import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

port = int(sys.argv[1])
count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
JOBS = [
    {
        "name": f"job-{i:05}",
        "description": None,
        "cron": f"{i % 60} {(i // 60) % 24} 1 1 *",
        "timezone": "UTC",
        "paused": False,
        "target": {"type": "plugin", "plugin": "file-save", "action": "save"},
        "next_fire_at": "2027-01-01T00:00:00Z",
    }
    for i in range(count)
]
BY_NAME = {j["name"]: j for j in JOBS}

server = MCPServer("peer")


@server.tool()
def get_job(name: str) -> dict[str, Any]:
    """One job."""
    return BY_NAME[name]


@server.tool()
def list_jobs(limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
    """Jobs by name, a page at a time."""
    start = int(cursor or 0)
    page = JOBS[start : start + limit]
    nxt = start + limit if start + limit < len(JOBS) else None
    return {"jobs": page, "next_cursor": None if nxt is None else str(nxt)}


server.run("streamable-http", host="127.0.0.1", port=port)
