"""aotx-trio: an LLM serving runtime for persistent shared conversations.

Subpackages and modules (imports point downward):

    cli                       command line (``aotx``)
    runtime/  gateway/        the two process roles
    device  engine  embed     Python faces of the native library
    native                    loads the cffi extension and translates its codes
    errors  config            leaves
"""

__version__ = "0.1.0"
