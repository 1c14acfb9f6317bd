"""The `serve` job: load the model once, then answer HTTP requests until Ctrl-C."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

from transformer_mt.config import ServeConfig
from transformer_mt.engine import load_engine
from transformer_mt.errors import ConfigError

log = logging.getLogger(__name__)


def _web_stack() -> Any:
    try:
        import uvicorn

        from transformer_mt.serve.app import create_app
    except ImportError as ex:
        raise ConfigError(f"serve needs the serve extra ({ex.name} is missing): "
                          "pip install 'transformer-mt[serve]'") from ex
    return uvicorn, create_app


def serve(cfg: ServeConfig) -> None:
    """Entry point of `transformer-mt serve`: prints the URL once the server accepts connections."""
    uvicorn, create_app = _web_stack()
    engine = load_engine(cfg)
    app = create_app(engine, cfg)

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
                print(f"serving {engine.info.get('model_dir') or engine.info.get('checkpoint')} at "
                      f"http://{cfg.host}:{port}/ (API: http://{cfg.host}:{port}/docs)", flush=True)

    server = Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                                   timeout_graceful_shutdown=5))
    try:
        server.run()
    except OSError as ex:  # the port is taken, or the host cannot be bound
        raise ConfigError(f"cannot listen on {cfg.host}:{cfg.port} ({ex.strerror or ex}); "
                          "pick another port= or host=") from ex
    if not server.started:
        raise ConfigError(f"cannot listen on {cfg.host}:{cfg.port}; pick another port= or host=")
    print("server stopped", flush=True)
