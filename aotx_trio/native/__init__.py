"""The Python faces of the native library (csrc/, built into ``aotx_trio._native``).

``lib`` loads the cffi extension and translates its return codes (the one place);
each other module wraps one C area: ``device`` (the state tables), ``journal`` (the
record codec), ``engine`` and ``tokenizer`` (inference), ``embed`` (the embedding
encoder, with its file readers ``_bert_config``, ``_safetensors``, ``_wordpiece``).
Nothing here imports the process roles, the router or the gateway.
"""
