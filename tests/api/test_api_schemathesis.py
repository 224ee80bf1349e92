"""The running server against its own OpenAPI document (schemathesis).

The API runs in a thread with its own event loop on a real 127.0.0.1 port;
schemathesis loads ``/v1/openapi.json`` from it and, for every operation,
sends generated requests (valid and invalid by the schema, with a key that has
every scope) and checks the answers: no 5xx, documented status codes and
content types, bodies matching the response schemas, invalid input rejected,
and operations that declare bearer auth refusing requests without it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

schemathesis = pytest.importorskip("schemathesis")

from aiohttp import web  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import negative_data_rejection, positive_data_acceptance  # noqa: E402

#: small so the test stays well under 30 s; raise it (and drop derandomize by
#: setting NOTIFY_SCHEMATHESIS_RANDOM=1) for a deeper local run
BOOTSTRAP = "bootstrap-demo-key"  # conftest.BOOTSTRAP: a key with every scope
MAX_EXAMPLES = int(os.environ.get("NOTIFY_SCHEMATHESIS_EXAMPLES", "12"))
DERANDOMIZE = not os.environ.get("NOTIFY_SCHEMATHESIS_RANDOM")

#: Operations whose server-side rules JSON Schema cannot state exactly: the
#: preferences' phone (separators stripped, then 6–15 digits), e-mail, webhook URL
#: (urlsplit) and the non-empty quiet-hours window. For these the "valid data is
#: accepted" / "invalid data is rejected" checks are off; every other check runs,
#: and the rules themselves are tested in test_api_records_users.py and
#: tests/rules/test_rule_validate.py. Likewise an event's params, which must hold
#: every variable its template uses (422 missing_params: tests/api/test_api_events.py).
#: And the SLO report's and the tracking stats' times, whose pattern cannot rule out 2026-02-30
#: (tests/rules/test_slo.py, tests/pipeline/test_tracking.py), and the reads' body (free-form here).
INEXACT = {"putPreferences", "postEvents", "getSlo", "getStats", "listUnsubscribes", "postReads", "putRelease"}


class ServerThread:
    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        assert self._ready.wait(30), "API did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


@pytest.fixture
def server(api_app_factory):
    with ServerThread(api_app_factory(batch_max_events=20)) as srv:
        yield srv


def test_openapi_contract(server):
    # 413 is how the API refuses a batch over its cap (a schema "maxItems" violation)
    # auth through schemathesis' own config, so the cases that drop or mangle the
    # Authorization header really go out without a valid one
    config = schemathesis.config.SchemathesisConfig.from_dict({
        "auth": {"openapi": {"bearer": {"bearer": BOOTSTRAP}}},
        "checks": {"negative_data_rejection": {
            "expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]}},
    })
    schema = schemathesis.openapi.from_url(server.url + "/v1/openapi.json", config=config)
    started = time.monotonic()
    failures = []
    seen: dict[tuple[str, str], set[int]] = {}
    ran = 0
    for result in schema.get_all_operations():
        op = result.ok()
        inexact = op.definition.raw.get("operationId") in INEXACT
        excluded = [positive_data_acceptance, negative_data_rejection] if inexact else []
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                response = case.call_and_validate(base_url=server.url, excluded_checks=excluded)
                seen.setdefault((op.label, mode.value), set()).add(response.status_code)

            try:
                run()
                ran += 1
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing to get wrong: no parameters, no body
            except Exception as exc:  # collect every operation's failure, then report
                failures.append(f"{op.label} [{mode.value}]: {exc}")
    assert ran, "no operations"
    assert not failures, "\n\n".join(failures)
    # the key was used: every operation got past authentication with valid data
    for (label, mode), statuses in seen.items():
        if mode == "positive" and "/v1/receipts/" not in label:  # receipts: provider signatures
            assert statuses - {401, 403}, (label, statuses)
    if MAX_EXAMPLES <= 12:
        assert time.monotonic() - started < 30
