"""Request-level what-if: a workload of requests routed onto a deployment of prefill/decode slices,
simulated request by request, reported layer by layer (allocation, queuing, cache, communication)."""
