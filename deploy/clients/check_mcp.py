"""Drives a lamplighter worker with the official Python MCP SDK (a third-party client).
Usage: python3 check.py http://127.0.0.1:5100/mcp    (Streamable HTTP)
       python3 check.py stdio CONFIG                  (launches `lamplighter run --mcp-stdio`)"""
import asyncio, sys
from mcp import Client, StdioServerParameters

async def main():
    if sys.argv[1] == "stdio":
        server = StdioServerParameters(command=sys.argv[3] if len(sys.argv) > 3 else "lamplighter",
                                       args=["run", "--mcp-stdio", "--config", sys.argv[2]])
    else:
        server = sys.argv[1]
    async with Client(server) as c:
        tools = await c.list_tools()
        print("tools:", len(tools.tools), [t.name for t in tools.tools][:5])
        r = await c.call_tool("list_jobs", {})
        print("list_jobs:", [j["name"] for j in r.structured_content["jobs"]], "is_error", r.is_error)
        r = await c.call_tool("get_job", {"name": "nightly"})
        print("get_job nightly: is_error", r.is_error, "-", r.content[0].text)
        r = await c.call_tool("trigger_job", {"name": "report", "wait": True})
        print("trigger_job wait:", r.structured_content["run"]["status"])
asyncio.run(main())
