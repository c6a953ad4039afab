"""A calibrated, GPU-free stand-in for vLLM that speaks vLLM's protocol.

Same HTTP API, same ``kv_transfer_params`` handoff, same ``/metrics`` names, so the
router and the agents run against it unchanged. Step times come from a profile
measured on real engines (``sim/profiles``), not from constants.
"""

# The sim's --max-model-len when none is given (an agent registers it for the router).
DEFAULT_MAX_MODEL_LEN = 4096
