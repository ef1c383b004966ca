"""Performance model of prefill/decode pods on shared GPUs (docs/pd-packing.md). Pure."""
