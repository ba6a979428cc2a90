"""setuptools shim: the native extension is built by build.py (cffi, out-of-line API mode).

``AOTX_SKIP_NATIVE_BUILD=1`` installs the Python package without compiling it:
scripts/_install sets it for its editable install and then runs build.py itself,
so the library is compiled once, in place.
"""

import os

from setuptools import setup

native = os.environ.get("AOTX_SKIP_NATIVE_BUILD") != "1"
setup(cffi_modules=["build.py:make_ffi"] if native else [])
