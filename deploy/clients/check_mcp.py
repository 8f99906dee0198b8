"""Drives a lamplighter worker with the official Python MCP SDK (a third-party client): lists
the tools and jobs and reads the first job; given a JOB, triggers it and waits for its end.
Exits non-zero, saying why, when any of that fails.
Usage: python3 check_mcp.py http://127.0.0.1:5100/mcp [JOB]           (Streamable HTTP)
       python3 check_mcp.py stdio CONFIG [LAMPLIGHTER [JOB]]           (launches `lamplighter run --mcp-stdio`)"""
import asyncio, sys
from mcp import Client, StdioServerParameters


def check(ok, what, answer):
    if not ok:
        sys.exit(f"check_mcp: {what}: {answer}")


async def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "stdio":
        server = StdioServerParameters(command=sys.argv[3] if len(sys.argv) > 3 else "lamplighter",
                                       args=["run", "--mcp-stdio", "--config", sys.argv[2]])
        job = sys.argv[4] if len(sys.argv) > 4 else None
    else:
        server = sys.argv[1]
        job = sys.argv[2] if len(sys.argv) > 2 else None
    async with Client(server) as c:
        tools = [t.name for t in (await c.list_tools()).tools]
        check("trigger_job" in tools and "list_jobs" in tools, "the job tools are not listed", tools)
        print("tools:", len(tools), tools[:5])
        r = await c.call_tool("list_jobs", {})
        check(not r.is_error, "list_jobs failed", r.content)
        jobs = [j["name"] for j in r.structured_content["jobs"]]
        check(jobs, "the worker has no jobs to try", r.structured_content)
        print("list_jobs:", jobs)
        r = await c.call_tool("get_job", {"name": jobs[0]})
        check(not r.is_error, f"get_job {jobs[0]} failed", r.content)
        print(f"get_job {jobs[0]}:", r.content[0].text)
        if job is None:
            return
        r = await c.call_tool("trigger_job", {"name": job, "wait": True})
        check(not r.is_error, f"trigger_job {job} failed", r.content)
        status = r.structured_content["run"]["status"]
        print(f"trigger_job {job} wait:", status)
        check(status == "succeeded", f"the run of {job} did not succeed", r.structured_content["run"])

def first_cause(e):
    """The first real error inside the SDK's exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # one line, not the SDK's traceback
        cause = first_cause(e)
        hint = ""
        if len(sys.argv) > 1 and sys.argv[1] == "stdio":
            hint = ("; the worker it launched said why above (a worker already running on this config holds its "
                    "database and port: stop it, or check that one over HTTP)")
        sys.exit(f"check_mcp: the MCP session failed: {type(cause).__name__}: {cause}{hint}")
