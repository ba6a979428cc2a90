"""An item pushed to many stream subscribers at once, encoded once per form.

The runtime's fanout (runtime/fanout.py) hands the *same* :class:`Pushed`
object to every subscriber an event reaches; each layer that encodes it (the
service socket's item frames, the gateway's SSE ``data:`` line) encodes it
once and keeps the bytes on the object under its own form name, so 500
subscribers cost one JSON encoding per layer, not 500.  A pushed item is
never mutated once pushed.  This module is a leaf (both the runtime and the
device client import it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Pushed(dict[str, Any]):
    """A JSON object shared by the subscribers it is pushed to (read only)."""

    __slots__ = ("_encoded",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._encoded: dict[str, bytes] = {}

    def encoded(self, form: str, encode: Callable[[Any], bytes]) -> bytes:
        """``encode(self)``, computed on the first call for ``form`` and kept."""
        data = self._encoded.get(form)
        if data is None:
            data = self._encoded[form] = encode(self)
        return data
