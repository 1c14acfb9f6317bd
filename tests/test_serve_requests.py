"""`transformer-mt serve` against hostile requests: each request checked on its own (token counts, text
the tokenizer cannot encode), the body's size and time, JSON that nests or counts too far, the Host
allow-list, browsers held to JSON, the request head's size, idle and surplus connections; the port claimed
before the model loads; SIGTERM. Also `translate`'s lines whose prefix does not fit the model."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

import transformer_mt as tmt
from tests.conftest import ROOT, require, run_cli
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import ConfigError

require("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from transformer_mt.serve.app import create_app  # noqa: E402

Served = tuple[subprocess.Popen, int]  # the serve process and its port
LONG = "the cat sleeps on the red chair near the window " * 30  # under 2000 characters, over 255 tokens


def serve_config(run: Path, *overrides: str):
    return tmt.compose("serve", [f"checkpoint={run}", "device=cpu", "device.num_threads=1",
                                 "limits.max_texts=8", "limits.max_chars=2000", *overrides])


@pytest.fixture(scope="module")
def engine(tiny_run: Path) -> Translator:
    return Translator.from_checkpoint(tiny_run, device="cpu", decoding=serve_config(tiny_run).decoding,
                                      amp="off")


@pytest.fixture(scope="module")
def client(tiny_run: Path, engine: Translator) -> Iterator[TestClient]:
    with TestClient(create_app(engine, serve_config(tiny_run, "allowed_hosts=[testserver]"))) as c:
        yield c


def _error(r, status: int, *says: str) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert all(s in error for s in says) and "\n" not in error and "Traceback" not in error, error
    return error


def _still_serves(client: TestClient) -> None:
    assert client.post("/translate", json={"text": ["I am cold."]}).status_code == 200


# -- each request on its own ----------------------------------------------------------------------------
def test_a_text_with_more_tokens_than_the_model_has_positions_is_translated_in_parts_a_prefix_refused_413(
        client: TestClient, engine: Translator) -> None:
    assert len(LONG) <= 2000 and len(engine.vocab.encode_src([LONG.strip()])[0]) > engine.max_input_tokens
    done = client.post("/translate", json={"text": ["I am cold.", LONG]})
    assert done.status_code == 200 and len(done.json()["translations"]) == 2
    # attention is of one sentence: the text goes whole, and one too long for the model is refused
    _error(client.post("/translate", json={"text": LONG, "attention": True}), 413, "text has", "tokens")
    body = {"text": ["a", "b", "c"], "prefix": ["Il", "", LONG]}
    _error(client.post("/translate", json=body), 413, "prefix[2]", "tokens")
    _still_serves(client)


def test_text_the_tokenizer_cannot_encode_is_refused_422_naming_the_field(client: TestClient) -> None:
    headers = {"Content-Type": "application/json"}
    lone = b'{"text": ["I am cold.", "caf\\ud800"]}'  # a lone UTF-16 surrogate: valid JSON, not Unicode text
    _error(client.post("/translate", content=lone, headers=headers), 422, "text[1]", "Unicode")
    prefixed = b'{"text": ["I am cold."], "prefix": ["\\udc00"]}'
    _error(client.post("/translate", content=prefixed, headers=headers), 422, "prefix[0]", "Unicode")
    _still_serves(client)


# -- the body -------------------------------------------------------------------------------------------
def test_a_request_brings_its_own_glossary_and_hears_how_each_term_fared(client: TestClient,
                                                                         engine: Translator) -> None:
    source = "Where is the station?"
    plain = client.post("/translate", json={"text": [source, "Hello."]}).json()
    assert "terms" not in plain
    body = {"text": [source, "Hello."], "glossary": {"station": "gare", "nowhere": "nulle part"}}
    got = client.post("/translate", json=body).json()
    assert "gare" in got["translations"][0] and got["translations"][1] == plain["translations"][1]
    status = "met" if re.search(r"(?<!\w)gare(?!\w)", got["translations"][0], re.I) else "missing"
    assert [[{k: v for k, v in t.items() if k != "reason"} for t in text] for text in got["terms"]] == \
        [[{"source": "station", "target": "gare", "status": status}], []]
    long = {"text": "station", "glossary": {"station": "gare " * 300}}
    refused = client.post("/translate", json=long).json()["terms"][0][0]
    assert refused["status"] == "refused" and "tokens" in refused["reason"]
    assert client.post("/translate", json=body).json() == got  # batched requests of one glossary agree


def test_a_glossary_beyond_the_limits_or_with_an_empty_term_is_refused(client: TestClient) -> None:
    many = {f"w{i}": "x" for i in range(10_000)}
    _error(client.post("/translate", json={"text": "a", "glossary": many}), 413, "10000 terms",
           "limits.max_glossary_terms")
    _error(client.post("/translate", json={"text": "a", "glossary": {"a": "x" * 3000}}), 413,
           "limits.max_chars")
    _error(client.post("/translate", json={"text": "a", "glossary": {"station": "  "}}), 422,
           "empty target side")
    _error(client.post("/translate", json={"text": "a", "glossary": {"station": 3}}), 422, "glossary")


def test_a_body_over_the_limit_is_refused_by_its_length_and_while_it_streams(client: TestClient) -> None:
    big = json.dumps({"text": ["a"], "padding": "x" * 300_000}).encode()
    _error(client.post("/translate", content=big, headers={"Content-Type": "application/json"}), 413,
           "limits.max_texts")
    chunks = iter([b" " * 1024] * 1000)  # no Content-Length: the size is found while reading
    _error(client.post("/translate", content=chunks, headers={"Content-Type": "application/json"}), 413,
           "bytes")
    _still_serves(client)


@pytest.mark.parametrize(("body", "says"), [
    (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
    (b'{"text": ["a"], "beam_size": ' + b"9" * 5000 + b"}", "digits"),
])
def test_json_too_deep_or_a_number_too_long_answers_400(client: TestClient, body: bytes, says: str) -> None:
    _error(client.post("/translate", content=body, headers={"Content-Type": "application/json"}), 400, says)
    _still_serves(client)


# -- who may ask ----------------------------------------------------------------------------------------
def test_a_host_outside_allowed_hosts_is_refused_naming_the_key(tiny_run: Path, engine: Translator) -> None:
    body = {"text": ["I am cold."]}
    with TestClient(create_app(engine, serve_config(tiny_run))) as c:  # the default: loopback names only
        _error(c.post("/translate", json=body), 400, "'testserver'", "allowed_hosts")
        _error(c.get("/health", headers={"Host": "attacker.example:8000"}), 400, "allowed_hosts")
        for host in ("127.0.0.1:8000", "localhost", "[::1]:8000"):
            assert c.post("/translate", json=body, headers={"Host": host}).status_code == 200, host
    open_to_all = serve_config(tiny_run, "host=0.0.0.0", "allowed_hosts=[mt.example.org]")
    with TestClient(create_app(engine, open_to_all), base_url="http://mt.example.org:8000") as c:
        assert c.post("/translate", json=body).status_code == 200
        assert c.get("/health", headers={"Host": "0.0.0.0:8000"}).status_code == 200  # the printed URL
        _error(c.get("/health", headers={"Host": "rebound.example"}), 400, "allowed_hosts")
    with TestClient(create_app(engine, serve_config(tiny_run, "allowed_hosts=[*]"))) as c:
        assert c.post("/translate", json=body).status_code == 200


KEY = "0123456789abcdef-key"


def test_with_an_api_key_only_requests_carrying_it_are_answered(tiny_run: Path, engine: Translator,
                                                                 tmp_path: Path) -> None:
    keyfile = tmp_path / "key"
    keyfile.write_text(f"{KEY}\n", encoding="utf-8")
    body = {"text": ["I am cold."]}
    cfg = serve_config(tiny_run, "allowed_hosts=[testserver]", f"api_key_file={keyfile}")
    with TestClient(create_app(engine, cfg)) as c:
        _error(c.post("/translate", json=body), 401, "API key", "X-API-Key")
        _error(c.post("/translate", json=body, headers={"X-API-Key": KEY[:-1] + "x"}), 401, "API key")
        _error(c.post("/translate", json=body, headers={"Authorization": KEY}), 401, "API key")
        _error(c.get("/metrics"), 401, "API key")
        assert c.post("/translate", json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.post("/translate", json=body, headers={"X-API-Key": KEY}).status_code == 200
        assert c.get("/health").json()["api_key"] is True and c.get("/").status_code == 200  # the page asks


def test_a_server_other_machines_reach_needs_a_key_unless_told_the_network_is_trusted(tiny_run: Path,
                                                                                      tmp_path: Path) -> None:
    from transformer_mt.serve.guard import check_exposure, loopback

    with pytest.raises(ConfigError, match="host=0.0.0.0 lets other machines use the server, and no API key"):
        check_exposure(serve_config(tiny_run, "host=0.0.0.0"))
    check_exposure(serve_config(tiny_run, "host=0.0.0.0", "open_without_key=true"))
    check_exposure(serve_config(tiny_run, "host=0.0.0.0", f"api_key={KEY}"))
    for host in ("127.0.0.1", "localhost"):
        check_exposure(serve_config(tiny_run, f"host={host}"))
    assert loopback("::1") and loopback("[::1]")
    assert not loopback("10.0.0.5") and not loopback("mt.example.org")
    with pytest.raises(ConfigError, match="fewer than 16 characters"):
        check_exposure(serve_config(tiny_run, "api_key=short"))
    with pytest.raises(ConfigError, match=r"api_key_file=.*none: cannot read it"):
        check_exposure(serve_config(tiny_run, f"api_key_file={tmp_path / 'none'}"))
    with pytest.raises(ConfigError, match="both set"):
        check_exposure(serve_config(tiny_run, f"api_key={KEY}", f"api_key_file={tmp_path / 'none'}"))


def test_a_browser_must_send_json_while_curl_forms_still_work(client: TestClient) -> None:
    body = b'{"text": ["I am cold."]}'
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for marker in ({"Origin": "http://attacker.example"}, {"Sec-Fetch-Site": "cross-site"}):
        _error(client.post("/translate", content=body, headers={**form, **marker}), 415, "application/json")
        _error(client.post("/translate", content=body, headers={"Content-Type": "text/plain", **marker}),
               415, "application/json")
        json_type = {"Content-Type": "application/json; charset=utf-8", **marker}
        assert client.post("/translate", content=body, headers=json_type).status_code == 200
    assert client.post("/translate", content=body, headers=form).status_code == 200  # curl -d
    page = resources.files("transformer_mt.serve").joinpath("page.html").read_text(encoding="utf-8")
    assert re.search(r'fetch\("translate", \{method: "POST",\s+headers: \{"Content-Type": "application/json"',
                     page)


def test_a_request_head_over_max_header_bytes_is_refused_431(client: TestClient) -> None:
    _error(client.get("/health", headers={"X-Padding": "a" * 100_000}), 431, "limits.max_header_bytes")
    assert client.get("/health").status_code == 200


class _Transport:
    """What uvicorn's protocol asks of a connection's transport; records an abort."""

    def __init__(self) -> None:
        self.aborted = self.closing = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.aborted = self.closing = True

    def close(self) -> None:
        self.closing = True


def test_a_client_that_takes_none_of_its_answer_is_disconnected_after_send_timeout_s(
        tiny_run: Path, engine: Translator) -> None:
    """uvicorn waits for a client that never reads for ever, its connection slot and unsent answer held:
    the server's protocol aborts the connection once writing has been paused for limits.send_timeout_s,
    and leaves one that takes its answer meanwhile alone."""
    import asyncio

    import uvicorn
    from uvicorn.server import ServerState

    from transformer_mt.jobs.serve import http_config

    cfg = serve_config(tiny_run, "limits.send_timeout_s=0.05")
    config = http_config(uvicorn, create_app(engine, cfg), cfg)
    config.load()
    loop = asyncio.new_event_loop()
    try:
        for reads in (False, True):
            state = ServerState()
            protocol = config.http_protocol_class(config=config, server_state=state, app_state={}, _loop=loop)
            transport = _Transport()
            protocol.connection_made(transport)
            protocol.pause_writing()  # more of the answer waits than the socket takes
            if reads:
                loop.run_until_complete(asyncio.sleep(0.02))
                protocol.resume_writing()
            loop.run_until_complete(asyncio.sleep(0.2))
            assert transport.aborted != reads
            protocol.connection_lost(None)
            assert not state.connections
    finally:
        loop.close()


# -- the real command -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny_run: Path) -> Iterator[Served]:
    """`transformer-mt serve` on a free port with short timeouts and few connections; (process, port).
    The last test stops it with SIGTERM."""
    command = [sys.executable, "-m", "transformer_mt", "serve", f"checkpoint={tiny_run}", "port=0",
               "device=cpu", "limits.body_timeout_s=1", "limits.idle_timeout_s=1", "limits.max_connections=4"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())
        assert found, proc.stderr.read() if proc.poll() is not None else "no URL"  # type: ignore[union-attr]
        yield proc, int(found.group(1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=20)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection. A server that closes with request bytes
    still unread (a body refused past its limit) resets the connection instead of ending it: the kernel
    hands over the answer that arrived first, then the reset, which ends the answer like an end of stream."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_slow_or_endless_bodies_and_silent_connections_are_cut_off(server: Served) -> None:
    _, port = server
    with _connect(port) as slow:
        slow.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"text\": ")  # ... and the rest never comes
        assert _answer(slow).startswith(b"HTTP/1.1 408 "), "a body that stalls is cut off"
    with _connect(port) as endless:  # refused once past the limit, not after the whole body (or 408)
        endless.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(51):  # the 51st chunk passes the default limit (833,536 bytes); then it stalls
            endless.sendall(b"4000\r\n" + b" " * 0x4000 + b"\r\n")
        assert _answer(endless).startswith(b"HTTP/1.1 413 ")
    with _connect(port) as silent:
        start = time.monotonic()
        assert _answer(silent) == b""  # closed by the server, with nothing sent either way
        assert time.monotonic() - start < 5
    with _connect(port) as trickle:  # a head sent a byte at a time does not keep the connection alive
        start, cut = time.monotonic(), False
        for byte in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Trickle: 1\r\n" * 10:
            try:  # 18 s of head at a byte every 0.1 s, unless it is cut off
                trickle.sendall(bytes([byte]))
            except OSError:
                cut = True
                break
            time.sleep(0.1)
        assert cut and time.monotonic() - start < 5, "a head sent a byte at a time was not cut off"


def test_a_large_head_and_surplus_connections_are_refused(server: Served) -> None:
    _, port = server
    with _connect(port) as big:
        big.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 100_000 + b"\r\n\r\n")
        assert re.match(rb"HTTP/1\.1 4\d\d ", _answer(big)), "a 100 kB request head is refused"
    idle = [_connect(port) for _ in range(4)]  # limits.max_connections=4 held by idle clients
    try:
        with _connect(port) as one_more:
            one_more.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            refused = _answer(one_more)
            assert refused.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in refused.lower()
            assert b'{"error": "the server has as many connections open as limits.max_connections' in refused
    finally:
        for sock in idle:
            sock.close()


def test_sigterm_stops_the_server_cleanly(server: Served) -> None:
    proc, port = server
    texts = [f"I am cold {i} times." for i in range(64)]  # in flight for a while: 64 texts, beam 16
    request = urllib.request.Request(f"http://127.0.0.1:{port}/translate",
                                     data=json.dumps({"text": texts, "beam_size": 16}).encode())
    answers: list[dict] = []

    def ask() -> None:
        with urllib.request.urlopen(request, timeout=30) as answer:
            answers.append({"status": answer.status, **json.loads(answer.read())})

    client = threading.Thread(target=ask)
    with _connect(port) as idle, _connect(port) as partial:  # a keep-alive client; one amid its body
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert idle.recv(65536).startswith(b"HTTP/1.1 200 ")
        partial.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        client.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    client.join(30)
    assert proc.returncode == 0, err
    assert "server stopped" in out and "Traceback" not in err and "Error" not in err, err
    assert len(answers) == 1 and answers[0]["status"] == 200, answers  # the request in flight is answered
    assert len(answers[0]["translations"]) == len(texts)


def test_sigterm_while_the_model_loads_stops_quietly(tiny_run: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A stop before the server serves (a deployment cancelled while the model loads) ends the job with
    a line, as a stop of the running server does: no signal death, no traceback, the port given back."""
    from transformer_mt.jobs import serve as job

    loading = threading.Event()

    def slow_load(cfg: object) -> None:
        """Thirty seconds of loading in short steps, as a model loads: the signal, which the thread that
        sends it may receive, is handled in the main thread between two of them (one sleep of 30 s would
        take it only at its end)."""
        loading.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.01)
        raise AssertionError("the stop did not arrive")

    def stop() -> None:
        loading.wait(30)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(job, "load_engine", slow_load)
    threading.Thread(target=stop, daemon=True).start()
    cfg = serve_config(tiny_run, "port=0")
    before = signal.getsignal(signal.SIGTERM)
    job.serve(cfg)
    assert "server stopped before it served" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) is before  # the process's own handling given back


def test_a_busy_port_is_one_line_before_the_model_loads(tiny_run: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", f"checkpoint={tiny_run}", "device=cpu", f"port={port}", timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "port=" in lines[0], result.stderr
    assert "translating on" not in result.stderr  # the log line of a loaded model


# -- translate ------------------------------------------------------------------------------------------
def test_translate_a_line_whose_prefix_is_too_long_fails_alone(tiny_run: Path, engine: Translator,
                                                              tmp_path: Path, run_cli_here) -> None:
    lines = ["I am cold.\tJe", f"He is sleeping.\t{LONG}", "Where is the station?\tOù"]
    source = tmp_path / "in.tsv"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_cli_here("translate", f"checkpoint={tiny_run}", "device=cpu", "decoding.beam_size=4",
                          f"input={source}", "input_format=tsv")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "line 2: its prefix has" in result.stderr.splitlines()[-1], result.stderr
    expected = engine.translate(["I am cold.", "Where is the station?"], beam_size=4, prefixes=["Je", "Où"])
    assert result.stdout.splitlines() == [expected[0], "", expected[1]]


def test_a_default_prefix_too_long_for_the_model_is_a_config_error(tiny_run: Path) -> None:
    from transformer_mt.decoding.text_translator import check_default_prefix

    cfg = serve_config(tiny_run)
    cfg.decoding.prefix = LONG
    long_prefix = Translator.from_checkpoint(tiny_run, device="cpu", decoding=cfg.decoding, amp="off")
    with pytest.raises(ConfigError, match="decoding.prefix has .* tokens"):
        check_default_prefix(long_prefix)
