"""Admission: the request limits, tenants and their token buckets, the TTFT predictor, and
the prefill queue. One entry point per choice, ``Admission.admit_prompt``, which owns
measuring the prompt (head, then whole) and answers 429/413 early or admits.

Owns: who gets in, and when. May import: ``prepare`` (the request), ``scheduling`` (what
a worker lacks of a prompt), ``fleet`` (pools), ``observability``, ``state``. Never
``http``.
"""
