# `tools/list` as a 2026-07-28 client pays for it (BENCHMARKS.md, issue 54): bytes on the wire and time,
# over one keep-alive connection to a worker with one job. Usage: tools_list.py LAMPLIGHTER_BIN PORT N
import http.client, json, os, subprocess, sys, tempfile, time
bin_, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = tempfile.mkdtemp()
open(f"{d}/lamplighter.yaml", "w").write(f"""framework: {{data_dir: {d}/data}}
worker: {{mcp: {{port: {port}, manage_jobs: {{enabled: true}}}}}}
scheduling:
  jobs:
    nightly: {{cron: "0 3 * * *", plugin: file-save, action: save, parameters: {{path: a, content: b}}}}
""")
p = subprocess.Popen([bin_, "run", "--config", f"{d}/lamplighter.yaml"], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
try:
    for _ in range(100):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port); c.request("GET", "/readyz"); r = c.getresponse(); r.read()
            if r.status == 200: break
        except OSError: pass
        time.sleep(0.1)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}
    c = http.client.HTTPConnection("127.0.0.1", port)
    times = []; size = 0; tools = 0
    for i in range(n + 20):
        t = time.perf_counter(); c.request("POST", "/mcp", body, h); r = c.getresponse(); data = r.read(); dt = time.perf_counter() - t
        assert r.status == 200, (r.status, data[:200])
        if i >= 20: times.append(dt * 1000)
        size = len(data); tools = len(json.loads(data)["result"]["tools"])
    times.sort()
    print(json.dumps({"bin": bin_, "tools": tools, "bytes": size, "p50_ms": round(times[len(times)//2], 3), "p99_ms": round(times[int(len(times)*0.99)], 3)}))
finally:
    p.terminate(); p.wait()
