"""The serving router: its model registry and what its routes answer
(docs/formats/registry.md, docs/decisions.md, docs/api.md "Serving router").

    service            RouterService: every route's answer; index + rescan + reaper tasks
    index              the GET /models index, refreshed from the event feed
    contract dispatch  invoke envelope + spec/upload; running it on the runtime
    identity  deploy   build commit, digests, the attestation check; readiness, on-demand load
    defaults           the default models ``aotx serve`` registers
    cli  cli_args      ``aotx registry`` (arguments stay argparse-only for ``--help``)
    scratch            scratch sessions: numbered verified revisions, sliding lease
    aliases            alias resolution with the complete verified chain
    registry           models, releases, aliases: every rule, once, over any backend
    feed  artifacts    event derivation + rescan heal + retention; artifact blobs
    store  backends    the one backend protocol; ``open_store`` picks a backend
    store_folder       folder backend (embedded default)
    store_pg           PostgreSQL backend (psycopg 3 + psycopg-pool)
    records            the documents: canonical JSON, keys, times

The HTTP routes are mounted by the gateway (``aotx_trio.gateway.router_routes``).
"""
