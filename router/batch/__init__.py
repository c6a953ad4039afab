"""The batch tier: OpenAI's Files and Batch API behind the router.

``file_store`` keeps files; ``validation`` checks an input file whole; ``book`` keeps
batches in the control state with a lease per batch; ``runner`` runs them through the
router's own request path at the lowest priority. ``tier`` holds what the HTTP layer
needs of it.
"""
