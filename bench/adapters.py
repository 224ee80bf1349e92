"""What one provider call costs the worker: client CPU µs per call and calls/s for
each adapter against its simulator running in a process of its own (as
``notify run`` starts them), at concurrency 1 and 50, on the adapters as they
ship and, for the HTTP/1.1 adapters, on httpx's own transport (the baseline of
the same run, for the ratio).

    .venv/bin/python bench/adapters.py [--calls 1000] [--markdown] [--providers sendgrid,ses,sns] [--smtp-sink]

The simulators run with the clean profile (no random latency or failures), so
what is measured is the client's own cost; the simulator process has a core of
its own only if the machine has one to spare (2 cores here: it competes with
the client, which lowers calls/s, not CPU per call). SendGrid, SES and SNS run
against ``python -m adapters.simulators.cloud``, a process of its own too; the SES
and SNS calls include botocore's SigV4 signing.

``--smtp-sink`` adds rows for SMTP against a sink in a process of its own (this
file with ``--serve-smtp-sink``): an SMTP server that answers every command and
keeps nothing, so the messages/s is the client's, not the simulator's (aiosmtpd,
which reads each message's header and keeps the message: some 0.6 ms of its CPU
per message).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters import _http  # noqa: E402
from adapters.simulators import build_providers_from_info  # noqa: E402
from adapters.simulators.cloud import build_cloud_providers_from_info  # noqa: E402
from pipeline.models import Delivery  # noqa: E402
from pipeline.procs import stop_all  # noqa: E402

CHANNEL = {"twilio": "sms", "smsvendor": "sms", "webhook": "webhook", "apns": "push", "fcm": "push", "hms": "push",
           "smtp": "email"}
HTTP1 = ("twilio", "smsvendor", "webhook", "hms")
#: the hosted e-mail / SMS APIs (adapters/simulators/cloud.py, their own simulator process)
CLOUD = ("sendgrid", "ses", "sns")
CHANNEL.update(sendgrid="email", ses="email", sns="sms")
#: --providers: measure only these (None: all)
ONLY: set | None = None


def address(provider: str, info: dict, i: int) -> str:
    if provider == "sns":
        return f"+1555{i % 1_000_000:06d}9"
    if provider in ("sendgrid", "ses"):
        return f"user{i}@example.com"
    if provider in ("twilio", "smsvendor"):
        return f"+1555{i % 1_000_000:06d}9"  # no simulator scenario ends in 9
    if provider == "apns":
        return "apns:" + f"{i:064x}"
    if provider == "fcm":
        return f"fcm:bench-token-{i}"
    if provider == "hms":
        return f"hms:bench-token-{i}"
    if provider == "smtp":
        return f"user{i}@example.com"
    return info["urls"]["webhook"]


def delivery(provider: str, info: dict, tag: str, i: int) -> Delivery:
    channel = CHANNEL[provider]
    content = {"title": "Hi", "body": "Your code is 123456", "subject": "Hi", "html": "<p>Hi</p>", "text": "Hi"}
    if channel == "webhook":
        content = {"body": {"type": "bench", "i": i}}
    return Delivery(delivery_id=f"n_{tag}{i:016d}.{channel}", notification_id=f"n_{tag}{i:016d}", biz_key=f"bench:{i}",
                    user_id=f"u{i}", channel=channel, category="transaction", template="bench", priority="normal",
                    address=address(provider, info, i), content=content)


def shipped_transport(provider: str, config: object) -> str:
    """What the adapter sends over: APNs over our HTTP/2 client (adapters/_h2.py), FCM
    over aiohttp (HTTP/1.1) unless its config asks for HTTP/2 (``http2``, off by
    default: then adapters/_h2.py too), SMTP over aiosmtplib, the rest over aiohttp."""
    if provider == "apns" or (provider == "fcm" and getattr(config, "http2", False)):
        return "h2 (ours)"
    return "aiosmtplib + pipelined" if provider == "smtp" else "aiohttp"


async def measure(provider: str, info: dict, calls: int, conc: int, tag: str) -> dict | None:
    if ONLY is not None and provider not in ONLY:
        return None
    providers = build_cloud_providers_from_info(info["cloud"]) if provider in CLOUD else build_providers_from_info(info)
    p = providers[provider]
    try:
        await asyncio.gather(*(p.send(delivery(provider, info, tag + "w", i)) for i in range(min(conc, 20))))
        sem = asyncio.Semaphore(conc)
        results: dict[str, int] = {}

        async def one(i: int) -> None:
            async with sem:
                r = await p.send(delivery(provider, info, tag, i))
                results[r.result] = results.get(r.result, 0) + 1

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(calls)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"provider": provider, "conc": conc, "calls_s": calls / wall, "cpu_us": cpu / calls * 1e6,
                "results": results, "transport": shipped_transport(provider, getattr(p, "config", None))}
    finally:
        for q in providers.values():
            close = getattr(q, "close", None)
            if close is not None:
                await close()


class SmtpSink(asyncio.Protocol):
    """The least an SMTP server does: a greeting, EHLO, 250 to MAIL / RCPT / RSET /
    NOOP, DATA read up to the lone dot, 221 to QUIT; nothing parsed or kept."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""
        self.in_data = False
        transport.write(b"220 sink.bench.invalid ESMTP\r\n")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        write = self.transport.write  # type: ignore[attr-defined]
        while True:
            if self.in_data:
                end = self.buf.find(b"\r\n.\r\n")
                if end < 0:
                    return
                self.buf = self.buf[end + 5:]
                self.in_data = False
                write(b"250 2.0.0 Ok: queued\r\n")
                continue
            end = self.buf.find(b"\r\n")
            if end < 0:
                return
            verb, self.buf = self.buf[:4].upper(), self.buf[end + 2:]
            if verb == b"EHLO":
                write(b"250-sink.bench.invalid\r\n250-PIPELINING\r\n250 8BITMIME\r\n")
            elif verb == b"DATA":
                self.in_data = True
                write(b"354 End data with <CR><LF>.<CR><LF>\r\n")
            elif verb == b"QUIT":
                write(b"221 Bye\r\n")
                self.transport.close()
                return
            else:
                write(b"250 Ok\r\n")


async def serve_smtp_sink(info_path: str) -> None:
    server = await asyncio.get_running_loop().create_server(SmtpSink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tmp = info_path + ".tmp"
    Path(tmp).write_text(str(port))
    os.replace(tmp, info_path)
    await asyncio.Event().wait()


def wait_for_file(path: str, proc: subprocess.Popen, deadline: float, what: str) -> None:
    while not os.path.exists(path):
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.05)


def native_transport() -> None:
    """The baseline: HTTP/1.1 adapters on httpx's own transport (httpcore)."""
    _http.AiohttpTransport = lambda max_connections, verify: httpx.AsyncHTTPTransport(  # type: ignore[assignment]
        verify=verify, limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--providers", default="", help="measure only these (comma-separated)")
    ap.add_argument("--smtp-sink", action="store_true", help="also SMTP against a sink that keeps nothing")
    ap.add_argument("--serve-smtp-sink", default=None, metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_smtp_sink:
        asyncio.run(serve_smtp_sink(args.serve_smtp_sink))
        return
    global ONLY
    ONLY = {p.strip() for p in args.providers.split(",") if p.strip()} or None
    cloud_path = os.path.join(tempfile.mkdtemp(), "cloud.json")
    cloud = subprocess.Popen([sys.executable, "-m", "adapters.simulators.cloud", "--clean", "--info", cloud_path],
                             cwd=str(ROOT), stdout=subprocess.DEVNULL)
    info_path = os.path.join(tempfile.mkdtemp(), "sims.json")
    sims = subprocess.Popen([sys.executable, "-m", "adapters.simulators", "--clean", "--info", info_path],
                            cwd=str(ROOT), stdout=subprocess.DEVNULL)
    sink = sink_path = None
    if args.smtp_sink:
        sink_path = os.path.join(tempfile.mkdtemp(), "sink.port")
        sink = subprocess.Popen([sys.executable, __file__, "--serve-smtp-sink", sink_path], cwd=str(ROOT))
    try:
        deadline = time.time() + 30
        while not os.path.exists(info_path):
            if time.time() > deadline or sims.poll() is not None:
                raise SystemExit("simulators did not start")
            time.sleep(0.05)
        info = orjson.loads(Path(info_path).read_bytes())
        while not os.path.exists(cloud_path):
            if time.time() > deadline or cloud.poll() is not None:
                raise SystemExit("the cloud simulators did not start")
            time.sleep(0.05)
        info["cloud"] = orjson.loads(Path(cloud_path).read_bytes())
        rows = []
        if sink is not None:
            wait_for_file(sink_path, sink, deadline, "the SMTP sink")
            sink_info = {**info, "smtp": {"host": "127.0.0.1", "port": int(Path(sink_path).read_text())}}
            for conc in (1, 50):
                rows.append(("sink", asyncio.run(measure("smtp", sink_info, args.calls, conc, f"k{conc}"))))
        for provider in CLOUD:
            for conc in (1, 50):
                rows.append(("shipped", asyncio.run(measure(provider, info, args.calls, conc, f"s{conc}"))))
        for provider in ("twilio", "smsvendor", "webhook", "apns", "fcm", "hms", "smtp"):
            for conc in (1, 50):
                rows.append(("shipped", asyncio.run(measure(provider, info, args.calls, conc, f"s{conc}"))))
        native_transport()
        for provider in HTTP1 + CLOUD:
            for conc in (1, 50):
                rows.append(("httpx native", asyncio.run(measure(provider, info, args.calls, conc, f"h{conc}"))))
    finally:
        stop_all([sims, cloud, sink], 10)
    rows = [(t, r) for t, r in rows if r is not None]
    base = {(r["provider"], r["conc"]): r for t, r in rows if t == "httpx native"}
    print("| adapter | transport | concurrency | calls/s | client CPU µs/call | vs httpx native | results |")
    print("|---|---|---:|---:|---:|---:|---|")
    for t, r in rows:
        b = base.get((r["provider"], r["conc"]))
        ratio = f"{b['cpu_us'] / r['cpu_us']:.1f}x less CPU" if b and t == "shipped" else ""
        transport = r["transport"] if t == "shipped" else "aiosmtplib + pipelined → sink" if t == "sink" else "httpx (httpcore)"
        print(f"| {r['provider']} | {transport} | {r['conc']} | {r['calls_s']:,.0f} | {r['cpu_us']:,.0f} | {ratio} | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(r['results'].items()))} |")


if __name__ == "__main__":
    main()
