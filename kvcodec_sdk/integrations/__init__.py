"""Adapters that let inference engines select kvcodec codecs by name.

Each submodule imports its engine lazily and only when it is imported itself, so ``import
kvcodec_sdk`` never needs an engine package:

- :mod:`kvcodec_sdk.integrations.lmcache`: every registered codec as an LMCache v1 serde
  (``"serde": {"type": "kvcodec-fp8"}`` in an L2 adapter's configuration).
- :mod:`kvcodec_sdk.integrations.vllm`: a vLLM offloading spec (``"spec_name":
  "KvcodecOffloadingSpec"`` in the ``OffloadingConnector``'s extra configuration) that encodes
  offloaded blocks with a codec chosen by name.
"""

#: The LMCache release :mod:`kvcodec_sdk.integrations.lmcache` is built and tested against (the
#: ``engines`` extra pins it; LMCache's serde API is young, and another release may differ).
LMCACHE_VERSION = "0.5.6"

#: The vLLM release :mod:`kvcodec_sdk.integrations.vllm` is built and tested against (the
#: ``vllm`` extra pins it; vLLM marks its offloading-spec API experimental, and another release
#: may differ).
VLLM_VERSION = "0.32.0"
