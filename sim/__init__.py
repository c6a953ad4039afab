"""A calibrated, GPU-free stand-in for vLLM that speaks vLLM's protocol.

Same HTTP API, same ``kv_transfer_params`` handoff, same ``/metrics`` names, so the
router and the agents run against it unchanged. Step times come from a profile
measured on real engines (``sim/profiles``), not from constants.
"""
