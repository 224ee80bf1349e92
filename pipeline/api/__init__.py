"""The HTTP API of notify-stream (aiohttp): events in, records and users'
settings, provider receipts, Prometheus metrics with consumer lag, and a status
page. See :mod:`pipeline.api.app` for the endpoints, scopes and Redis keys.

    from pipeline.api import make_app
    web.run_app(make_app(settings, broker_url=url, store_path=settings.db_path))

or ``notify api`` (``notify keys add <producer> --scopes events:write`` makes keys).
"""

from .app import make_app
from .auth import SCOPES, add_key, list_keys, revoke_key

__all__ = ["make_app", "SCOPES", "add_key", "list_keys", "revoke_key", "serve"]


def serve(host: str = "127.0.0.1", port: int = 8080, **kwargs) -> None:
    """Run the API until interrupted (what ``notify api`` does)."""
    import logging

    from pipeline import redact

    redact.install()  # no recipient, device token (access log paths) or API key in the API's logs
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from config.settings import load_settings

    settings = kwargs.pop("settings", None) or load_settings()
    broker_url = kwargs.pop("broker_url")
    store_path = kwargs.pop("store_path", None) or settings.db_path
    app = make_app(settings, broker_url=broker_url, store_path=store_path, **kwargs)
    # aiohttp's server with the door's limits: header and body deadlines, malformed
    # requests answered in the API's JSON shape (pipeline/api/server.py)
    from .server import run

    run(app, host, port, settings=settings, on_ready=lambda: print(f"notify api on http://{host}:{port}", flush=True))
