"""Running a request on the chosen workers: the pipeline that calls admission once then the
orchestrator (``pipeline``), prefill then decode with retries and aborts
(``orchestrate``), the router's own HTTP/1.1 engine client, and the SSE relay with its
usage accounting.

Owns: a request's life from admission to the last byte. May import: every stage below
it. Never ``http``.
"""
