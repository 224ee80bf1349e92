"""The ``orjson`` codec every record on every topic uses.

Registered with Faust under the name ``orjson`` at import time of :mod:`pipeline`,
so ``faust.Record`` subclasses can say ``serializer="orjson"``.
"""

from typing import Any

import orjson
from faust.serializers import codecs

__all__ = ["OrjsonCodec", "dumps", "loads"]

_OPTS = orjson.OPT_NON_STR_KEYS


def _default(obj: Any) -> Any:
    # nested faust.Record (e.g. Outcome.attempt)
    as_dict = getattr(obj, "asdict", None)
    if as_dict is not None:
        return as_dict()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, default=_default, option=_OPTS)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    return orjson.loads(data)


class OrjsonCodec(codecs.Codec):
    def _dumps(self, obj: Any) -> bytes:
        return dumps(obj)

    def _loads(self, s: bytes) -> Any:
        return loads(s)


codecs.register("orjson", OrjsonCodec())
