"""``notify``: the command line.

    notify run [--workers N]     embedded server (unless REDIS_URL) + worker(s)
    notify worker [--role R]     one worker against REDIS_URL / the running embedded server
    notify send ... [--wait]     one event from flags or --json (checked as the API checks it)
    notify user set ID ...       a user's phone, e-mail, zone, quiet hours, devices
    notify outcomes tail         print the outcome stream (--from, --group: resumable)
    notify dlq ls                list dead letters
    notify records show BIZ_KEY  the records of a business key
    notify records replay        write the records again from the outcome stream
    notify callbacks ls|replay   producers' status callbacks waiting or given up
    notify status                lag per topic, leases, DLQ depth
    notify providers check       the config's providers: each one's credentials tried

Errors are one clear line on stderr and a non-zero exit code (``--debug`` or
``NOTIFY_DEBUG=1``: the traceback of an unexpected one).

The broker is ``NOTIFY_BROKER`` (set by ``notify run`` for its children), else
``REDIS_URL``, else ``data/broker.url``: the broker of the running ``notify run``,
the embedded server it started with the password it generated or the ``REDIS_URL``
it was given (a Redis Cluster's too; the file is its user's only, mode 0600). Files
are created with umask 0o077; ``notify run`` holds ``data/notify.lock`` while it runs.

Where things live: broker.py (the broker URL, its key namespace, the data
directory and its lock), run.py (run, worker, api, keys), send.py (send, user and
``send_raw``, the writer every producing command uses), read.py (outcomes, dlq,
records, slo, callbacks), status.py, providers.py, demo.py and mixes.py (the
generated load of the demo and the benchmarks), parser.py (the options, ``main``
and its one-line errors), text.py (what is printed of stream entries and errors).

Every command works on a Redis Cluster (pipeline/transport/client.py ``sync_client``
gives the cluster client; a topic is read one partition, one hash slot, at a time)
and uses the key namespace of the URL's ``prefix=`` (default ``nfs``), as the
workers and the API do.
"""

from .broker import CLIError, NoBroker, broker_keys, broker_url
from .demo import run_demo, wait_ready
from .parser import build_parser, main
from .send import send_raw

__all__ = ["main", "build_parser", "CLIError", "NoBroker", "broker_url", "broker_keys", "send_raw", "run_demo",
           "wait_ready"]
