"""setuptools shim: the native extension is built by build.py (cffi, out-of-line API mode)."""

from setuptools import setup

setup(cffi_modules=["build.py:make_ffi"])
