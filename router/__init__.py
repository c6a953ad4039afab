"""The front door: OpenAI-compatible API, worker registry, P/D orchestration."""
