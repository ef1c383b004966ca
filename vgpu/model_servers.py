"""Model servers sized to their slice: find vLLM or SGLang in a container, and the memory flag that keeps it inside.

vLLM sizes itself as `--gpu-memory-utilization` (default 0.9) of the memory CUDA reports, SGLang its weights
and KV pool as `--mem-fraction-static` of it; on a shared card CUDA reports the whole card, so an unsized
server tries to take most of it. This module is pure: a container (a JSON mapping), its slice and the card
sizes it may land on in, a `Sizing` out (the flag to add, where, and warnings). The webhook turns it into a
JSON Patch (webhook/model_servers.py); docs/model-servers.md has the table per request form and version.

Flags and semantics, as read upstream:
- vLLM `--gpu-memory-utilization`: "the fraction of GPU memory to be used for the model executor ... a
  per-instance limit" (vllm/config/cache.py, `CacheConfig.gpu_memory_utilization`, v0.10-v0.11; the default
  became 0.92 in later releases). Weights, profiled activations and the KV cache all come out of it; CUDA
  graphs are captured after the KV cache is sized, outside that budget (hence `VLLM_MARGIN_*`).
- vLLM `--kv-cache-memory-bytes` (vllm/config/cache.py `kv_cache_memory_bytes`, added by vllm-project/vllm
  pull request 21489, first in v0.10.1): when set, vLLM ignores `--gpu-memory-utilization`, so weights and
  activations are no longer bounded by anything the webhook can compute. Never added; a user's value is kept.
- SGLang `--mem-fraction-static`: KV pool = free memory after loading weights - total * (1 - fraction)
  (python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py `profile_max_num_token`, v0.5.x), so
  weights + KV pool end at fraction * card counting every process on the card; activations and CUDA-graph
  buffers come on top, for which SGLang itself reserves 512 + 1.5 * max(chunked prefill, 2048) +
  2 * cuda-graph max batch + 1024 * tp * pp / 8 MiB (python/sglang/srt/server_args.py
  `_handle_gpu_memory_settings`, v0.5.x). `--max-total-tokens` only caps the pool further.
Both servers parse with argparse, so `--flag=value` is one token that works in a list and in a shell line.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

# vLLM: what the utilisation budget leaves out (CUDA-graph pool, allocator fragmentation) gets at least 1 GiB
# or 5 % of the slice. vLLM's own default leaves 10 % of a card for the same things.
VLLM_MARGIN_MIN_MIB = 1024
VLLM_MARGIN_SHARE = 0.05
VLLM_DEFAULT_UTILIZATION = 0.9
VLLM_KV_BYTES_SINCE = (0, 10, 1)
# SGLang's own reserve for what `--mem-fraction-static` leaves out, with its defaults where the pod sets none.
# 8192 is the chunked-prefill size SGLang picks on the large cards; on smaller cards it picks less, so the
# reserve computed here is then larger than SGLang's own (safe, at the cost of KV-cache room).
SGLANG_DEFAULT_CHUNKED_PREFILL = 8192
SGLANG_DEFAULT_CUDA_GRAPH_MAX_BS = 512
# With no inventory known, a percentage is sized for the smallest serving card (T4, 15360 MiB): the margin
# in MiB then shrinks as a share on any larger card, so the fraction stays safe there too.
SMALLEST_CARD_MIB = 15360
FRACTION_DIGITS = 4

_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})
_VLLM_IN_SCRIPT = re.compile(r"\bvllm\s+serve\b|\bvllm\.entrypoints\.openai\.api_server\b")
_SGLANG_IN_SCRIPT = re.compile(r"\bsglang\.launch_server\b")
_VERSION = re.compile(r":v?(\d+)\.(\d+)(?:\.(\d+))?")


class Server(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


MEMORY_FLAG = {Server.VLLM: "--gpu-memory-utilization", Server.SGLANG: "--mem-fraction-static"}


@dataclass(frozen=True, slots=True)
class Invocation:
    """Where a container starts a model server, and the arguments the server will parse.

    `field`/`position`: the `command` or `args` entry holding a shell script that starts it (`shell`), or,
    for a plain argv, None/-1: the flag is then appended to `args` (Kubernetes runs command + args).
    """

    server: Server
    argv: tuple[str, ...]
    version: tuple[int, ...] | None
    field: Literal["command", "args"] | None = None
    position: int = -1
    script: str = ""
    insert_at: int = 0  # in `script`: just after the server's invocation words

    @property
    def shell(self) -> bool:
        return self.field is not None


# What CUDA reports as the device's memory, which both servers take their fraction of: the whole card (plain and
# NVML-capped nodes), or the slice where HAMi-core is preloaded on every node (its cuMemGetInfo_v2 hook, HAMi-core
# src/cuda/memory.c with HOOK_MEMINFO_ENABLE, reports total = min(limit, card), free = limit - the container's usage).
Seen = Literal["card", "slice"]


@dataclass(frozen=True, slots=True)
class Slice:
    """One vGPU of the container: MiB or percent of the card, the card sizes (MiB) it may land on, and what CUDA
    reports there (`seen`)."""

    memory_mib: int | None
    percentage: int | None
    cards_mib: tuple[int, ...] = ()
    seen: Seen = "card"

    def on(self, card_mib: int) -> int:
        if self.memory_mib is not None:
            return min(self.memory_mib, card_mib)
        assert self.percentage is not None
        return card_mib * self.percentage // 100

    def seen_on(self, card_mib: int) -> int:
        """The device memory the server will read on that card, which its fraction is of."""
        return card_mib if self.seen == "card" else self.on(card_mib)


Outcome = Literal["sized", "user-set", "whole-card", "unsafe", "not-a-server"]


@dataclass(frozen=True, slots=True)
class Sizing:
    """What to do with one container: `flag` to add (None: nothing), and warnings for the user."""

    container: str
    outcome: Outcome
    server: Server | None = None
    flag: str | None = None
    fraction: float | None = None
    invocation: Invocation | None = None
    warnings: tuple[str, ...] = ()


def recognise(container: Mapping[str, Any]) -> Invocation | None:
    """The vLLM or SGLang server a container starts: from its command/args, or a vLLM image's entrypoint."""
    command = _strings(container.get("command"))
    args = _strings(container.get("args"))
    image = str(container.get("image") or "")
    argv = command + args
    if argv and _basename(argv[0]) in _SHELLS:
        return _in_shell(command, args, image)
    for i, token in enumerate(argv):
        if _basename(token) == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return Invocation(Server.VLLM, tuple(argv[i + 2 :]), _version(image, Server.VLLM))
        if token in ("vllm.entrypoints.openai.api_server", "sglang.launch_server"):
            server = Server.VLLM if token.startswith("vllm") else Server.SGLANG
            return Invocation(server, tuple(argv[i + 1 :]), _version(image, server))
    if not command and _is_vllm_image(image):  # vllm/vllm-openai's entrypoint is the server: args are its argv
        return Invocation(Server.VLLM, tuple(args), _version(image, Server.VLLM))
    return None


def size(container: Mapping[str, Any], slice_: Slice) -> Sizing:
    """The memory flag that keeps the container's model server inside `slice_` on every card it may get."""
    name = str(container.get("name") or "<unnamed>")
    inv = recognise(container)
    if inv is None:
        return Sizing(name, "not-a-server")
    if _whole_card(slice_):
        return Sizing(name, "whole-card", inv.server, invocation=inv)
    cards = slice_.cards_mib or ((SMALLEST_CARD_MIB,) if slice_.percentage is not None else ())
    if not slice_.cards_mib and slice_.seen == "slice" and slice_.memory_mib is not None:
        cards = (slice_.memory_mib,)  # the server sees the slice itself: the card's size does not matter
    flags = _flags(inv.argv)
    who = f"container {name!r}"
    if "--config" in flags and MEMORY_FLAG[inv.server] not in flags:
        # A flag on the command line wins over the file, and the file may already set the fraction: never override.
        return Sizing(
            name,
            "user-set",
            inv.server,
            invocation=inv,
            warnings=(
                f"{who}: --config={flags['--config']} may set {MEMORY_FLAG[inv.server]}, which the webhook cannot "
                "read: not sized; set it on the command line to have it checked",
            ),
        )
    if inv.server is Server.VLLM:
        return _size_vllm(name, who, inv, flags, slice_, cards)
    return _size_sglang(name, who, inv, flags, slice_, cards)


def vllm_budget_mib(fraction: float, card_mib: int) -> int:
    """What vLLM may take under `fraction` on a card: the whole utilisation budget."""
    return math.ceil(fraction * card_mib)


def vllm_margin_mib(slice_mib: int) -> int:
    return max(VLLM_MARGIN_MIN_MIB, math.ceil(slice_mib * VLLM_MARGIN_SHARE))


def sglang_reserve_mib(argv: Sequence[str]) -> int:
    """SGLang's own reserve for activations and CUDA-graph buffers (outside `--mem-fraction-static`)."""
    flags = _flags(argv)
    chunked = _int(flags, "--chunked-prefill-size") or SGLANG_DEFAULT_CHUNKED_PREFILL
    graph_bs = _int(flags, "--cuda-graph-max-bs") or SGLANG_DEFAULT_CUDA_GRAPH_MAX_BS
    tp = _int(flags, "--tp-size", "--tp", "--tensor-parallel-size") or 1
    pp = _int(flags, "--pp-size", "--pp", "--pipeline-parallel-size") or 1
    return math.ceil(512 + 1.5 * max(chunked, 2048) + 2 * graph_bs + 1024 * tp * pp / 8)


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last of `names` in an argv (`--x=v` or `--x v`; `_` read as `-`, as vLLM does)."""
    flags = _flags(argv)
    for name in names:
        if name in flags:
            return flags[name]
    return None


# --- the two servers -----------------------------------------------------------------------------------------


def _size_vllm(
    name: str, who: str, inv: Invocation, flags: Mapping[str, str], slice_: Slice, cards: tuple[int, ...]
) -> Sizing:
    kv = flags.get("--kv-cache-memory-bytes", flags.get("--kv-cache-memory"))
    if kv is not None:
        warnings = []
        if inv.version is not None and inv.version < VLLM_KV_BYTES_SINCE:
            warnings.append(
                f"{who}: vLLM {_dotted(inv.version)} has no --kv-cache-memory-bytes (first in v0.10.1): it will "
                "refuse to start"
            )
        kv_mib = _mib(kv)
        smallest = min((slice_.on(c) for c in cards), default=None)
        if kv_mib is not None and smallest is not None and kv_mib >= smallest:
            warnings.append(
                f"{who}: --kv-cache-memory-bytes={kv} alone is {kv_mib} MiB, not less than the {smallest} MiB slice"
            )
        return Sizing(name, "user-set", inv.server, invocation=inv, warnings=tuple(warnings))
    return _size_fraction(name, who, inv, flags, slice_, cards, reserve=None)


def _size_sglang(
    name: str, who: str, inv: Invocation, flags: Mapping[str, str], slice_: Slice, cards: tuple[int, ...]
) -> Sizing:
    reserve = sglang_reserve_mib(inv.argv)
    return _size_fraction(name, who, inv, flags, slice_, cards, reserve=reserve)


def _size_fraction(
    name: str,
    who: str,
    inv: Invocation,
    flags: Mapping[str, str],
    slice_: Slice,
    cards: tuple[int, ...],
    *,
    reserve: int | None,
) -> Sizing:
    """The fraction that fits on every card; `reserve` None: vLLM's margin, else SGLang's fixed reserve."""
    flag = MEMORY_FLAG[inv.server]
    server = "vLLM" if inv.server is Server.VLLM else "SGLang"
    if not cards:
        return Sizing(
            name,
            "unsafe",
            inv.server,
            invocation=inv,
            warnings=(
                f"{who}: no GPU memory known (no node inventory yet) to size {server}'s {flag} for a "
                f"{slice_.memory_mib} MiB slice; it will size itself for the whole card",
            ),
        )
    kept = {c: slice_.on(c) - (vllm_margin_mib(slice_.on(c)) if reserve is None else reserve) for c in cards}
    best = min(kept[c] / slice_.seen_on(c) for c in cards)
    fraction = math.floor(best * 10**FRACTION_DIGITS) / 10**FRACTION_DIGITS
    user = _given(flags, flag)
    if user is not None:
        return Sizing(
            name,
            "user-set",
            inv.server,
            invocation=inv,
            warnings=_over(who, flag, user, slice_, cards, reserve, fraction),
        )
    if fraction <= 0:
        need = "" if reserve is None else f" (SGLang reserves {reserve} MiB for activations and CUDA graphs)"
        return Sizing(
            name,
            "unsafe",
            inv.server,
            invocation=inv,
            warnings=(
                f"{who}: a {min(slice_.on(c) for c in cards)} MiB slice is too small for {server}{need}: "
                f"{flag} not set; ask for more memory",
            ),
        )
    warnings: list[str] = []
    if slice_.seen == "card" and slice_.memory_mib is not None and len(set(cards)) > 1:  # a percentage: same share
        small = min(cards)
        warnings.append(
            f"{who}: {flag}={fraction} is sized for the largest card it may get ({max(cards)} MiB); on a "
            f"{small} MiB card {server} takes {math.floor(fraction * small)} of its {slice_.on(small)} MiB slice; "
            "pin the GPU model (vgpu.io/use-gpu-models) to size it exactly"
        )
    if reserve is not None and reserve * 2 > min(slice_.on(c) for c in cards):
        warnings.append(
            f"{who}: SGLang's reserve for activations and CUDA graphs ({reserve} MiB) is over half the slice; a "
            "smaller --chunked-prefill-size leaves more for weights and KV cache"
        )
    return Sizing(
        name,
        "sized",
        inv.server,
        flag=f"{flag}={fraction}",
        fraction=fraction,
        invocation=inv,
        warnings=tuple(warnings),
    )


def _over(
    who: str, flag: str, user: str, slice_: Slice, cards: tuple[int, ...], reserve: int | None, safe: float
) -> tuple[str, ...]:
    """A warning when the user's own fraction lets the server out of its slice on some card (kept as set)."""
    try:
        value = float(user)
    except ValueError:
        return (f"{who}: {flag}={user!r} is not a number; the webhook cannot check it against the slice",)
    for card in sorted(cards, reverse=True):
        takes = math.ceil(value * slice_.seen_on(card)) + (reserve or 0)
        if takes > slice_.on(card):
            extra = "" if reserve is None else f" (with SGLang's {reserve} MiB reserve for activations)"
            return (
                f"{who}: {flag}={user} (kept as set) lets the server take {takes} MiB of a {card} MiB card{extra}, "
                f"more than its {slice_.on(card)} MiB slice; at most {max(safe, 0.0)} keeps it inside",
            )
    return ()


def _whole_card(slice_: Slice) -> bool:
    if slice_.percentage is not None:
        return slice_.percentage >= 100
    assert slice_.memory_mib is not None
    return bool(slice_.cards_mib) and all(slice_.memory_mib >= c for c in slice_.cards_mib)


# --- parsing ----------------------------------------------------------------------------------------------------


def _in_shell(command: list[str], args: list[str], image: str) -> Invocation | None:
    """`sh -c '<script>'`: the script is the entry after the option cluster holding `c`."""
    argv = command + args
    for i in range(1, len(argv) - 1):
        if argv[i].startswith("-") and not argv[i].startswith("--") and "c" in argv[i]:
            script = argv[i + 1]
            field: Literal["command", "args"] = "command" if i + 1 < len(command) else "args"
            position = i + 1 if field == "command" else i + 1 - len(command)
            for pattern, server in ((_VLLM_IN_SCRIPT, Server.VLLM), (_SGLANG_IN_SCRIPT, Server.SGLANG)):
                matches = list(pattern.finditer(script))
                if len(matches) == 1:
                    end = matches[0].end()
                    rest = script[end:].split("&&")[0].split(";")[0].split("|")[0].split("\n")[0]
                    return Invocation(
                        server,
                        tuple(_words(rest)),
                        _version(image, server),
                        field=field,
                        position=position,
                        script=script,
                        insert_at=end,
                    )
            return None
    return None


def with_flag(inv: Invocation, flag: str) -> str:
    """The shell script with `flag` right after the server's invocation words (both parsers accept it there)."""
    return inv.script[: inv.insert_at] + " " + flag + inv.script[inv.insert_at :]


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # unbalanced quotes: plain words are enough to find flags
        return text.split()


def _flags(argv: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        key, eq, value = token.partition("=")
        key = key.replace("_", "-")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            value = "" if nxt.startswith("--") else nxt
        out[key] = value
    return out


def _given(flags: Mapping[str, str], flag: str) -> str | None:
    """The user's value of `flag`, also under an abbreviation argparse would accept (`--gpu-memory=0.5`)."""
    if flag in flags:
        return flags[flag]
    return next((v for k, v in flags.items() if len(k) >= 8 and flag.startswith(k)), None)


def _int(flags: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        try:
            return int(flags[name])
        except (KeyError, ValueError):
            continue
    return None


def _mib(value: str) -> int | None:
    """A byte count as MiB; vLLM also takes suffixed sizes (`4G`), which are left unchecked here."""
    return int(value) >> 20 if value.strip().isdigit() else None


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _basename(token: str) -> str:
    return token.rsplit("/", 1)[-1]


def _is_vllm_image(image: str) -> bool:
    repo = image.split("@", 1)[0].rsplit(":", 1)[0] if "/" in image or ":" in image else image
    return repo.rsplit("/", 1)[-1] in ("vllm-openai", "vllm")


def _version(image: str, server: Server) -> tuple[int, ...] | None:
    """The server's version from its own image's tag (vllm/vllm-openai:v0.11.0); other images say nothing."""
    if server is Server.VLLM and not _is_vllm_image(image):
        return None
    if server is Server.SGLANG and "sglang" not in image.rsplit("/", 1)[-1]:
        return None
    m = _VERSION.search(image.rsplit("/", 1)[-1])
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def _dotted(version: tuple[int, ...]) -> str:
    return "v" + ".".join(map(str, version))
