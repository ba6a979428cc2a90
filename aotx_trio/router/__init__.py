"""The serving router's model registry (docs/formats/registry.md, docs/decisions.md).

    cli  cli_args      ``aotx registry`` (arguments stay argparse-only for ``--help``)
    scratch            scratch sessions: numbered verified revisions, sliding lease
    aliases            alias resolution with the complete verified chain
    registry           models, releases, aliases: every rule, once, over any backend
    feed  artifacts    event derivation + rescan heal + retention; artifact blobs
    store  backends    the one backend protocol; ``open_store`` picks a backend
    store_folder       folder backend (embedded default)
    store_pg           PostgreSQL backend (psycopg 3 + psycopg-pool)
    records            the documents: canonical JSON, keys, times

The HTTP routes and invoke are mounted by the gateway (a later slice).
"""
