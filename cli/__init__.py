"""The ``pdserve`` command line."""
