"""Keep-alive load with Python's requests (urllib3 underneath), as an app
would use it: one Session per connection, its defaults (no retries).

usage: requests_client.py URL CONNS PERIOD_MS DURATION_MS

CONNS sessions each GET URL every PERIOD_MS (staggered over one period)
for DURATION_MS; prints one JSON line: ok, failed, by error class, the
first errors. A request fails on an exception or a status other than 200.
Used by BenchmarkUntoldKeepAliveClients (e2e/keepalive_clients_bench_linux_test.go).
"""
import json
import sys
import threading
import time

import requests
from requests.adapters import HTTPAdapter

url, conns, period, duration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) / 1000, int(sys.argv[4]) / 1000
lock = threading.Lock()
counts = {"ok": 0, "failed": 0, "by_class": {}, "errors": []}


def record(cls, err=None):
    with lock:
        if cls == "ok":
            counts["ok"] += 1
            return
        counts["failed"] += 1
        counts["by_class"][cls] = counts["by_class"].get(cls, 0) + 1
        if len(counts["errors"]) < 5:
            counts["errors"].append(f"{cls}: {err}")


def run(i, start, end):
    s = requests.Session()
    s.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=1))
    t = start + i * period / conns
    while t < end:
        time.sleep(max(0.0, t - time.monotonic()))
        try:
            r = s.get(url, timeout=5)
            r.content
            record("ok" if r.status_code == 200 else f"status {r.status_code}", r.status_code)
        except requests.exceptions.Timeout as e:
            record("timeout", e)
        except requests.exceptions.ConnectionError as e:
            record("connection", e)
        except Exception as e:  # noqa: BLE001: every failure counts
            record(type(e).__name__, e)
        t += period


start = time.monotonic() + 0.1
threads = [threading.Thread(target=run, args=(i, start, start + duration)) for i in range(conns)]
for th in threads:
    th.start()
for th in threads:
    th.join()
print(json.dumps(counts))
