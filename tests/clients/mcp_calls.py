"""Calls a worker's tools with the official Python MCP SDK, as a third-party client would.
Usage: python mcp_calls.py URL < calls.json   where calls.json is [[tool, arguments], ...]
Prints one JSON array: first {"tools": [names]} from tools/list, then per call either
{"is_error", "text", "structured"} (a tool result) or {"protocol_error"} (a JSON-RPC error)."""
import asyncio, json, sys
from mcp import Client


async def main():
    calls = json.load(sys.stdin)
    out = []
    async with Client(sys.argv[1]) as c:
        tools = await c.list_tools()
        out.append({"tools": [t.name for t in tools.tools]})
        for name, arguments in calls:
            try:
                r = await c.call_tool(name, arguments)
            except Exception as e:  # the SDK raises on a JSON-RPC error
                out.append({"protocol_error": str(e)})
                continue
            text = "\n".join(getattr(b, "text", "") for b in r.content)
            out.append({"is_error": bool(r.is_error), "text": text, "structured": r.structured_content})
    print(json.dumps(out))


asyncio.run(main())
