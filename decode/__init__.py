"""The decode worker agent: one vLLM as NixlConnector ``kv_consumer``."""
