"""Performance model of prefill/decode pods on shared GPUs (issue 8; docs/pd-packing.md). Pure."""
