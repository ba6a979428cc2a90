"""The specs of the default models (docs/formats/spec-dsl.md), installed as package
data: ``textgen.json`` and ``embedding.json``."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, cast

NAMES = ("textgen", "embedding")


def default_spec(name: str) -> dict[str, Any]:
    """The default spec document for model type ``name`` (a fresh copy)."""
    if name not in NAMES:
        raise KeyError(name)
    text = resources.files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8")
    return cast(dict[str, Any], json.loads(text))
