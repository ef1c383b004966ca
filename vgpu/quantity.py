"""Strict parsing of Kubernetes quantities for extended resources (integers only)."""

from __future__ import annotations

import re
from fractions import Fraction

# Every suffix of the Kubernetes quantity grammar (resource.Quantity): decimal SI, binary SI, and
# the decimal exponent form ("1e3"), which the regex captures separately.
_SCALE: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(?:([KMGTPE]i|[numkMGTPE])|[eE]([+-]?\d+))?$")
_MAX_EXPONENT = 30  # far beyond any real resource; keeps "1e999999999" from costing time


class QuantityError(ValueError):
    """Raised with a short reason; callers add container and resource context."""


def _exact(raw: str) -> Fraction:
    """The exact value of a quantity string; exact so that "500m" is 1/2, never rounded to 0 or 1."""
    m = _QUANTITY.match(raw.strip())
    if m is None:
        raise QuantityError("not a Kubernetes quantity")
    sign, number, suffix, exponent = m.groups()
    if exponent is not None:
        if abs(int(exponent)) > _MAX_EXPONENT:
            raise QuantityError(f"exponent out of range (at most {_MAX_EXPONENT})")
        scale = Fraction(10) ** int(exponent)
    else:
        scale = _SCALE[suffix or ""]
    value = Fraction(number) * scale
    return -value if sign == "-" else value


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
        exact = _exact(raw)
        if exact < 0:
            raise QuantityError("must not be negative")
        if exact.denominator != 1:
            raise QuantityError("must be a whole number")
        value = int(exact)
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
    return -(-_exact(raw) // 2**20)
