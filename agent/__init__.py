"""The worker-agent core shared by prefill/ and decode/: it runs and supervises one vLLM.

Role specifics (kv_producer vs kv_consumer, admission) live in prefill/ and decode/;
this package only knows how to start an engine, watch it and report it.
"""
