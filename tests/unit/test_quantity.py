"""Strict integer quantities for extended resources, and the host-resource helpers."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu.quantity import MAX_QUANTITY_LENGTH, QuantityError, parse_cpu_milli, parse_int_quantity, parse_memory_mib

_MULT = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", 1),
        (2, 2),
        (3.0, 3),
        ("0", 0),
        ("+4", 4),
        (" 5 ", 5),
        ("1k", 1000),
        ("2Gi", 2 * 2**30),
        ("1.5k", 1500),
        ("1.0", 1),
        ("1.", 1),
        ("1000m", 1),
        ("2000m", 2),
        ("1e3", 1000),
        ("2E2", 200),
        ("1E", 10**18),
        ("1Pi", 2**50),
        ("0.5Ki", 512),
    ],
)
def test_parse_int_quantity_accepts_whole_numbers(raw: object, expected: int) -> None:
    assert parse_int_quantity(raw) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("-1", "negative"),
        (-1, "negative"),
        ("-0.5", "negative"),
        ("0.5", "whole number"),
        (".5", "whole number"),
        ("500m", "whole number"),
        ("1500m", "whole number"),
        ("1.5m", "whole number"),
        ("1500u", "whole number"),
        (1.5, "whole number"),
        (float("nan"), "whole number"),
        ("1.2345k", "whole number"),
        ("1e-1", "whole number"),
        ("two", "not a Kubernetes quantity"),
        ("", "not a Kubernetes quantity"),
        ("1 Gi", "not a Kubernetes quantity"),
        ("1GB", "not a Kubernetes quantity"),
        ("0x10", "not a Kubernetes quantity"),
        ("1e999999999", "exponent out of range"),
        (True, "boolean"),
        (False, "boolean"),
        (None, "unsupported type NoneType"),
        ([1], "unsupported type list"),
    ],
)
def test_parse_int_quantity_rejects_with_reason(raw: object, reason: str) -> None:
    with pytest.raises(QuantityError, match=reason):
        parse_int_quantity(raw)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(_MULT)))
def test_suffixes_scale_exactly(n: int, suffix: str) -> None:
    assert parse_int_quantity(f"{n}{suffix}") == n * _MULT[suffix]


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=1, max_value=999))
def test_milli_quantities_are_integers_only_on_whole_thousands(n: int, rest: int) -> None:
    assert parse_int_quantity(f"{n * 1000}m") == n
    with pytest.raises(QuantityError, match="whole number"):
        parse_int_quantity(f"{n * 1000 + rest}m")


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=1, max_value=9))
def test_decimal_fractions_are_rejected_unless_a_suffix_makes_them_whole(n: int, tenth: int) -> None:
    with pytest.raises(QuantityError):
        parse_int_quantity(f"{n}.{tenth}")
    assert parse_int_quantity(f"{n}.{tenth}k") == n * 1000 + tenth * 100


@pytest.mark.parametrize(
    ("raw", "milli"),
    [("500m", 500), ("2", 2000), ("1.5", 1500), (2, 2000), (0.25, 250)],
)
def test_parse_cpu_milli(raw: object, milli: int) -> None:
    assert parse_cpu_milli(raw) == milli


@pytest.mark.parametrize(
    ("raw", "mib"),
    [("1Gi", 1024), ("512Mi", 512), ("1G", 954), (2**20, 1), (2**20 + 1, 2), ("1", 1), ("0", 0), ("1.5Gi", 1536)],
)
def test_parse_memory_mib_rounds_up(raw: object, mib: int) -> None:
    assert parse_memory_mib(raw) == mib


@pytest.mark.parametrize("raw", ["lots", None, True])
def test_parse_memory_mib_rejects(raw: object) -> None:
    with pytest.raises(QuantityError):
        parse_memory_mib(raw)


@pytest.mark.parametrize(
    "raw",
    [
        "\u0661",
        "\uff11",
        "\u0663Gi",
        "1\u0661",
        "1_000",
        "1e\u0661",
        "1.\u0665",
        "\u00b2",
        "1 0",
        "1e",
        "1e+",
        ".",
        "+",
        "1.2.3",
    ],
)
def test_only_ascii_digits_in_the_quantity_grammar(raw: str) -> None:
    """Python's int() and \\d take Arabic-Indic and full-width digits and underscores; Kubernetes does not."""
    with pytest.raises(QuantityError):
        parse_int_quantity(raw)
    with pytest.raises(QuantityError):
        parse_cpu_milli(raw)


@pytest.mark.parametrize("raw", ["1" * 12_001, "1" * 12_000 + "x", "." + "1" * 12_000 + "e", "9" * 65])
def test_a_long_quantity_is_refused_at_once(raw: str) -> None:
    """The old regex backtracked quadratically: 12,001 characters took 14-20 s on the event loop. This thread's
    CPU time, not the wall clock: a loaded machine preempting the test adds none (the check is microseconds). The
    bound is loose (a full garbage collection of the whole suite's heap can land in the window and is charged to
    this thread) and still a fourteenth of the old regex's time."""
    started = time.thread_time()
    with pytest.raises(QuantityError, match=f"longer than {MAX_QUANTITY_LENGTH} characters"):
        parse_int_quantity(raw)
    assert time.thread_time() - started < 1.0


@given(st.text(alphabet="0123456789.+-eEkKMGTPinu m\u0661", max_size=3 * MAX_QUANTITY_LENGTH))
def test_the_parser_refuses_or_answers_an_integer_never_crashes(raw: str) -> None:
    try:
        value = parse_int_quantity(raw)
    except QuantityError:
        return
    assert isinstance(value, int) and value >= 0
    assert len(raw.strip(" \t")) <= MAX_QUANTITY_LENGTH and raw.isascii()


def test_an_exponent_is_a_suffix_of_ascii_digits() -> None:
    assert parse_int_quantity("1e3") == 1000
    assert parse_int_quantity("2E+2") == 200
    assert parse_int_quantity("1E") == 10**18  # E alone is exa


def test_a_repeated_string_gives_the_same_answer_and_a_bad_one_fails_every_time() -> None:
    """Strings are cached (a restart parses the same few for every pod); errors are not, and say why each time."""
    assert [parse_int_quantity("32Gi") for _ in range(3)] == [32 * 2**30] * 3
    for raw, reason in (("500m", "whole number"), ("-1", "negative"), ("1x", "unknown suffix")):
        for _ in range(2):
            with pytest.raises(QuantityError, match=reason):
                parse_int_quantity(raw)
