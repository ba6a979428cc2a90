"""Webhooks (docs/webhooks.md): the registry's event feed
delivered to subscriptions in order, at least once, Ed25519-signed.

- :mod:`~aotx_trio.webhooks.records`: the subscription document and its cursor.
- :mod:`~aotx_trio.webhooks.targets`: the URL rules and the address vetting (the
  upload delivery's resolver and address policy, reused).
- :mod:`~aotx_trio.webhooks.signing`: the key file, signing and the consumer's check.
- :mod:`~aotx_trio.webhooks.post`: one bounded POST to a pinned address.
- :mod:`~aotx_trio.webhooks.delivery`: one subscription's delivery under its store lease.
- :mod:`~aotx_trio.webhooks.service`: the routes' answers and the supervisor of the
  delivery tasks.

docs/webhooks.md is the consumer's guide; docs/formats/registry.md the storage.
"""
