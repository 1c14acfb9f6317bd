"""Load test of `transformer-mt serve` under abuse: well-formed clients beside hostile ones.

    python scripts/stress_serve.py saved_weights/<run> [--clients 64] [--seconds 60] [--out f.json]
        [-- serve overrides]

A real server is started on 127.0.0.1 (a free port). `--clients` threads send requests back to back for
`--seconds`; every fourth client is hostile and cycles through eight kinds of abuse:

- attention: eight texts of 300 characters with `attention: true` and the server's largest beam;
- surrogate: a text holding a lone UTF-16 surrogate (`"\\ud800"`), which no tokenizer can encode;
- prefix: a prefix far longer than the model's positions;
- hang-up: a long request, then the connection closed before the answer;
- slow body: a body announced by Content-Length and sent a few bytes a second;
- items bomb: a body near the size limit of one list of hundreds of thousands of numbers for texts;
- keys bomb: a body near the size limit of tens of thousands of keys that are not fields;
- never reads: a request for per-head attention (an answer of megabytes), then a connection that reads
  nothing (a small receive buffer) and stays open until the server gives up on it.

The others send one test sentence each and check the answer: 200 with one translation (and whether it
equals the sentence's translation before the load), or 503 with Retry-After. Meanwhile /health is asked
every quarter second, and the server's resident memory is read from /proc. After the load, one more
request must be served. The script exits 1 when any criterion fails: a well-formed request answered with
anything but 200 or 503 + Retry-After, any 5xx other than 503, /health slower than `--health-limit`
seconds or unhealthy, or the request after the load not served.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmark_serve import metrics, start_server, stop_server  # beside this script
from timing import load_warning, machine

from transformer_mt.data import load_split_tsv
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.tables import markdown_table

HOSTILE = ("attention", "surrogate", "prefix", "hang-up", "slow body", "items bomb", "keys bomb",
           "never reads")
BODY_BYTES = 800_000  # the bombs' size: under the default body limit (833,536 bytes)
TCP_CLOSE_WAIT = 8  # tcp_states.h: the peer has closed its side
TIMEOUT = 120.0  # a client's socket timeout: a well-formed request may wait behind a full queue


class Tally:
    """What the clients saw, shared between their threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.failures: list[str] = []  # well-formed requests answered wrongly (kept: the first 20)
        self.same = 0  # well-formed answers equal to the translation before the load
        self.served = 0

    def count(self, kind: str, status: str) -> None:
        with self.lock:
            self.statuses[kind][status] += 1

    def fail(self, why: str) -> None:
        with self.lock:
            if len(self.failures) < 20:
                self.failures.append(why)
            self.statuses["well-formed"]["wrong"] += 1


def request(host: str, port: int, method: str, path: str, body: bytes | None = None,
            timeout: float = TIMEOUT) -> tuple[int, dict[str, str], bytes]:
    """One request on a new connection: (status, headers, body)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def translate(host: str, port: int, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return request(host, port, "POST", "/translate", json.dumps(body).encode())


def well_formed(host: str, port: int, text: str, expected: str, tally: Tally) -> None:
    """One sentence; checks the answer and counts it."""
    try:
        status, headers, raw = translate(host, port, {"text": [text]})
    except OSError as ex:
        tally.fail(f"{text[:40]!r}: {type(ex).__name__} {ex}")
        return
    tally.count("well-formed", str(status))
    if status == 503 and headers.get("retry-after"):
        return
    if status != 200:
        tally.fail(f"{text[:40]!r}: {status} {raw[:200]!r}")
        return
    translations = json.loads(raw).get("translations")
    if not isinstance(translations, list) or len(translations) != 1 or not isinstance(translations[0], str):
        tally.fail(f"{text[:40]!r}: 200 with {raw[:200]!r}")
        return
    with tally.lock:
        tally.served += 1
        tally.same += translations[0] == expected


def hostile(host: str, port: int, kind: str, long_text: str, max_beam: int, tally: Tally, end: float) -> None:
    """One abusive request of `kind`; counts the status it got (or what happened to the connection).
    A slow body stops being sent at `end` (time.monotonic), when the load ends."""
    try:
        if kind == "attention":
            body = {"text": [long_text[:300]] * 8, "attention": True, "beam_size": max_beam}
            status, _, _ = translate(host, port, body)
        elif kind == "surrogate":
            status, _, _ = translate(host, port, {"text": ["la gare \ud800 est"]})
        elif kind == "prefix":
            status, _, _ = translate(host, port, {"text": ["hello"], "prefix": ["le " * 2000]})
        elif kind == "hang-up":
            body = json.dumps({"text": [long_text] * 8, "beam_size": max_beam}).encode()
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(_head(host, len(body)) + body)
            status = "hung up"
        elif kind == "items bomb":
            status, _, _ = request(host, port, "POST", "/translate", b'{"text": [' + b"0," * (BODY_BYTES // 2)
                                   + b"0]}")
        elif kind == "keys bomb":
            keys = ", ".join(f'"k{i}": 0' for i in range(BODY_BYTES // 12))
            status, _, _ = request(host, port, "POST", "/translate", f'{{"text": "a", {keys}}}'.encode())
        elif kind == "never reads":
            status = _never_reads(host, port, long_text, end)
        else:
            status = _slow_body(host, port, min(15.0, max(1.0, end - time.monotonic())))
    except OSError as ex:
        status = type(ex).__name__
    tally.count(kind, str(status))


def _head(host: str, length: int) -> bytes:
    return (f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def _slow_body(host: str, port: int, seconds: float) -> str:
    """Announce a body, then send it two bytes a second until the server answers or `seconds` pass."""
    body = json.dumps({"text": ["a slow body " * 20]}).encode()
    with socket.create_connection((host, port), timeout=1) as sock:
        sock.sendall(_head(host, len(body)))
        end = time.monotonic() + seconds
        for i in range(0, len(body), 2):
            if time.monotonic() > end:
                return "gave up"
            try:
                answer = sock.recv(4096)
                if answer:
                    return answer.split(b" ", 2)[1].decode(errors="replace")
                return "closed"
            except TimeoutError:
                pass
            except OSError:
                return "closed"
            sock.sendall(body[i:i + 2])
    return "sent whole"


def _never_reads(host: str, port: int, long_text: str, end: float) -> str:
    """Ask for an answer of megabytes (eight texts, attention per layer and head), read none of it, and hold
    the connection until the server drops it (its send timeout) or the load ends. Says what came of it:
    the answer's status as far as it arrived (peeked at, never read), and whether the server reset the
    connection, closed it, or held it to the end."""
    body = json.dumps({"text": [long_text[:300]] * 8, "attention": "heads"}).encode()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        sock.settimeout(10)
        sock.connect((host, port))
        sock.sendall(_head(host, len(body)) + body)
        status = "no answer"
        while time.monotonic() < end:
            try:  # a peek that takes nothing off the buffer: the server sees a client that never reads
                head = sock.recv(12, socket.MSG_PEEK)
            except TimeoutError:
                head = None
            except OSError:
                return f"{status}, reset by the server"
            if head == b"":
                return f"{status}, closed by the server"
            if head and head.startswith(b"HTTP/1.1 ") and len(head) == 12:
                status = head[9:12].decode()
            if _peer_closed(sock):  # its FIN behind the unread answer: recv would still find data
                return f"{status}, closed by the server"
            time.sleep(1.0)
    return f"{status}, held to the end"


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the server has closed its side (Linux's TCP_INFO says CLOSE_WAIT); False where unknown."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_CLOSE_WAIT
    except (AttributeError, OSError):
        return False


def watch(host: str, port: int, pid: int, stop: threading.Event, out: dict[str, Any]) -> None:
    """/health every quarter second (slowest answer, any that is not 200) and the server's RSS."""
    out.update(health_max_s=0.0, health_bad=[], health_checks=0, rss_max_mib=0.0)
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            status, _, raw = request(host, port, "GET", "/health", timeout=10)
        except OSError as ex:
            status, raw = 0, str(ex).encode()
        took = time.perf_counter() - t0
        out["health_max_s"] = max(out["health_max_s"], took)
        out["health_checks"] += 1
        if status != 200:
            out["health_bad"].append(f"{status}: {raw[:100]!r}")
        out["rss_max_mib"] = max(out["rss_max_mib"], rss_mib(pid))
        stop.wait(max(0.0, 0.25 - took))


def rss_mib(pid: int) -> float:
    """The process's resident memory now, in MiB (0 where /proc is not there)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_load(host: str, port: int, sentences: list[str], expected: dict[str, str], args: argparse.Namespace,
             max_beam: int, watched: dict[str, Any], pid: int) -> Tally:
    tally = Tally()
    long_text = " ".join(sentences)[: args.long_chars]
    end = time.monotonic() + args.seconds
    stop = threading.Event()

    def client(k: int) -> None:
        i = 0
        while time.monotonic() < end:
            if k % 4 == 0:
                hostile(host, port, HOSTILE[(k // 4 + i) % len(HOSTILE)], long_text, max_beam, tally, end)
            else:
                text = sentences[(k * 7919 + i) % len(sentences)]
                well_formed(host, port, text, expected[text], tally)
            i += 1

    watcher = threading.Thread(target=watch, args=(host, port, pid, stop, watched))
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", help="checkpoint file or run directory (with its split/test.tsv)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sentences", type=int, default=200, help="test sentences the clients send")
    parser.add_argument("--long-chars", type=int, default=1000, help="length of the hostile long text")
    parser.add_argument("--health-limit", type=float, default=1.0, help="slowest /health allowed (s)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="serve overrides (after --)")
    args = parser.parse_args(argv)
    run = Path(args.checkpoint)
    run = run if run.is_dir() else run.parent
    sentences = load_split_tsv(run / SPLIT_DIR / "test.tsv")[0][: args.sentences]
    warning = load_warning()
    server_log = (args.out or Path("stress_serve.json")).with_suffix(".server.log")
    with server_log.open("w") as log:
        proc, host, port = start_server(args.checkpoint, args.overrides, stderr=log)
    try:
        status, _, raw = request(host, port, "GET", "/health")
        max_beam = json.loads(raw)["decoding"]["max_beam_size"] if status == 200 else 1
        expected = {}
        for text in sentences:  # each sentence's translation on an idle server
            status, _, raw = translate(host, port, {"text": [text]})
            expected[text] = json.loads(raw)["translations"][0] if status == 200 else None
        watched: dict[str, Any] = {}
        tally = run_load(host, port, sentences, expected, args, max_beam, watched, proc.pid)
        status, _, raw = translate(host, port, {"text": [sentences[0]]})
        after_ok = status == 200 and json.loads(raw)["translations"] == [expected[sentences[0]]]
        server_metrics = metrics(host, port)
    finally:
        stop_server(proc)
    report = summarize(tally, watched, after_ok, server_metrics, args)
    print(f"machine: {machine()}\nthe server's log: {server_log}")
    if warning:
        print(f"warning: {warning}")
    print(f"{args.clients} clients ({args.clients // 4 + (args.clients % 4 > 0)} hostile) for "
          f"{args.seconds:g} s; overrides: {' '.join(args.overrides) or '(serve defaults)'}\n")
    rows = [[kind, ", ".join(f"{s}: {n}" for s, n in sorted(c.items()))]
            for kind, c in tally.statuses.items()]
    print(markdown_table(["client", "answers (status: count)"], rows))
    print()
    for name, value in report["checks"].items():
        print(f"{'ok  ' if value['ok'] else 'FAIL'} {name}: {value['value']}")
    for why in tally.failures[:5]:
        print(f"  e.g. {why}")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "warning": warning, **report}, indent=2) + "\n")
    return 0 if all(v["ok"] for v in report["checks"].values()) else 1


def summarize(tally: Tally, watched: dict[str, Any], after_ok: bool, server_metrics: dict[str, Any],
              args: argparse.Namespace) -> dict[str, Any]:
    """The criteria, each with its value and whether it holds, and the raw counts."""
    well = tally.statuses["well-formed"]
    server_errors = sum(n for c in tally.statuses.values() for s, n in c.items()
                        if s.startswith("5") and s != "503")
    checks = {
        "well-formed requests answered (200) or refused with 503 + Retry-After": {
            "ok": well["wrong"] == 0 and tally.served > 0,
            "value": f"{tally.served} served, {well['503']} refused, {well['wrong']} wrong"},
        "answers with a 5xx other than 503": {"ok": server_errors == 0, "value": server_errors},
        f"slowest /health (limit {args.health_limit:g} s)": {
            "ok": watched["health_max_s"] <= args.health_limit and not watched["health_bad"],
            "value": f"{watched['health_max_s']:.3f} s over {watched['health_checks']} checks"
                     + (f", {len(watched['health_bad'])} not 200 (e.g. {watched['health_bad'][0]})"
                        if watched["health_bad"] else "")},
        "a request after the load served as before it": {"ok": after_ok, "value": after_ok},
        "server's peak resident memory": {"ok": True, "value": f"{watched['rss_max_mib']:.0f} MiB"},
    }
    return {"clients": args.clients, "seconds": args.seconds, "checks": checks,
            "statuses": {k: dict(v) for k, v in tally.statuses.items()},
            "same_as_before_load": tally.same, "served": tally.served, "failures": tally.failures,
            "rss_max_mib": watched["rss_max_mib"], "health_max_s": watched["health_max_s"],
            "server_requests": server_metrics.get("requests")}


if __name__ == "__main__":
    sys.exit(main())
