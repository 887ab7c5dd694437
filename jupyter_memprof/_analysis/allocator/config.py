"""The allocator settings the model follows, parsed once.

They are ``PYTORCH_CUDA_ALLOC_CONF``
(and ``PYTORCH_ALLOC_CONF``) read as torch's config parser reads them, into one
:class:`AllocatorConfig`; a bad setting is one :class:`AllocatorConfigError` line. The
sizes of c10's allocator (its ``k*`` constants) are declared here once."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..._errors import AllocatorConfigError
from ..._units import shown

__all__ = ["AllocatorConfig", "config_from_env", "parse_config"]

KIB = 1024
MIB = 1024 * KIB
MIN_BLOCK = 512  # kMinBlockSize: every block is a multiple of this
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: a small pool segment (and expandable page)
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: requests from here get their own segment
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: a large segment for smaller requests (and page)
ROUND_LARGE = 2 * MIB  # kRoundLarge: own segments are rounded up to this
POW2_INTERVALS = 16  # roundup_power2_divisions: one entry per power of two from 1 MiB
#: the settings the model does not need (they change neither sizes nor placement)
_IGNORED = {
    "release_lock_on_cudamalloc": "bool",
    "pinned_use_cuda_host_register": "bool",
    "pinned_use_background_threads": "bool",
    "pinned_num_register_threads": "int",
    "graph_capture_record_stream_reuse": "bool",
    "garbage_collection_threshold": "fraction",
}
_KNOWN = (
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "expandable_segments",
    "backend",
    *_IGNORED,
)


# -- the settings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocatorConfig:
    """The allocator settings the model follows (defaults: torch's)."""

    #: blocks this large or larger are never split (None: no limit, torch's default)
    max_split_size: int | None = None
    #: how much larger than a request an unsplittable block may be and still serve it
    max_non_split_rounding: int = LARGE_BUFFER
    #: divisions per power of two, for sizes from 1 MiB up (index: log2(size) - 20)
    roundup_power2_divisions: tuple[int, ...] = (0,) * POW2_INTERVALS
    expandable_segments: bool = False
    #: the setting it was read from ("" for the defaults)
    setting: str = ""

    def divisions(self, size: int) -> int:
        """The divisions that apply to a request of ``size`` bytes."""
        index = max(size.bit_length() - 1 - 20, 0)
        return self.roundup_power2_divisions[min(index, POW2_INTERVALS - 1)]

    def round_size(self, size: int) -> int:
        """The size the allocator makes a request of ``size`` bytes (``round_size``)."""
        if size < MIN_BLOCK:
            return MIN_BLOCK
        divisions = self.divisions(size)
        if divisions > 1 and size > MIN_BLOCK * divisions:
            return _next_division(size, divisions)
        return -(-size // MIN_BLOCK) * MIN_BLOCK

    def with_expandable(self, on: bool = True) -> AllocatorConfig:
        """These settings with ``expandable_segments`` set to ``on``."""
        text = ",".join(
            p for p in self.setting.split(",") if p and not p.strip().startswith("expandable")
        )
        text = ",".join(x for x in (text, f"expandable_segments:{on}") if x)
        return replace(self, expandable_segments=on, setting=text)


def _next_division(size: int, divisions: int) -> int:
    """``size`` rounded up to the next of ``divisions`` equal steps between the powers of
    two around it (a power of two stays itself)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    down = size & ~(step - 1)
    return size if down == size else down + step


def _lex(text: str) -> list[str]:
    """The setting's tokens: names and numbers, and each of ``, : [ ]`` (spaces dropped)."""
    tokens: list[str] = []
    word = ""
    for ch in text:
        if ch in ",:[]":
            if word:
                tokens.append(word)
                word = ""
            tokens.append(ch)
        elif ch != " ":
            word += ch
    if word:
        tokens.append(word)
    return tokens


class _Parser:
    """Reads one ``PYTORCH_CUDA_ALLOC_CONF`` text as torch's config parser does."""

    def __init__(self, text: str):
        self.text = text
        self.tokens = _lex(text)
        self.i = 0
        self.values: dict = {}

    def fail(self, message: str):
        raise AllocatorConfigError(f"allocator setting {shown(self.text, 100)}: {message}")

    def take(self, what: str = "a value") -> str:
        if self.i >= len(self.tokens):
            self.fail(f"expected {what} at the end")
        token = self.tokens[self.i]
        self.i += 1
        return token

    def expect(self, ch: str) -> None:
        token = self.take(repr(ch))
        if token != ch:
            self.fail(f"expected {ch!r}, found {shown(token)}")

    def integer(self, key: str) -> int:
        return self.whole(key, self.take(f"a number for {key}"), "a whole number")

    def whole(self, key: str, token: str, what: str) -> int:
        """``token`` as torch's ``stoul`` reads it: ASCII digits (not every digit
        ``str.isdigit`` accepts), below 2**64."""
        if not (token.isascii() and token.isdigit()):
            self.fail(f"{key} takes {what}, not {shown(token)}")
        if len(token) > 20 or int(token) >= 2**64:
            self.fail(f"{key}: {shown(token)} is out of range (at most 2**64 - 1)")
        return int(token)

    def boolean(self, key: str) -> bool:
        token = self.take(f"True or False for {key}")
        if token not in ("True", "False", "true", "false"):
            self.fail(f"{key} takes True or False, not {shown(token)}")
        return token in ("True", "true")

    def megabytes(self, key: str) -> int:
        n = self.integer(key)
        if n < LARGE_BUFFER // MIB:
            self.fail(f"{key} must be at least {LARGE_BUFFER // MIB} (MB), not {n}")
        return n * MIB

    def fraction(self, key: str) -> float:
        token = self.take(f"a number for {key}")
        try:
            x = float(token) if token.isascii() and len(token) <= 40 else math.nan
        except ValueError:
            x = math.nan
        if not 0.0 < x < 1.0:
            self.fail(f"{key} must be between 0 and 1 (exclusive), not {shown(token)}")
        return x

    def power_of_two(self, key: str, token: str, zero_ok: bool) -> int:
        n = self.whole(key, token, "whole numbers")
        if not ((n == 0 and zero_ok) or (n > 0 and n & (n - 1) == 0)):
            self.fail(f"{key}: {n} is not a power of 2")
        return n

    def divisions(self) -> tuple[int, ...]:
        key = "roundup_power2_divisions"
        table = [0] * POW2_INTERVALS
        if self.i < len(self.tokens) and self.tokens[self.i] == "[":
            self.i += 1
            first, last = True, 0
            while True:
                token = self.take("']'")
                if token == "]":
                    break
                self.expect(":")
                value = self.power_of_two(key, self.take(f"divisions for {token}"), True)
                if token == ">":
                    table[last + 1 :] = [value] * (POW2_INTERVALS - last - 1)
                else:
                    bound = self.power_of_two(key, token, False)
                    index = min(bound.bit_length() - 1, POW2_INTERVALS - 1)
                    if first:
                        table[:index] = [value] * index
                        first = False
                    table[index] = value
                    last = index
                if self.i < len(self.tokens) and self.tokens[self.i] == ",":
                    self.i += 1
            return tuple(table)
        value = self.power_of_two(key, self.take(f"a number for {key}"), False)
        return (value,) * POW2_INTERVALS

    def setting(self) -> None:
        key = self.take("a setting")
        if key not in _KNOWN:
            self.fail(f"unknown setting {shown(key)} (known: {', '.join(_KNOWN)})")
        if key in self.values:
            self.fail(f"{key} is given twice")
        self.expect(":")
        if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            self.values[key] = self.megabytes(key)
        elif key == "roundup_power2_divisions":
            self.values[key] = self.divisions()
        elif key == "expandable_segments":
            self.values[key] = self.boolean(key)
        elif key == "backend":
            backend = self.take("a backend")
            if backend == "cudaMallocAsync":
                self.fail("backend:cudaMallocAsync is CUDA's own allocator, which is not modelled")
            if backend != "native":
                self.fail(f"backend is native or cudaMallocAsync, not {shown(backend)}")
        else:
            {"bool": self.boolean, "int": self.integer, "fraction": self.fraction}[_IGNORED[key]](
                key
            )
            self.values[key] = True

    def parse(self) -> AllocatorConfig:
        while self.i < len(self.tokens):
            self.setting()
            if self.i < len(self.tokens):
                self.expect(",")
        v = self.values
        return AllocatorConfig(
            max_split_size=v.get("max_split_size_mb"),
            max_non_split_rounding=v.get("max_non_split_rounding_mb", LARGE_BUFFER),
            roundup_power2_divisions=v.get("roundup_power2_divisions", (0,) * POW2_INTERVALS),
            expandable_segments=v.get("expandable_segments", False),
            setting=self.text.strip(),
        )


def parse_config(setting: str | AllocatorConfig | None) -> AllocatorConfig:
    """The settings of a ``PYTORCH_CUDA_ALLOC_CONF`` text (``None`` or ``""``: torch's
    defaults), e.g. ``"expandable_segments:True,max_split_size_mb:128"``.

    Raises :class:`AllocatorConfigError` with one line for a setting torch would refuse
    (an unknown name, a value out of range, a malformed list) and for
    ``backend:cudaMallocAsync``, which the model does not cover.
    """
    if isinstance(setting, AllocatorConfig):
        return setting
    if setting is None:
        return AllocatorConfig()
    if not isinstance(setting, str):
        raise AllocatorConfigError(
            f"allocator setting must be text such as 'expandable_segments:True', not "
            f"{type(setting).__name__}"
        )
    return _Parser(setting).parse()


def config_from_env(environ: Mapping[str, str]) -> AllocatorConfig:
    """The settings torch reads from ``environ``: ``PYTORCH_ALLOC_CONF``, else
    ``PYTORCH_CUDA_ALLOC_CONF``."""
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        if name in environ:
            try:
                return parse_config(environ[name])
            except AllocatorConfigError as exc:
                raise AllocatorConfigError(f"{name}: {exc}") from None
    return AllocatorConfig()
