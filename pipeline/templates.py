"""Template rendering: one Jinja2 file per code × version × channel × locale, rendered
in an immutable sandbox into the channel's parts.

Layout: ``<templates_dir>/<code>/v<version>/<channel>.<locale>.j2``.

Convention: a file defines one ``{% block %}`` per part of its channel:

==========  =============================================  ===========================
channel     blocks                                         notes
==========  =============================================  ===========================
sms         ``body``                                       a file without blocks is the body
push        ``title``, ``body``
inbox       ``title``, ``body``
email       ``subject``, ``text``, ``html`` (optional)     only ``html`` is HTML-escaped
webhook     ``body``                                       must render to JSON; use ``|tojson``
==========  =============================================  ===========================

Every part is stripped; ``title``/``subject`` are folded onto one line (no header
injection through a param). Parts with a limit (``{channel: {part: n}}``) longer than n
code points are cut to n - 1 and end with "…". Undefined variables are errors
(``StrictUndefined``); ``None`` renders as an empty string. Locale fallback: exact
locale → its language (zh-CN → zh) → the default locale.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

import orjson
from jinja2 import FileSystemLoader, StrictUndefined, Template, meta
from jinja2.exceptions import SecurityError, TemplateNotFound, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["CHANNEL_PARTS", "OPTIONAL_PARTS", "TemplateError", "Renderer", "truncate"]

#: The parts each channel's content has (the keys of ``render``'s result).
CHANNEL_PARTS: dict[str, tuple[str, ...]] = {
    "sms": ("body",),
    "push": ("title", "body"),
    "inbox": ("title", "body"),
    "email": ("subject", "text", "html"),
    "webhook": ("body",),
}
#: Parts a template may leave out; they are then absent from the result.
OPTIONAL_PARTS: dict[str, frozenset[str]] = {"email": frozenset({"html"})}
_SINGLE_LINE = frozenset({"title", "subject"})
_HTML_PART = ("email", "html")

_CODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_VERSION_RE = re.compile(r"^v([1-9][0-9]{0,5})$")
_FILE_RE = re.compile(r"^(" + "|".join(CHANNEL_PARTS) + r")\.([A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8})*)\.j2$")
_LOCALE_RE = re.compile(r"^[A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8})*$")
_WS_RE = re.compile(r"\s+")
#: rendered contents remembered before the memo starts over
RENDER_MEMO = 4096
#: words in a template's source that keep its renders out of the memo
_NOT_MEMO = ("random", "lipsum", "include", "import", "extends")
_ELLIPSIS = "…"
# Characters that only modify the one before them: never leave one dangling at a cut.
_JOINERS = frozenset("\u200d\ufe0e\ufe0f")


class TemplateError(Exception):
    """Rendering failed. ``str(err)`` is ``"<code>: <detail>"``, e.g.
    ``template_missing: otp v2 sms zh``; ``err.code`` is the part before the colon
    (template_missing, template_incomplete, template_syntax, undefined_variable,
    sandbox_violation, bad_webhook_json, render_failed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    @property
    def code(self) -> str:
        return self.reason.split(":", 1)[0]


def _norm_locale(locale: str) -> str:
    return locale.replace("_", "-").lower()


def _finalize(value: Any) -> Any:
    return "" if value is None else value


def truncate(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` code points, else its first ``limit - 1``
    (trailing spaces and joiners dropped) plus "…". Python strings are code points, so a
    cut never splits a surrogate pair; grapheme clusters may be split."""
    if len(text) <= limit:
        return text
    if limit <= 1:
        return _ELLIPSIS[:limit]
    cut = text[: limit - 1].rstrip()
    while cut and (cut[-1] in _JOINERS or "\ud800" <= cut[-1] <= "\udbff"):
        cut = cut[:-1]
    return cut + _ELLIPSIS


class Renderer:
    """Renders ``(code, version, channel, locale, params)`` into a channel's parts.

    The directory is scanned once (``reload()`` scans again); compiled templates are
    cached per file. Only indexed files are ever opened, so no code or locale can reach
    outside ``templates_dir``.
    """

    def __init__(
        self,
        templates_dir: str | os.PathLike[str],
        default_locale: str = "en",
        limits: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        self.templates_dir = Path(templates_dir)
        if not self.templates_dir.is_dir():
            raise ValueError(f"templates_dir is not a directory: {str(self.templates_dir)!r}")
        self.default_locale = _norm_locale(default_locale)
        self.limits = {ch: dict(parts) for ch, parts in (limits or {}).items()}
        common = dict(
            loader=FileSystemLoader(str(self.templates_dir)),
            undefined=StrictUndefined,
            auto_reload=False,
            cache_size=0,  # we cache compiled templates ourselves, per file
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=_finalize,
        )
        self._plain = ImmutableSandboxedEnvironment(autoescape=False, **common)
        self._html = ImmutableSandboxedEnvironment(autoescape=True, **common)
        self._compiled: dict[tuple[bool, str], Template] = {}
        self._index: dict[tuple[str, int, str], dict[str, str]] = {}
        # rendered parts by (file, channel, params as JSON in their order): an event's
        # recipients who share a locale get the same content, rendered once
        self._rendered: dict[tuple[str, str, bytes], dict[str, str]] = {}
        self._deterministic: dict[str, bool] = {}
        self._mentions: dict[tuple[str, str], bool] = {}
        self.reload()

    @classmethod
    def from_settings(cls, settings: Any) -> "Renderer":
        """Build from a :class:`config.settings.Settings`."""
        return cls(settings.templates_dir, settings.default_locale, settings.channel_limits())

    # ------------------------------------------------------------------ index

    def reload(self) -> None:
        """Scan ``templates_dir`` again and drop compiled templates."""
        index: dict[tuple[str, int, str], dict[str, str]] = {}
        for code_dir in sorted(self.templates_dir.iterdir()):
            if not code_dir.is_dir() or not _CODE_RE.match(code_dir.name):
                continue
            for ver_dir in sorted(code_dir.iterdir()):
                m = _VERSION_RE.match(ver_dir.name)
                if not m or not ver_dir.is_dir():
                    continue
                for f in sorted(ver_dir.iterdir()):
                    fm = _FILE_RE.match(f.name)
                    if fm and f.is_file():
                        key = (code_dir.name, int(m.group(1)), fm.group(1))
                        name = f"{code_dir.name}/{ver_dir.name}/{f.name}"
                        index.setdefault(key, {})[_norm_locale(fm.group(2))] = name
        self._index = index
        self._compiled = {}
        self._rendered = {}
        self._deterministic = {}
        self._mentions = {}

    def has_template(self, code: str, version: int, channel: str | None = None) -> bool:
        """Whether any locale of ``code`` v``version`` exists (for ``channel``, if given)."""
        if not isinstance(code, str) or isinstance(version, bool) or not isinstance(version, int):
            return False
        channels = CHANNEL_PARTS if channel is None else (channel,)
        return any((code, version, ch) in self._index for ch in channels)

    def channels_for(self, code: str, version: int) -> list[str]:
        """The channels ``code`` v``version`` has a template for."""
        return [ch for ch in CHANNEL_PARTS if (code, version, ch) in self._index]

    def resolve(self, code: str, version: int, channel: str, locale: str | None) -> tuple[str, str] | None:
        """``(locale used, template name)`` after locale fallback, or None."""
        files = self._index.get((code, version, channel)) if isinstance(code, str) else None
        if not files:
            return None
        for loc in self._locale_chain(locale):
            if loc in files:
                return loc, files[loc]
        return None

    def _locale_chain(self, locale: str | None) -> list[str]:
        chain: list[str] = []
        if isinstance(locale, str) and _LOCALE_RE.match(locale):
            norm = _norm_locale(locale)
            chain += [norm, norm.split("-", 1)[0]]
        chain += [self.default_locale, self.default_locale.split("-", 1)[0]]
        return list(dict.fromkeys(chain))

    def missing_variables(
        self, code: str, version: int, channel: str, locale: str | None, params: Mapping[str, Any] | None
    ) -> tuple[str, list[str]] | None:
        """``(template name, variables it uses that params lack)`` when rendering
        ``channel``'s template with ``params`` fails on an undefined variable, else
        None (renders, or fails for another reason, or has no such template). The
        list names every variable the template refers to and params lack, not only
        the first the renderer tripped on."""
        found = self.resolve(code, version, channel, locale) if channel in CHANNEL_PARTS else None
        if found is None:
            return None
        try:
            self.render(code, version, channel, locale, params)
            return None
        except TemplateError as exc:
            if not exc.reason.startswith("undefined_variable"):
                return None
        name = found[1]
        source = self._plain.loader.get_source(self._plain, name)[0]
        used = meta.find_undeclared_variables(self._plain.parse(source))
        have = {k for k in (params or {}) if isinstance(k, str)}
        return name, sorted(used - have - set(self._plain.globals))

    def mentions(self, code: str, version: int, channel: str, locale: str | None, word: str) -> bool:
        """Whether the template ``render`` would use names ``word`` anywhere in its
        source, or pulls in another file (a cheap test, remembered per file): the
        guard passes a per-user variable (``unsubscribe_url``) only to the templates
        that use it, so the others' renders stay shared by an event's recipients
        (the memo)."""
        found = self.resolve(code, version, channel, locale) if channel in CHANNEL_PARTS else None
        if found is None:
            return False
        key = (found[1], word)
        hit = self._mentions.get(key)
        if hit is None:
            try:
                source = self._plain.loader.get_source(self._plain, found[1])[0]
            except TemplateNotFound:
                return False
            # a template that pulls in another file may use it there
            hit = self._mentions[key] = word in source or any(w in source for w in ("include", "import", "extends"))
        return hit

    # ------------------------------------------------------------------ render

    def render(
        self, code: str, version: int, channel: str, locale: str | None, params: Mapping[str, Any] | None
    ) -> dict[str, str]:
        """The channel's parts (see :data:`CHANNEL_PARTS`) rendered with ``params``.

        Raises :class:`TemplateError` and nothing else.
        """
        parts = CHANNEL_PARTS.get(channel) if isinstance(channel, str) else None
        found = self.resolve(code, version, channel, locale) if parts else None
        if parts is None or found is None:
            raise TemplateError(f"template_missing: {code} v{version} {channel} {locale or self.default_locale}")
        _, name = found
        # Non-string keys cannot be named in a template; dropping them keeps Jinja happy.
        variables = {k: v for k, v in (params or {}).items() if isinstance(k, str)}
        memo_key = self._memo_key(name, channel, variables)
        if memo_key is not None:
            done = self._rendered.get(memo_key)
            if done is not None:
                return dict(done)
        out = self._render(name, channel, parts, variables)
        if memo_key is not None:
            if len(self._rendered) >= RENDER_MEMO:
                self._rendered.clear()
            self._rendered[memo_key] = dict(out)
        return out

    def _memo_key(self, name: str, channel: str, variables: dict[str, Any]) -> tuple[str, str, bytes] | None:
        """The key of a render in the memo, or None when it must not be remembered:
        a template that can draw at random (the ``random`` filter, ``lipsum``) or
        pulls in another file (which could), or params that are not plain JSON. The
        params' key order is part of the key: a template may loop over them."""
        det = self._deterministic.get(name)
        if det is None:
            try:
                source = self._plain.loader.get_source(self._plain, name)[0]
            except TemplateNotFound:
                return None
            det = self._deterministic[name] = not any(w in source for w in _NOT_MEMO)
        if not det:
            return None
        try:
            return name, channel, orjson.dumps(variables)
        except TypeError:
            return None

    def _render(self, name: str, channel: str, parts: tuple[str, ...], variables: dict[str, Any]) -> dict[str, str]:
        out: dict[str, str] = {}
        try:
            plain = self._template(name, html=False)
            contexts: dict[bool, Any] = {}  # one per template, its blocks rendered in it (as Jinja's render does)
            for part in parts:
                html = (channel, part) == _HTML_PART
                tmpl = self._template(name, html=True) if html else plain
                if part in tmpl.blocks:
                    ctx = contexts.get(html)
                    if ctx is None:
                        ctx = contexts[html] = tmpl.new_context(variables)
                    text = "".join(tmpl.blocks[part](ctx))
                elif part == "body" and not tmpl.blocks:
                    text = tmpl.render(variables)
                elif part in OPTIONAL_PARTS.get(channel, ()):
                    continue
                else:
                    raise TemplateError(f"template_incomplete: {name} has no block {part!r}")
                out[part] = self._finish(channel, part, text)
        except TemplateError:
            raise
        except SecurityError as exc:
            raise TemplateError(f"sandbox_violation: {name}: {exc}") from None
        except UndefinedError as exc:
            raise TemplateError(f"undefined_variable: {name}: {exc}") from None
        except TemplateSyntaxError as exc:
            raise TemplateError(f"template_syntax: {name}:{exc.lineno}: {exc.message}") from None
        except TemplateNotFound:
            raise TemplateError(f"template_missing: {name}") from None
        except Exception as exc:  # a filter fed the wrong type by params, recursion, …
            raise TemplateError(f"render_failed: {name}: {type(exc).__name__}: {exc}") from None
        if channel == "webhook":
            try:
                out["body"] = orjson.dumps(orjson.loads(out["body"])).decode()
            except orjson.JSONDecodeError as exc:
                raise TemplateError(f"bad_webhook_json: {name}: {exc}") from None
        return out

    def _template(self, name: str, html: bool) -> Template:
        key = (html, name)
        tmpl = self._compiled.get(key)
        if tmpl is None:
            tmpl = (self._html if html else self._plain).get_template(name)
            # Jinja keeps a template's globals as a ChainMap over the environment's,
            # copied into every render's context key by key: a plain dict (the
            # environment's globals never change after start) is one C-level copy
            tmpl.globals = dict(tmpl.globals)
            self._compiled[key] = tmpl
        return tmpl

    def _finish(self, channel: str, part: str, text: str) -> str:
        text = str(text).strip()
        if part in _SINGLE_LINE:
            text = _WS_RE.sub(" ", text)
        limit = self.limits.get(channel, {}).get(part)
        if limit is not None:
            text = truncate(text, limit)
        return text
