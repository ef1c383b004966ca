"""Strict parsing of Kubernetes quantities for extended resources (integers only)."""

from __future__ import annotations

import re

_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"^([+-]?)(\d+)(?:\.(\d+))?(Ki|Mi|Gi|Ti|k|M|G|T|m)?$")


class QuantityError(ValueError):
    """Raised with a short reason; callers add container and resource context."""


def parse_int_quantity(raw: object) -> int:
    """Parse an extended-resource quantity that must be a non-negative integer.

    The apiserver already refuses fractional extended resources, but the webhook and extender may see
    raw specs first, so the same rule is enforced here with a precise reason.
    """
    if isinstance(raw, bool):
        raise QuantityError("a boolean is not a quantity")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float):
        if not raw.is_integer():
            raise QuantityError("must be a whole number")
        value = int(raw)
    elif isinstance(raw, str):
        m = _QUANTITY.match(raw.strip())
        if m is None:
            raise QuantityError("not a Kubernetes quantity")
        sign, whole, frac, suffix = m.groups()
        suffix = suffix or ""
        if suffix == "m":
            milli = int(whole) * 1000 + (int((frac or "0")[:3].ljust(3, "0")) if frac else 0)
            if milli % 1000 or (frac and len(frac) > 3):
                raise QuantityError("must be a whole number")
            value = milli // 1000
        else:
            mult = _SUFFIX[suffix]
            if frac and int(frac) != 0:
                exact = int(whole + frac) * mult
                scale = 10 ** len(frac)
                if exact % scale:
                    raise QuantityError("must be a whole number")
                value = exact // scale
            else:
                value = int(whole) * mult
        if sign == "-":
            value = -value
    else:
        raise QuantityError(f"unsupported type {type(raw).__name__}")
    if value < 0:
        raise QuantityError("must not be negative")
    return value


def parse_cpu_milli(raw: object) -> int:
    """CPU quantity in millicores ("500m", "2", "1.5"); used for host fit checks only."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return round(float(raw) * 1000)
    if not isinstance(raw, str):
        raise QuantityError(f"unsupported type {type(raw).__name__}")
    s = raw.strip()
    if s.endswith("m"):
        return int(s[:-1])
    return round(float(s) * 1000)


def parse_memory_mib(raw: object) -> int:
    """Host memory quantity rounded up to MiB; used for host fit checks only."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return -(-int(raw) // 2**20)
    if not isinstance(raw, str):
        raise QuantityError(f"unsupported type {type(raw).__name__}")
    m = _QUANTITY.match(raw.strip())
    if m is None:
        raise QuantityError("not a Kubernetes quantity")
    _, whole, frac, suffix = m.groups()
    mult = _SUFFIX.get(suffix or "", 1)
    value = float(f"{whole}.{frac or 0}") * mult
    return -(-int(value) // 2**20)
