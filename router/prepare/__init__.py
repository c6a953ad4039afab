"""The first stage of a request: the body validated (``schemas``), aliases and the chat
template applied, the prompt tokenized with the model's own tokenizer
(``token_prefix_cache``) and cut into blocks hashed as vLLM hashes them
(``prompt_blocks``), the context window checked, and n>1 or prompt lists fanned out
(``fan_out``).

Owns: ``PreparedRequest``. May import: the shared bottom of the router (``errors``,
``settings``), ``scheduling``'s registry view of pools. Never ``http``.
"""
