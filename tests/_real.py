"""The real default models for tests: assembled (once, then cached) from the installed
PyPI packages by aotx_trio.default_models, exactly as `aotx serve` does. Never skipped: the
install step (scripts/_install) always installs both packages."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from aotx_trio.default_models import default_embedding_model, default_text_model


@cache
def real_gguf() -> Path:
    return default_text_model()


@cache
def real_embedding_dir() -> Path:
    return default_embedding_model()
