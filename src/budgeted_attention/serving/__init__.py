"""``baa serve``: a budget-aware inference server (engine, latency model, batcher, HTTP API, metrics)."""
