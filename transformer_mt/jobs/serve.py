"""The `serve` job: claim the port, load the model once, then answer HTTP requests until Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

from transformer_mt.config import ServeConfig
from transformer_mt.decoding.engine import load_engine
from transformer_mt.decoding.text_translator import check_default_prefix
from transformer_mt.errors import ConfigError

log = logging.getLogger(__name__)
BACKLOG = 2048  # connections the kernel queues before uvicorn accepts them (uvicorn's default)


def _web_stack() -> Any:
    try:
        import uvicorn

        from transformer_mt.serve.app import create_app
    except ImportError as ex:
        raise ConfigError(f"serve needs the serve extra ({ex.name} is missing): "
                          "pip install 'transformer-mt[serve]'") from ex
    return uvicorn, create_app


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, or a one-line ConfigError when it cannot be had (taken, or no such
    address). Called before the model loads, so a busy port costs nothing and nobody takes it meanwhile."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as ex:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({ex.strerror or ex}); pick another port= or "
                          "host=") from None
    return sock


def serve(cfg: ServeConfig) -> None:
    """Entry point of `transformer-mt serve`: prints the URL once the server accepts connections, and
    `server stopped` after a graceful stop."""
    uvicorn, create_app = _web_stack()
    from transformer_mt.serve.guard import check_exposure

    check_exposure(cfg)
    sock = listen(cfg.host, cfg.port)
    with contextlib.closing(sock):
        try:
            with _stopped_by_sigterm():  # while the model loads: uvicorn's own handlers come after
                engine = load_engine(cfg)
        except _Stopped:
            print("server stopped before it served", flush=True)
            return
        check_default_prefix(engine)
        model = engine.info.get("model_dir") or engine.info.get("checkpoint")
        address = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        app = create_app(engine, cfg)
        server = _server_class(uvicorn, f"serving {model} at", address)(http_config(uvicorn, app, cfg))
        server.run(sockets=[sock])
    if not server.started:
        raise ConfigError(f"cannot serve on {cfg.host}:{cfg.port}; the log above says why")
    print("server stopped", flush=True)


class _Stopped(Exception):
    """SIGTERM or Ctrl-C arrived before the server served."""


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM and Ctrl-C as _Stopped meanwhile (in the main thread): a stop while the model loads ends
    the job quietly, as a stop of the running server does, rather than by the signal or a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise _Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def http_config(uvicorn: Any, app: Any, cfg: ServeConfig) -> Any:
    """uvicorn's settings for app: limits.* as its own connection, idle-time and header-size limits. A stop
    waits for the requests in flight as long as one may take (its body, then its wait for a translation):
    past that, uvicorn cancels them and logs each with a traceback."""
    limits = cfg.limits
    longest = limits.body_timeout_s + limits.timeout_s
    return uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                          timeout_graceful_shutdown=longest, backlog=BACKLOG,
                          http=_timed_protocol(limits.send_timeout_s),
                          limit_concurrency=limits.max_connections, timeout_keep_alive=limits.idle_timeout_s,
                          h11_max_incomplete_event_size=limits.max_header_bytes)


async def _over_the_connection_limit(scope: Any, receive: Any, send: Any) -> None:
    """What a request past limits.max_connections gets: the API's one line of JSON (uvicorn's own answer
    is plain text), and the connection closed."""
    body = json.dumps({"error": "the server has as many connections open as limits.max_connections "
                                "allows; retry in a moment"}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                            (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _timed_protocol(send_timeout_s: float) -> type:
    from uvicorn.protocols.http import h11_impl
    from uvicorn.protocols.http.h11_impl import H11Protocol

    # uvicorn answers past its limit_concurrency with the app this module names: ours, in JSON
    h11_impl.service_unavailable = _over_the_connection_limit

    class TimedProtocol(H11Protocol):
        """uvicorn's h11 protocol with two clocks uvicorn lacks, so that no client holds a connection (one
        of limits.max_connections) and its buffered answer forever:
        - the head: its keep-alive timer also runs from the moment a connection opens until a whole
          request head has arrived (uvicorn times only the wait between requests, so a client that sends
          nothing, or its head a byte at a time, would hold a socket);
        - the answer: once more of it waits to be sent than the socket takes (the transport paused
          writing), the client must take some within limits.send_timeout_s, else the connection is
          aborted and its unsent bytes dropped (uvicorn waits on a client that never reads for ever)."""

        send_deadline: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self.timeout_keep_alive_handler)

        def data_received(self, data: bytes) -> None:
            # uvicorn's stops the timer on any data; here a whole request head stops it (handle_events)
            self.conn.receive_data(data)
            self.handle_events()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self.send_deadline is None:
                self.send_deadline = self.loop.call_later(send_timeout_s, self.reader_gone)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._stop_send_clock()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_send_clock()
            super().connection_lost(exc)

        def reader_gone(self) -> None:
            self.send_deadline = None
            log.warning("a client took none of its answer for %g s (limits.send_timeout_s): disconnected",
                        send_timeout_s)
            self.transport.abort()

        def _stop_send_clock(self) -> None:
            if self.send_deadline is not None:
                self.send_deadline.cancel()
                self.send_deadline = None

    return TimedProtocol


def _server_class(uvicorn: Any, serving: str, host: str) -> type:
    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """Ctrl-C or SIGTERM: a graceful stop, then a normal return (uvicorn's own handler raises
            the signal again afterwards, which ends the job in a KeyboardInterrupt traceback)."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # port=0 picks a free port: report the one the socket got
                port = self.servers[0].sockets[0].getsockname()[1]
                print(f"{serving} http://{host}:{port}/ (API: http://{host}:{port}/docs)", flush=True)

    return Server
