"""The API key file: one or more keys per producer, each with scopes, stored
hashed, and each producer's status-callback settings (read by the API,
pipeline/api/auth.py, and by the workers' callback sender, agents/callbacks.py;
``notify keys`` writes it). See pipeline/api/auth.py for the key format and
the scopes."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import orjson

from .parsers.events import PRODUCER_RE, InvalidEvent
from .parsers.events import callback_url as _callback_url

__all__ = ["SCOPES", "Principal", "KeyStore", "KeyFileError", "ProducerCallbacks", "add_key", "key_callback",
           "list_keys", "revoke_key"]

log = logging.getLogger("notify.api")

SCOPES: tuple[str, ...] = ("events:write", "records:read", "users:read", "users:write", "admin", "priority:any")

_PREFIX = "nfk_"
_KID_RE = re.compile(r"^[0-9a-f]{12}$")
_PRODUCER_RE = PRODUCER_RE


class KeyFileError(ValueError):
    """The key file cannot be read or has a bad entry."""


@dataclass(frozen=True)
class Principal:
    key_id: str
    producer: str
    scopes: frozenset[str]


def _hash(salt: bytes, secret: str) -> str:
    return hashlib.sha256(salt + secret.encode("utf-8", "surrogatepass")).hexdigest()


def _split(key: str) -> tuple[str, str]:
    """``nfk_<kid>_<secret>`` → (kid, secret); ('', key) when it does not parse."""
    if key.startswith(_PREFIX) and len(key) > len(_PREFIX) + 13 and key[len(_PREFIX) + 12] == "_":
        kid = key[len(_PREFIX): len(_PREFIX) + 12]
        if _KID_RE.match(kid):
            return kid, key[len(_PREFIX) + 13:]
    return "", key


def _check_scopes(scopes: Iterable[str]) -> list[str]:
    out = []
    for s in scopes:
        s = s.strip()
        if not s:
            continue
        if s not in SCOPES:
            raise KeyFileError(f"unknown scope {s!r} (known: {', '.join(SCOPES)})")
        if s not in out:
            out.append(s)
    if not out:
        raise KeyFileError(f"at least one scope is needed (known: {', '.join(SCOPES)})")
    return out


# --------------------------------------------------------------------------- the file


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {"version": 1, "keys": {}}
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {str(path)!r}: {exc}") from None
    try:
        data = orjson.loads(raw) if raw.strip() else {"version": 1, "keys": {}}
    except orjson.JSONDecodeError as exc:
        raise KeyFileError(f"key file {str(path)!r} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), dict):
        raise KeyFileError(f'key file {str(path)!r}: expected {{"keys": {{...}}}}')
    for kid, entry in data["keys"].items():
        ok = (
            _KID_RE.match(str(kid))
            and isinstance(entry, dict)
            and isinstance(entry.get("producer"), str)
            and isinstance(entry.get("scopes"), list)
            and isinstance(entry.get("salt"), str)
            and isinstance(entry.get("hash"), str)
            and all(isinstance(entry.get(f), (str, type(None))) for f in ("callback_url", "callback_secret"))
        )
        if not ok:
            raise KeyFileError(f"key file {str(path)!r}: bad entry {kid!r}")
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def _locked(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def add_key(path: str | os.PathLike[str], producer: str, scopes: Iterable[str], *,
            callback_url: Optional[str] = None) -> tuple[str, str]:
    """Create a key; returns (key id, the key itself — shown once, never stored).

    Each key also gets a status callback secret (``whsec_…``, Standard Webhooks),
    which signs the callbacks of its producer's events (agents/callbacks.py), and
    optionally ``callback_url``, the producer's default callback target. The
    secret is kept in the file as it is (signing needs it, unlike the key, which
    is kept hashed); ``notify keys add`` shows it once (:func:`key_callback`)."""
    from adapters.webhook import new_secret

    if not _PRODUCER_RE.fullmatch(producer or ""):
        raise KeyFileError(f"bad producer name {producer!r} (letters, digits, _.:@-; up to 64)")
    scope_list = _check_scopes(scopes)
    try:
        callback_url = _callback_url(callback_url, "callback_url")
    except InvalidEvent as exc:
        raise KeyFileError(f"--callback-url: {exc.detail or exc}") from None
    path = Path(path)
    with _locked(path):
        data = _read(path)
        kid = secrets.token_hex(6)
        while kid in data["keys"]:
            kid = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        data["keys"][kid] = {
            "producer": producer,
            "scopes": scope_list,
            "algo": "sha256",
            "salt": salt.hex(),
            "hash": _hash(salt, secret),
            "created_at": time.time(),
            "callback_secret": new_secret(),
        }
        if callback_url:
            data["keys"][kid]["callback_url"] = callback_url
        _write(path, data)
    return kid, f"{_PREFIX}{kid}_{secret}"


def key_callback(path: str | os.PathLike[str], key_id: str) -> dict[str, Any]:
    """A key's status callback settings: ``{"callback_url": …, "callback_secret": …}``
    (for ``notify keys add`` to show once)."""
    entry = _read(Path(path))["keys"].get(key_id) or {}
    return {"callback_url": entry.get("callback_url"), "callback_secret": entry.get("callback_secret")}


class ProducerCallbacks:
    """Per producer, from the key file (re-read when it changes, looked at no more
    than once a second): the default callback URL (its newest key that has one)
    and the secrets its callbacks are signed with (every enabled key's, newest
    first: a producer rotating keys verifies with either). The operator's key
    space (producer ``""``: the bootstrap key, events written straight to the
    streams) signs with ``operator_secret`` (``NOTIFY_CALLBACK_SECRET``)."""

    def __init__(self, path: str | os.PathLike[str], operator_secret: Optional[str] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.operator_secret = operator_secret or None
        self._clock = clock
        self._checked = -1e18
        self._stamp: Any = ()
        self._by: dict[str, tuple[Optional[str], list[str]]] = {}

    def _load(self) -> None:
        now = self._clock()
        if now - self._checked < 1.0:
            return
        self._checked = now
        try:
            st = self.path.stat()
            stamp: Any = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return
        try:
            data = _read(self.path)
        except KeyFileError:
            log.error("key file %s is unreadable; keeping the callback settings loaded before", self.path,
                      exc_info=True)
            self._stamp = stamp
            return
        by: dict[str, tuple[Optional[str], list[str]]] = {}
        entries = sorted(data["keys"].values(), key=lambda e: e.get("created_at") or 0, reverse=True)
        for e in entries:
            if e.get("disabled"):
                continue
            url, secrets_ = by.get(e["producer"], (None, []))
            if url is None and isinstance(e.get("callback_url"), str):
                url = e["callback_url"]
            if isinstance(e.get("callback_secret"), str) and len(secrets_) < 5:
                secrets_.append(e["callback_secret"])
            by[e["producer"]] = (url, secrets_)
        self._by = by
        self._stamp = stamp

    def default_url(self, producer: str) -> Optional[str]:
        self._load()
        return self._by.get(producer, (None, []))[0]

    def secrets(self, producer: str) -> list[str]:
        """The secrets to sign ``producer``'s callbacks with (empty: none, the
        callback cannot be sent)."""
        if producer == "":
            return [self.operator_secret] if self.operator_secret else []
        self._load()
        return list(self._by.get(producer, (None, []))[1])


def list_keys(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    data = _read(Path(path))
    return [
        {"key_id": kid, "producer": e["producer"], "scopes": e["scopes"], "created_at": e.get("created_at"),
         **({"callback_url": e["callback_url"]} if e.get("callback_url") else {})}
        for kid, e in sorted(data["keys"].items(), key=lambda kv: kv[1].get("created_at") or 0)
    ]


def revoke_key(path: str | os.PathLike[str], key_id: str) -> bool:
    path = Path(path)
    with _locked(path):
        data = _read(path)
        if data["keys"].pop(key_id, None) is None:
            return False
        _write(path, data)
    return True


# --------------------------------------------------------------------------- verification


class KeyStore:
    """The keys of one file (re-read when it changes) plus an optional bootstrap key."""

    def __init__(self, path: str | os.PathLike[str], bootstrap_key: Optional[str] = None) -> None:
        self.path = Path(path)
        self._keys: dict[str, tuple[bytes, str, str, frozenset[str]]] = {}
        self._stamp: Optional[tuple[int, int]] = None
        self._dummy_salt = secrets.token_bytes(16)
        self._bootstrap: Optional[tuple[bytes, str]] = None
        if bootstrap_key:
            salt = secrets.token_bytes(16)
            self._bootstrap = (salt, _hash(salt, bootstrap_key))
        self.reload(force=True)

    def _stat(self) -> Optional[tuple[int, int]]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def reload(self, force: bool = False) -> None:
        stamp = self._stat()
        if not force and stamp == self._stamp:
            return
        try:
            data = _read(self.path)
        except KeyFileError:
            if force:
                raise
            log.error("key file %s is unreadable; keeping the keys loaded before", self.path, exc_info=True)
            self._stamp = stamp
            return
        keys = {}
        for kid, e in data["keys"].items():
            if e.get("disabled"):
                continue
            keys[kid] = (bytes.fromhex(e["salt"]), e["hash"], e["producer"], frozenset(e["scopes"]))
        self._keys = keys
        self._stamp = stamp

    def __len__(self) -> int:
        return len(self._keys) + (self._bootstrap is not None)

    def verify(self, key: str) -> Optional[Principal]:
        """The key's principal, or None (unknown, revoked, or wrong secret)."""
        self.reload()
        found: Optional[Principal] = None
        kid, secret = _split(key)
        entry = self._keys.get(kid) if kid else None
        if entry is not None:
            salt, digest, producer, scopes = entry
            if hmac.compare_digest(_hash(salt, secret), digest):
                found = Principal(kid, producer, scopes)
        else:
            hmac.compare_digest(_hash(self._dummy_salt, secret), "0" * 64)  # same work either way
        if self._bootstrap is not None:
            salt, digest = self._bootstrap
            if hmac.compare_digest(_hash(salt, key), digest) and found is None:
                found = Principal("bootstrap", "", frozenset(SCOPES))
        return found


# ---------------------------------------------------------------------------
# the tracking key (pipeline/rules/tracking.py signs links with it)

TRACKING_KEY_FILE = "tracking.key"


def tracking_key(settings: Any) -> bytes:
    """The key signing tracked links: ``NOTIFY_TRACKING_SECRET`` when set, else
    ``<data_dir>/tracking.key``, generated once (32 random bytes, hex, mode 0600;
    written aside and linked into place, so two processes starting together
    agree on one key). The API and every worker of a data directory share it."""
    secret = settings.env.tracking_secret
    if secret:
        return secret.encode("utf-8")
    path = Path(settings.data_dir) / TRACKING_KEY_FILE
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{TRACKING_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)  # the first writer wins
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return bytes.fromhex(path.read_text().strip())
