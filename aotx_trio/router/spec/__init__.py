"""The router's spec DSL (docs/formats/spec-dsl.md): ``dsl`` parses a spec document;
``params``, ``results``, ``constraints``, ``types`` and ``values`` are its parts.
"""
