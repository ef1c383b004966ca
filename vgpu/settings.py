"""Layered settings for the services: flags > environment > YAML file > defaults, all from one pydantic model.

Each service describes its settings once, as a pydantic model whose fields carry the default and a
`description`. `Schema` derives everything else from that model: the `--flag` names and the generated
`--help` (description, default, env variable, file key), the `PREFIX_FIELD` environment variables, the file
keys, the merge in precedence order, and errors that name the setting, the bad value, what is allowed and
where the value came from (flag, env or file). So a setting cannot be accepted on one surface and forgotten
on another, and there is one precedence rule for all three services.

Pure: the caller hands in argv, the environment mapping and a `read_text` function for the file; nothing
here touches the process environment or the file system.

Naming, for a field path such as ("resources", "count") and env prefix "VGPU_EXTENDER_":
  flag `--resources-count`, env `VGPU_EXTENDER_RESOURCES__COUNT`, file key `resources.count` (a nested
  mapping), unless the schema maps it to another file key (the webhook groups its file into sections).
"""

from __future__ import annotations

import argparse
import re
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

# A problem found after type validation: (dotted field path, or "" for the whole model; message).
Problem = tuple[str, str]
# One source's values: field path -> (raw value, where it came from, e.g. "flag --port").
Layer = dict[tuple[str, ...], tuple[object, str]]

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}

# Variables the kubelet injects for every Service in the pod's namespace (enableServiceLinks, on by default):
# <SVC>_SERVICE_HOST, <SVC>_SERVICE_PORT[_<PORTNAME>], <SVC>_PORT=<proto>://<ip>:<port> and
# <SVC>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR] (kubernetes/kubernetes pkg/kubelet/envvars/envvars.go,
# FromServices and makeLinkVariables). Our Services are named vgpu-extender and vgpu-webhook, so their
# links share our env prefixes; they are not settings and must neither fail nor override the loader.
_SERVICE_LINK = re.compile(r"^(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$")
_SERVICE_LINK_URL = re.compile(r"^(tcp|udp|sctp)://")


_METAVARS: dict[Any, str] = {int: "INT", float: "NUM", Path: "PATH", str: "TEXT"}


class SettingsError(ValueError):
    """Invalid settings; the message lists every problem with the setting, its value and where it came from."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One leaf field of a settings model and its names on every surface."""

    path: tuple[str, ...]
    flag: str
    env: str
    file_key: str
    kind: Any  # the field's type without Optional: bool, int, float, str, Path or a Literal
    default: object
    description: str

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def dest(self) -> str:
        return "__".join(self.path)

    @property
    def choices(self) -> tuple[str, ...] | None:
        return tuple(str(c) for c in get_args(self.kind)) if get_origin(self.kind) is Literal else None


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def parse_bool(text: str) -> bool:
    """true/false, 1/0, yes/no, on/off (any case) — the same words on every surface."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


@dataclass(frozen=True)
class Schema(Generic[M]):
    """How one service's model appears as flags, env variables and file keys (see the module docstring)."""

    model: type[M]
    prog: str
    description: str
    env_prefix: str
    # Dotted field path -> file key, where the file groups settings differently from the model.
    file_keys: Mapping[str, str] = field(default_factory=dict)
    # Extra environment names for a field, below the prefixed one (e.g. NODE_NAME from the downward API).
    env_aliases: Mapping[str, str] = field(default_factory=dict)
    # Model fields that are not settings (e.g. "version", which only the file carries).
    hidden: frozenset[str] = frozenset({"version"})
    version: str = "v1"
    # A file must say `version: <version>` (the webhook and device plugin); otherwise it may omit it.
    require_version: bool = True
    epilog: str = ""

    # -- the settings -------------------------------------------------------------------------------------

    def settings(self) -> tuple[Setting, ...]:
        return tuple(self._walk(self.model, ()))

    def _walk(self, model: type[BaseModel], prefix: tuple[str, ...]) -> Iterable[Setting]:
        for name, info in model.model_fields.items():
            if not prefix and name in self.hidden:
                continue
            path = (*prefix, name)
            kind = _unwrap_optional(info.annotation)
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from self._walk(kind, path)
                continue
            dotted = ".".join(path)
            yield Setting(
                path=path,
                flag="--" + "-".join(path).replace("_", "-"),
                env=self.env_prefix + "__".join(p.upper() for p in path),
                file_key=self.file_keys.get(dotted, dotted),
                kind=kind,
                default=info.get_default(call_default_factory=True),
                description=info.description or "",
            )

    @property
    def config_env(self) -> str:
        return self.env_prefix + "CONFIG"

    # -- flags and --help ---------------------------------------------------------------------------------

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """--config plus one flag per setting; a flag that is not given is None and never overrides."""
        parser.add_argument(
            "--config",
            metavar="FILE",
            default=None,
            help=f"YAML settings file (version: {self.version}); env {self.config_env}",
        )
        for s in self.settings():
            help_text = f"{s.description} (default: {_show(s.default)}; env {s.env}; file {s.file_key})"
            kwargs: dict[str, Any] = {"dest": s.dest, "default": None, "help": help_text.replace("%", "%%")}
            if s.kind is bool:
                # `--persist` alone means true; `--persist=false` / `--mps false` spell the value out.
                kwargs.update(nargs="?", const=True, type=parse_bool, metavar="BOOL")
            elif s.choices is not None:
                kwargs.update(choices=s.choices, metavar="{" + ",".join(s.choices) + "}")
            elif s.kind in _METAVARS:
                kwargs.update(type=s.kind, metavar=_METAVARS[s.kind])
            else:
                kwargs.update(metavar="TEXT")
            parser.add_argument(s.flag, **kwargs)

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog=self.prog,
            description=self.description,
            epilog=self.epilog
            or (
                f"Every option is also an environment variable ({self.env_prefix}<OPTION>) and a key of the --config "
                f"file. Precedence: flags > environment > file > defaults."
            ),
        )
        self.add_arguments(parser)
        return parser

    def from_flags(self, args: argparse.Namespace | Mapping[str, object]) -> Layer:
        values = vars(args) if isinstance(args, argparse.Namespace) else args
        out: Layer = {}
        for s in self.settings():
            value = values.get(s.dest)
            if value is not None:
                out[s.path] = (value, f"flag {s.flag}")
        if not isinstance(args, argparse.Namespace):  # a hand-made mapping (tests, chart checks): no typos
            extra = sorted(k for k in set(values) - {s.dest for s in self.settings()} if values[k] is not None)
            if extra:
                raise SettingsError(f"unknown settings {', '.join(extra)}; known: {self._known()}")
        return out

    # -- environment --------------------------------------------------------------------------------------

    def from_env(self, environ: Mapping[str, str]) -> Layer:
        by_env = {s.env: s for s in self.settings()}
        by_path = {s.name: s for s in self.settings()}
        out: Layer = {}
        for alias, dotted in self.env_aliases.items():
            if alias in environ:
                out[by_path[dotted].path] = (environ[alias], f"env {alias}")
        unknown: list[str] = []
        for name, value in sorted(environ.items()):
            if not name.startswith(self.env_prefix) or name == self.config_env:
                continue
            rest = name[len(self.env_prefix) :]
            if _SERVICE_LINK.match(rest) or (rest == "PORT" and _SERVICE_LINK_URL.match(value)):
                continue
            s = by_env.get(name)
            if s is None:
                unknown.append(name)
            else:
                out[s.path] = (value, f"env {name}")
        if unknown:
            known = ", ".join(sorted(by_env))
            raise SettingsError(f"unknown environment variables {', '.join(unknown)}; known: {known}")
        return out

    # -- file ---------------------------------------------------------------------------------------------

    def from_yaml(self, text: str, source: str) -> Layer:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SettingsError(f"config file {source}: {exc}") from None
        return self.from_document({} if doc is None else doc, source)

    def from_document(self, doc: object, source: str) -> Layer:
        """Values from a parsed file; unknown keys are errors, so a typo never falls back to a default."""
        if not isinstance(doc, Mapping):
            raise SettingsError(f"config file {source}: expected a mapping at the top level")
        version = doc.get("version")
        if (version is not None or self.require_version) and version != self.version:
            raise SettingsError(f"config file {source}: 'version' must be {self.version!r}, got {version!r}")
        by_key = {s.file_key: s for s in self.settings()}
        groups = {".".join(parts[:i]) for parts in (k.split(".") for k in by_key) for i in range(1, len(parts))}
        out: Layer = {}
        errors: list[str] = []

        def visit(node: Mapping[Any, Any], prefix: str) -> None:
            for key, value in node.items():
                dotted = f"{prefix}{key}"
                if dotted == "version":
                    continue
                s = by_key.get(dotted)
                if s is not None:
                    out[s.path] = (value, f"file {source}: {dotted}")
                elif dotted in groups and isinstance(value, Mapping):
                    visit(value, dotted + ".")
                elif dotted in groups:
                    errors.append(f"{dotted} must be a mapping, got {value!r}")
                else:
                    known = sorted({k[len(prefix) :].split(".")[0] for k in by_key if k.startswith(prefix)})
                    errors.append(f"unknown key {dotted} (known: {', '.join(known)})")

        visit(doc, "")
        if errors:
            raise SettingsError(f"config file {source}:\n  " + "\n  ".join(errors))
        return out

    # -- merge and validate -------------------------------------------------------------------------------

    def build(self, *layers: Layer, check: Callable[[M], Iterable[Problem]] | None = None) -> M:
        """Merge layers (later wins), validate with the model, then `check`; errors name each value's source."""
        merged: Layer = {}
        for layer in layers:
            merged.update(layer)
        nested: dict[str, Any] = {}
        for path, (value, _origin) in merged.items():
            node = nested
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
        try:
            result = self.model.model_validate(nested)
        except ValidationError as exc:
            raise SettingsError(self._report(exc, merged)) from None
        problems = list(check(result)) if check is not None else []
        if problems:
            lines = []
            for name, message in problems:
                origin = merged.get(tuple(name.split("."))) if name else None
                lines.append(f"{message} ({origin[1]})" if origin else message)
            raise SettingsError(f"invalid {self.prog} settings:\n  " + "\n  ".join(lines))
        return result

    def _report(self, exc: ValidationError, merged: Layer) -> str:
        by_path = {s.path: s for s in self.settings()}
        lines = []
        for err in exc.errors():
            loc = tuple(str(p) for p in err["loc"])
            message = str(err["msg"]).removeprefix("Value error, ")
            if not loc:
                lines.append(message)
                continue
            s = by_path.get(loc)
            origin = merged.get(loc)
            where = f" from {origin[1]}" if origin else ""
            allowed = f"; allowed: {', '.join(s.choices)}" if s is not None and s.choices else ""
            lines.append(f"{'.'.join(loc)} = {err.get('input')!r}{where}: {message}{allowed}")
        return f"invalid {self.prog} settings:\n  " + "\n  ".join(lines)

    def _known(self) -> str:
        return ", ".join(s.name for s in self.settings())

    # -- the whole load -----------------------------------------------------------------------------------

    def load_args(
        self,
        args: argparse.Namespace,
        environ: Mapping[str, str],
        read_text: Callable[[str], str],
        *,
        check: Callable[[M], Iterable[Problem]] | None = None,
    ) -> M:
        """defaults < file (--config or <PREFIX>CONFIG) < env < flags, from an already parsed command line."""
        layers: list[Layer] = []
        path = getattr(args, "config", None) or environ.get(self.config_env)
        if path:
            try:
                text = read_text(str(path))
            except OSError as exc:
                raise SettingsError(f"config file {path}: {exc}") from None
            layers.append(self.from_yaml(text, str(path)))
        layers.append(self.from_env(environ))
        layers.append(self.from_flags(args))
        return self.build(*layers, check=check)

    def load(
        self,
        argv: Sequence[str],
        environ: Mapping[str, str],
        read_text: Callable[[str], str],
        *,
        check: Callable[[M], Iterable[Problem]] | None = None,
    ) -> M:
        return self.load_args(self.parser().parse_args(list(argv)), environ, read_text, check=check)

    # -- documentation ------------------------------------------------------------------------------------

    def markdown_table(self) -> str:
        """Every setting with its flag, env variable, file key, default and description (for the docs)."""
        rows = ["| flag | env | file key | default | description |", "|---|---|---|---|---|"]
        for s in self.settings():
            desc = s.description + (f" (one of: {', '.join(s.choices)})" if s.choices else "")
            desc = desc.replace("|", "\\|")
            rows.append(f"| `{s.flag}` | `{s.env}` | `{s.file_key}` | `{_show(s.default)}` | {desc} |")
        return "\n".join(rows)


def _show(value: object) -> str:
    if value is None or value == "":
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
