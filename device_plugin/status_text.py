"""A refusal's text cut to what a gRPC status carries. Pure.

The message travels percent-encoded in the `grpc-message` trailer (grpc/grpc doc/PROTOCOL-HTTP2.md,
"Status-Message": bytes outside %x20-%x7E, and `%` itself, become `%XX`). A receiver refuses trailers over its
metadata limit: grpc-core's GRPC_ARG_MAX_METADATA_SIZE defaults to 8 KiB (include/grpc/impl/channel_arg_names.h),
grpc-go (the kubelet) allows 16 MiB today but announces 8 KiB as its next default (internal/transport/defaults.go,
defaultClientMaxHeaderListSize, upcomingDefaultHeaderListSize) — over it the caller sees RESOURCE_EXHAUSTED
instead of our reason. So a message is cut to MAX_STATUS_BYTES encoded bytes, leaving
room for the other headers; the full text goes to the log.
"""

from __future__ import annotations

MAX_STATUS_BYTES = 2048


def encoded_len(text: str) -> int:
    """Bytes `text` takes as a percent-encoded grpc-message."""
    return sum(1 if 0x20 <= b <= 0x7E and b != 0x25 else 3 for b in text.encode("utf-8"))


def trimmed(text: str, limit: int = MAX_STATUS_BYTES) -> str:
    """`text` if it fits in `limit` encoded bytes, else its head and "... (N more bytes)" within the limit;
    N counts the UTF-8 bytes left out."""
    if encoded_len(text) <= limit:
        return text
    total = len(text.encode("utf-8"))
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix whose encoded form plus the suffix fits
        mid = (lo + hi + 1) // 2
        head = text[:mid]
        suffix = f"... ({total - len(head.encode('utf-8'))} more bytes)"
        if encoded_len(head) + encoded_len(suffix) <= limit:
            lo = mid
        else:
            hi = mid - 1
    head = text[:lo]
    return f"{head}... ({total - len(head.encode('utf-8'))} more bytes)"
