"""Model preparation: build or convert models into the local cache, offline."""
