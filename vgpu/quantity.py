"""Strict parsing of Kubernetes quantities for extended resources (integers only)."""

from __future__ import annotations

import functools
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
_MAX_EXPONENT = 30  # far beyond any real resource; keeps "1e999999999" from costing time
# Longer than any quantity a person writes ("1.5Gi", "20480", "500m"); the cap bounds the work a hostile body can
# ask of the parser before it is refused (the parser is linear anyway).
MAX_QUANTITY_LENGTH = 64
_DIGITS = frozenset("0123456789")  # ASCII only: str.isdigit() also takes Arabic-Indic and full-width digits


class QuantityError(ValueError):
    """Raised with a short reason; callers add container and resource context."""


def _digits(s: str, i: int) -> int:
    """The index after the run of ASCII digits starting at i."""
    while i < len(s) and s[i] in _DIGITS:
        i += 1
    return i


def _exact(raw: str) -> Fraction:
    """The exact value of a quantity string; exact so that "500m" is 1/2, never rounded to 0 or 1.

    One left-to-right pass over resource.Quantity's grammar (k8s.io/apimachinery pkg/api/resource/quantity.go,
    the comment above `type Quantity`): [+-] then digits[.digits] or .digits, then a binary SI suffix, a decimal
    SI suffix or an exponent e[+-]digits. No regex, so no backtracking: a 12,000-character string costs one pass
    over its first MAX_QUANTITY_LENGTH characters."""
    s = raw.strip(" \t")
    if len(s) > MAX_QUANTITY_LENGTH:
        raise QuantityError(f"longer than {MAX_QUANTITY_LENGTH} characters")
    i = 1 if s[:1] in ("+", "-") else 0
    start = i
    i = _digits(s, i)
    whole = s[start:i]
    fraction = ""
    if i < len(s) and s[i] == ".":
        end = _digits(s, i + 1)
        fraction = s[i + 1 : end]
        i = end
    if not whole and not fraction:
        raise QuantityError("not a Kubernetes quantity (no ASCII digits where the number should be)")
    suffix = s[i:]
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        j = 2 if suffix[1:2] in ("+", "-") else 1
        if j == len(suffix) or _digits(suffix, j) != len(suffix):
            raise QuantityError("not a Kubernetes quantity (exponent needs ASCII digits)")
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"exponent out of range (at most {_MAX_EXPONENT})")
        scale = Fraction(10) ** exponent
    elif suffix in _SCALE:
        scale = _SCALE[suffix]
    else:
        raise QuantityError(f"not a Kubernetes quantity (unknown suffix {suffix[:8]!r})")
    value = Fraction(int(whole or "0") * 10 ** len(fraction) + int(fraction or "0"), 10 ** len(fraction)) * scale
    return -value if s[:1] == "-" else value


@functools.lru_cache(maxsize=1024)
def _int_of_str(raw: str) -> int:
    """A whole non-negative quantity string's value. Cached: a restart parses the same few strings ("1", "50",
    "32Gi") for every one of tens of thousands of pods, and the exact parse costs ~0.1 ms each (an invalid string
    raises every time; errors are not cached)."""
    exact = _exact(raw)
    if exact < 0:
        raise QuantityError("must not be negative")
    if exact.denominator != 1:
        raise QuantityError("must be a whole number")
    return int(exact)


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
        value = _int_of_str(raw)
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
    return round(_exact(raw) * 1000)


def parse_memory_mib(raw: object) -> int:
    """Host memory quantity rounded up to MiB; used for host fit checks only."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return -(-int(raw) // 2**20)
    if not isinstance(raw, str):
        raise QuantityError(f"unsupported type {type(raw).__name__}")
    return -(-_exact(raw) // 2**20)
