"""notify-stream engine side: Faust app, Redis Streams transport, codecs, models, topics."""

from . import codecs as _codecs  # noqa: F401  (registers the orjson codec)
