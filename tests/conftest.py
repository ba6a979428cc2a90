"""Suite-wide settings.  ``HYPOTHESIS_PROFILE=ci`` (set by ``.ci/run``) derandomizes
hypothesis, so CI runs the same examples every time; local runs explore new ones."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
