"""The prefill worker agent: one vLLM as NixlConnector ``kv_producer``."""
