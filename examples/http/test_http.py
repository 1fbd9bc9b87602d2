"""End-to-end test of the HTTP example (built on the redis_rl package): a real redis-server
with the module, several service instances on loopback, real HTTP requests.

    pip install ./clients/python
    REDIS_SERVER=redis-server RL_MODULE=target/release/libredis_rl.so python3 test_http.py

Checks that the fleet-wide limit holds across instances (the N-replicas problem), that 429
replies carry Retry-After and the RateLimit fields, that 413 answers a request that can never
pass, that the local fast path answers floods without Redis, and that fail-open and
fail-closed behave as documented when Redis stops. Ends with "N passed, N failed".
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(f"test {name} ... {'ok' if ok else 'FAILED ' + detail}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, deadline=20):
    end = time.time() + deadline
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def get(port, path="/api/thing", key="customer-1", cost=None):
    headers = {"X-API-Key": key}
    if cost is not None:
        headers["X-Cost"] = str(cost)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def main():
    tmp = tempfile.mkdtemp(prefix="rl-http-")
    redis_port = free_port()
    module = os.environ.get("RL_MODULE", os.path.join(ROOT, "target/release/libredis_rl.so"))
    redis_proc = subprocess.Popen(
        [os.environ.get("REDIS_SERVER", "redis-server"), "--port", str(redis_port), "--bind", "127.0.0.1",
         "--save", "", "--dir", tmp, "--logfile", os.path.join(tmp, "redis.log"), "--loadmodule", module],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    services = []
    try:
        wait_port(redis_port)
        url = f"redis://127.0.0.1:{redis_port}/0"

        def start(*extra):
            port = free_port()
            logf = open(os.path.join(tmp, f"service-{port}.log"), "w")
            p = subprocess.Popen([sys.executable, os.path.join(HERE, "server.py"), "--port", str(port),
                                  "--redis-url", url, "--key-limit", "10", "1", "60", "--ip-limit", "100", "60",
                                  *extra], stdout=logf, stderr=subprocess.STDOUT)
            services.append(p)
            wait_port(port)
            return port, logf.name

        a, a_log = start("--fail-mode", "open")
        b, b_log = start("--fail-mode", "closed")

        # The fleet problem: 30 requests alternating between two instances admit the key's
        # burst of 10 in all, not 10 per instance.
        statuses = [get(a if i % 2 == 0 else b)[0] for i in range(30)]
        check("fleet_wide_limit_holds_across_instances", statuses.count(200) == 10 and statuses.count(429) == 20,
              str(statuses))
        status, headers, body = get(b)
        check("429_has_retry_after_and_json", status == 429 and headers.get("Retry-After") == "60"
              and json.loads(body)["error"] == "rate_limited", str(headers))
        check("429_has_ratelimit_fields",
              headers.get("RateLimit-Policy") == '"api";q=10;w=600, "ip";q=100;w=60'
              and headers.get("RateLimit", "").startswith('"api";r=0;t='), str(headers))
        # The per-IP limit is one bucket for the address whatever the API key (a client cannot
        # dodge it by changing keys): the 10 requests admitted above and this one leave 89.
        status, headers, _ = get(a, key="customer-2")
        check("allowed_reply_has_fields",
              status == 200 and headers.get("RateLimit", "").startswith('"api";r=9;t=60, "ip";r=89;t='),
              str(headers))
        status, headers, body = get(a, key="customer-4", cost=11)
        check("413_for_a_request_that_can_never_pass",
              status == 413 and "Retry-After" not in headers and json.loads(body)["error"] == "request_too_large",
              f"{status} {headers}")

        # The local fast path: the deny cache answers a flood by itself once the key is
        # denied (one Redis call per admitted request and one for the first denial).
        c, _ = start("--fail-mode", "closed")
        flood = [get(c, key="flooder")[0] for _ in range(40)]
        metrics = json.loads(get(c, "/metrics")[2])
        check("local_fast_path_answers_floods",
              flood.count(200) == 10 and metrics["denied_locally"] >= 25 and metrics["redis_calls"] <= 12,
              f"{flood} {metrics}")

        # Redis goes away: fail-open lets requests through, fail-closed answers 503; both log
        # and count it.
        subprocess.run(["redis-cli", "-p", str(redis_port), "SHUTDOWN", "NOSAVE"], capture_output=True)
        redis_proc.wait(timeout=10)
        s_open = get(a, key="customer-3")[0]
        s_closed = get(b, key="customer-3")[0]
        m_open = json.loads(get(a, "/metrics")[2])
        m_closed = json.loads(get(b, "/metrics")[2])
        check("fail_open_allows_when_redis_is_down", s_open == 200 and m_open["degraded"] >= 1, f"{s_open} {m_open}")
        check("fail_closed_denies_when_redis_is_down", s_closed == 503 and m_closed["degraded"] >= 1,
              f"{s_closed} {m_closed}")
        time.sleep(0.2)
        check("failures_are_logged", "policy open" in open(a_log).read() and "policy closed" in open(b_log).read())
    finally:
        for p in services:
            p.kill()
            p.wait()
        if redis_proc.poll() is None:
            redis_proc.kill()
            redis_proc.wait()
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
