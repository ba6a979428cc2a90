"""The model registry's storage, shared by the router, the webhooks and the admin CLI:
``records`` (the documents), ``store`` (the backend interface), ``folder`` and
``postgres`` (its two backends), ``backends`` (opening one from a URL) and ``feed``
(the event feed).  It imports neither ``router`` nor ``webhooks``.
"""
