"""tests/router/router_proc.py: starts `dserve router --config PATH` and waits until it answers /health (the router
tests and bench/router_load.py share it)."""
import re
import subprocess
import threading
import time
import urllib.request


def start_router(dserve, config_path, timeout_s=20):
    """(the process, its base URL "http://127.0.0.1:PORT"); its log is drained in the background. Raises when it
    does not start or never becomes healthy within timeout_s (the process is then terminated)."""
    proc = subprocess.Popen([dserve, "router", "--config", config_path], stderr=subprocess.PIPE, text=True)
    port = None
    deadline = time.time() + timeout_s
    while time.time() < deadline and port is None:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
    if port is None:
        proc.terminate()
        raise RuntimeError("the router did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep draining its log
    base = "http://127.0.0.1:%d" % port
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except Exception:
            time.sleep(0.05)
    proc.terminate()
    raise RuntimeError("the router never became healthy")
