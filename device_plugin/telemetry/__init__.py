"""Node telemetry: Prometheus collectors over the watchdog's snapshot, the EPP feed, the file-discovery writer."""
