"""Shared contracts: the wire types every part of pdserve may import.

Nothing here imports a web framework, the router or a worker: this package is
the bottom of the dependency graph (router -> contracts <- workers).
"""
