"""The KV handoff contract between prefill and decode, and the NIXL transport config."""
