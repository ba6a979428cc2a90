"""Outbound HTTP: every request the service makes to a URL a caller named (upload
sources, webhook targets) goes through here: ``policy`` (which addresses may be
reached), ``targets`` (the one URL check and address resolution) and ``pinned_http``
(a request pinned to the addresses that check resolved).
"""
