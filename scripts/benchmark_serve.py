"""Load test of `transformer-mt serve`: N concurrent clients, one sentence per request, batching on and off.

    python scripts/benchmark_serve.py saved_weights/<run> [--clients 32] [--requests 16] [--out f.json]
        [-- serve overrides, e.g. decoding.beam_size=1]

For each mode a real server is started on 127.0.0.1 (a free port), warmed up, and loaded by `--clients`
threads, each sending `--requests` single-sentence requests back to back over its own connection
(sentences from the run's test split). Reported: sentences/s over the whole load, p50/p95 latency per
request, and the mean decoding batch the server saw (from its /metrics). The clients share the
machine's cores with the server in both modes, so the ratio is what a single machine gets.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from timing import load_warning, machine  # beside this script

from transformer_mt.data import load_split_tsv
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.tables import markdown_table

MODES = {"batching on": "batching.enabled=true", "batching off": "batching.enabled=false"}


def start_server(checkpoint: str, overrides: list[str],
                 stderr: Any = None) -> tuple[subprocess.Popen, str, int]:
    """A `transformer-mt serve` process on a free port (its log to `stderr`, by default this process's);
    its host and port once it accepts connections."""
    command = [sys.executable, "-m", "transformer_mt", "serve", f"checkpoint={checkpoint}", "port=0",
               *overrides]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"http://([\d.]+):(\d+)/", line)
    if not found:
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return proc, found.group(1), int(found.group(2))


def post(conn: http.client.HTTPConnection, body: dict) -> dict:
    conn.request("POST", "/translate", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = json.loads(response.read())
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {data}")
    return data


def load(host: str, port: int, sentences: list[str], clients: int, requests: int) -> dict:
    """Every client sends `requests` one-sentence requests in turn; latencies and wall time."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start_line = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=300)
        mine = []
        start_line.wait()
        for i in range(requests):
            text = sentences[(k * requests + i) % len(sentences)]
            t0 = time.perf_counter()
            try:
                post(conn, {"text": [text]})
            except (OSError, RuntimeError) as ex:
                errors.append(str(ex))
                return
            mine.append(time.perf_counter() - t0)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    start_line.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, e.g. {errors[0]}")
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"sentences": len(latencies), "seconds": wall, "sent_s": len(latencies) / wall,
            "p50_ms": 1000 * cuts[49], "p95_ms": 1000 * cuts[94]}


def metrics(host: str, port: int) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/metrics")
    data = json.loads(conn.getresponse().read())
    conn.close()
    return data


def measure(checkpoint: str, mode: str, extra: list[str], sentences: list[str], clients: int,
            requests: int) -> dict:
    proc, host, port = start_server(checkpoint, [MODES[mode], *extra])
    try:
        conn = http.client.HTTPConnection(host, port, timeout=300)
        for text in sentences[:8]:  # warm-up: first calls allocate and tune kernels
            post(conn, {"text": [text]})
        conn.close()
        before = metrics(host, port)
        result = load(host, port, sentences, clients, requests)
        after = metrics(host, port)  # a new connection: the server closes idle ones after 5 s
        batches = after["batches"] - before["batches"]
        result["mean_batch"] = result["sentences"] / batches if batches else 0.0
        return result
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen) -> None:
    """Ctrl-C the server, and kill it if it has not stopped within 30 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", help="checkpoint file or run directory (with its split/test.tsv)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=16, help="requests per client")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="serve overrides for both modes (after --)")
    args = parser.parse_args(argv)
    run = Path(args.checkpoint)
    run = run if run.is_dir() else run.parent
    sentences, _ = load_split_tsv(run / SPLIT_DIR / "test.tsv")
    warning = load_warning()
    results = {mode: measure(args.checkpoint, mode, args.overrides, sentences, args.clients, args.requests)
               for mode in MODES}
    speedup = results["batching on"]["sent_s"] / results["batching off"]["sent_s"]
    print(f"machine: {machine()}")
    if warning:
        print(f"warning: {warning}")
    print(f"{args.clients} clients x {args.requests} one-sentence requests; overrides: "
          f"{' '.join(args.overrides) or '(serve defaults)'}\n")
    rows = [[mode, f"{r['sent_s']:.1f}", f"{r['p50_ms']:.0f}", f"{r['p95_ms']:.0f}", f"{r['mean_batch']:.1f}"]
            for mode, r in results.items()]
    header = ["mode", "sentences/s", "p50 latency (ms)", "p95 latency (ms)", "mean decoding batch"]
    print(markdown_table(header, rows))
    print(f"\ncross-request batching: {speedup:.2f}x the sentences/s of batching off")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "clients": args.clients,
                                        "requests_per_client": args.requests, "overrides": args.overrides,
                                        "results": results, "speedup": speedup, "warning": warning},
                                       indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
