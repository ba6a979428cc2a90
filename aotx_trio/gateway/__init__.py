"""The gateway process role: HTTP, credentials, SSE fanout, registry index, webhooks.

Importing this package loads nothing heavy; each submodule is imported where it
is used (``aotx gateway serve`` -> ``serve``, ``aotx gateway write-grants`` -> ``grants``).
"""
