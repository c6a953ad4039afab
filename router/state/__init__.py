"""Control-plane state behind one interface, in memory or in Redis (``state.base``)."""
