"""Configuration: a YAML file validated against a typed schema at start-up.

The schema is made of sections, each a dataclass (a `Section`) whose fields carry their default
and documentation (`setting`) and whose annotations give their types: the top-level keys
(`TopLevel`), the core sections below (paths, web, node) and one section per collector, which the
collector class declares (`Collector.config_section`). This module owns the schema's registry
and imports no collector: exporter.collectors adds each collector's section (`add_section`) when
the composition root discovers the collectors (exporter.cli; exporter.tools.docs; the test suite's
conftest), before any config is loaded.

Every error in a file is reported at once, in one ConfigError that names the file and, for each
error, the key path, what was expected and the value (cut to about 60 characters; values are
type-checked before anything formats them). docs/configuration.md is generated from the schema
(exporter.tools.docs).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from exporter import reload_snapshot
from exporter.regular_file import NotRegularFile, read_regular


class ConfigError(Exception):
    """A bad configuration: names the file and, for each error, the key and what was expected."""

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or [message]

    @classmethod
    def of(cls, errors: list[str]) -> ConfigError:
        if len(errors) == 1:
            return cls(errors[0], errors)
        return cls(f"{len(errors)} configuration errors:\n  " + "\n  ".join(errors), errors)


@dataclass(frozen=True)
class Key:
    type: type | tuple[type, ...]
    default: Any
    doc: str
    # Returns None when the value is acceptable, else a description of what was expected.
    check: Callable[[Any], str | None] | None = None
    nullable: bool = False
    expected: str = ""  # how to describe the type in errors and docs; derived when empty
    path: bool = False  # a file or directory: relative in a config file = relative to that file

    def describe(self) -> str:
        if self.expected:
            return self.expected
        types_ = self.type if isinstance(self.type, tuple) else (self.type,)
        if set(types_) == {int, float}:
            types_ = (float,)
        names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
                 list: "a list", dict: "a mapping"}
        desc = " or ".join(names.get(t, t.__name__) for t in types_)
        return desc + (" or null" if self.nullable else "")


def positive(v: Any) -> str | None:
    return None if v > 0 else "a number greater than 0"


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else "a number of 0 or more"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else "one of " + ", ".join(choices)

    return check


def host_port(v: Any) -> str | None:
    host, sep, port = str(v).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port, logged
        return "HOST:PORT with a port from 0 to 65535 (for example 0.0.0.0:9858)"
    return None


def setting(default: Any, doc: str, *, check: Callable[[Any], str | None] | None = None,
            expected: str = "", path: bool = False) -> Any:
    """A field of a Section: its default, its documentation and an optional check of its value
    (returns None when fine, else what was expected). The type is the field's annotation.
    `path`: the value names a file or directory (see resolve_paths)."""
    meta = {"doc": doc, "check": check, "expected": expected, "path": path}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


S = TypeVar("S", bound="Section")


@dataclass
class Section:
    """A typed config section. Subclasses are dataclasses with `setting` fields; `name` is the
    section's key in the file, the class docstring its documentation. `checks` look at several
    keys together (one bounded by another) and return the problem, naming the keys, or None."""

    name: ClassVar[str] = ""
    checks: ClassVar[tuple[Callable[[Any], str | None], ...]] = ()

    @classmethod
    def doc(cls) -> str:
        return " ".join((cls.__doc__ or "").split())

    @classmethod
    def keys(cls) -> dict[str, Key]:
        cached = cls.__dict__.get("_keys")
        if cached is None:
            cached = _keys_of(cls)
            cls._keys = cached  # type: ignore[attr-defined]
        return cached


def _keys_of(cls: type) -> dict[str, Key]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        types_, nullable = _types_of(hints[f.name])
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = Key(types_ if len(types_) > 1 else types_[0], default, f.metadata.get("doc", ""),
                          check=f.metadata.get("check"), nullable=nullable,
                          expected=f.metadata.get("expected", ""), path=f.metadata.get("path", False))
    return out


def _types_of(hint: Any) -> tuple[tuple[type, ...], bool]:
    """(accepted YAML types, nullable) of an annotation: float takes ints too; list[...] and
    dict[...] are checked as lists and mappings (their items by the key's check)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    out: list[type] = []
    nullable = False
    for a in args:
        if a is type(None):
            nullable = True
            continue
        a = typing.get_origin(a) or a
        for t in ((int, float) if a is float else (a,)):
            if t not in out:
                out.append(t)
    return tuple(out), nullable


DEFAULT_PORT = 9858


@dataclass
class TopLevel(Section):
    """Top-level keys."""

    listen: str = setting(f"0.0.0.0:{DEFAULT_PORT}", "Address and port of the HTTP endpoint "
                          "(--web.listen-address, --listen); port 0 takes any free port, and the "
                          "`serving http://...` log line gives the one taken.", check=host_port)
    log_level: str = setting("info", "Log level (--log.level): debug, info, warn (or warning), error.",
                             check=one_of("debug", "info", "warn", "warning", "error"))
    log_format: str = setting("logfmt", "Log line format (--log.format): logfmt (`ts=... level=info ...`, "
                              "values quoted where needed) or json (one JSON object per line).",
                              check=one_of("logfmt", "json"))
    collector_timeout_seconds: float = setting(
        5.0, "Deadline for each collector in one collection; a collector past it reports failure "
        "for that scrape while the others are served. Keep it under Prometheus' scrape timeout.",
        check=positive)
    shutdown_timeout_seconds: float = setting(
        5.0, "After SIGTERM (or a SIGHUP reload) the process exits within this many seconds, the XID state "
        "file flushed first, whatever a source is doing (a read blocked in NVML or the kernel is "
        "abandoned).", check=positive)


@dataclass
class Paths(Section):
    """Where each file source is read from (node_exporter's --path.* style). A relative path in the
    config file (here, `web.config_file`, `lustre.rootfs`) is relative to the config file's directory;
    on the command line, to the working directory."""

    name: ClassVar[str] = "paths"
    sysfs: str = setting("/sys", "Root of sysfs.", path=True)
    procfs: str = setting("/proc", "Root of procfs.", path=True)
    debugfs: str = setting("/sys/kernel/debug", "Root of debugfs.", path=True)
    kmsg: str = setting("/dev/kmsg", "Kernel log device (or a file of /dev/kmsg records).", path=True)
    state_dir: str = setting("/var/lib/gpu-health-exporter", "Directory for the exporter's state file.",
                             path=True)


def telemetry_path(v: Any) -> str | None:
    if not v.startswith("/") or any(c in v for c in "?# ") or v in ("/", "/healthz", "/readyz"):
        return "a URL path starting with / (no query, no spaces; not /, /healthz or /readyz)"
    return None


@dataclass
class Web(Section):
    """The HTTP endpoint: TLS and basic auth from a web config file, and the server's limits
    (see 'The web config file' below and docs/design.md)."""

    name: ClassVar[str] = "web"
    config_file: str | None = setting(None, "Web config file in the Prometheus exporter-toolkit format (TLS, "
                                      "basic auth); --web.config.file overrides. Unset: plain HTTP, no auth.",
                                      path=True)
    telemetry_path: str = setting("/metrics", "Path the metrics are served under (--web.telemetry-path).",
                                  check=telemetry_path)
    max_connections: int = setting(
        512, "Connections held at once (idle, slow or busy). At the limit a new connection "
        "replaces the longest-idle one; lowered to fit the open-file limit.", check=positive)
    read_header_timeout_seconds: float = setting(10.0, "Time a new connection has for its TLS "
                                                 "handshake and first request head.", check=positive)
    idle_timeout_seconds: float = setting(60.0, "Time a kept-alive connection may wait for its next "
                                          "request.", check=positive)
    write_timeout_seconds: float = setting(10.0, "Time a client has to take a response.", check=positive)
    workers: int = setting(4, "Threads serving requests; more requests wait for one without a thread of "
                           "their own (concurrent scrapes share one collection).", check=positive)


@dataclass
class Node(Section):
    """What the node is and what it should have."""

    name: ClassVar[str] = "node"
    instance_type: str | None = setting(None, "EC2 instance type; when unset, the DMI product name (sysfs "
                                        "devices/virtual/dmi/id/product_name), else instance metadata.")
    expected_gpus: int | None = setting(None, "GPUs the node should have; from the instance type when unset.",
                                        check=non_negative)


CORE_SECTIONS: tuple[type[Section], ...] = (Paths, Web, Node)
TOP: dict[str, Key] = TopLevel.keys()

# The collectors' sections, added when exporter.collectors registers them.
_ADDED: dict[str, type[Section]] = {}
def add_section(cls: type[Section]) -> None:
    """Add a collector's section to the schema (exporter.collectors.register)."""
    old = _ADDED.get(cls.name) or {c.name: c for c in CORE_SECTIONS}.get(cls.name)
    if old is not None and old is not cls:
        raise ValueError(f"config section {cls.name!r} declared twice ({old.__name__}, {cls.__name__})")
    _ADDED[cls.name] = cls


def remove_section(name: str) -> None:
    """Drop a section added with add_section (a collector unregistered)."""
    _ADDED.pop(name, None)


def sections() -> dict[str, type[Section]]:
    """Every section of the schema by name: the core ones and every registered collector's."""
    out: dict[str, type[Section]] = {c.name: c for c in CORE_SECTIONS}
    for name, cls in _ADDED.items():
        if name in out and out[name] is not cls:
            raise ValueError(f"config section {name!r} declared twice ({out[name].__name__}, {cls.__name__})")
        out[name] = cls
    return out


@dataclass
class CollectorSection(Section):
    """A collector's section (`Collector.config_section`): every collector can be turned off, and
    one may have a deadline of its own. Each subclass re-declares `enabled` with its own default
    and documentation."""

    enabled: bool = setting(True, "Run the collector.")

    def deadline_seconds(self) -> float | None:
        """This collector's deadline in a collection; None: the top-level
        `collector_timeout_seconds` (exporter.runner)."""
        return None


class Config:
    """The validated configuration. Top-level keys and the core sections are typed attributes;
    a collector's section is read only through its class: `cfg.section(GpuSection)`, or
    `cfg.find(GpuSection)` where the collector may not be registered."""

    listen: str
    log_level: str
    log_format: str
    collector_timeout_seconds: float
    shutdown_timeout_seconds: float
    paths: Paths
    web: Web
    node: Node
    source: str  # the file it came from, or "<defaults>"

    def __init__(self, top: TopLevel, parts: dict[str, Section], source: str) -> None:
        self.listen, self.log_level, self.log_format = top.listen, top.log_level, top.log_format
        self.collector_timeout_seconds = top.collector_timeout_seconds
        self.shutdown_timeout_seconds = top.shutdown_timeout_seconds
        self.paths, self.web, self.node = self._of(parts, Paths), self._of(parts, Web), self._of(parts, Node)
        self.sections = parts
        self.source = source

    @staticmethod
    def _of(parts: dict[str, Section], cls: type[S]) -> S:
        part = parts[cls.name]
        if not isinstance(part, cls):  # two classes declared one name: the registry refuses that
            raise TypeError(f"config section {cls.name!r} is a {type(part).__name__}, not a {cls.__name__}")
        return part

    def section(self, cls: type[S]) -> S:
        """The section `cls` declares (KeyError when its collector was not registered)."""
        return self._of(self.sections, cls)

    def find(self, cls: type[S]) -> S | None:
        """The section `cls` declares, or None when no registered collector declares it (a config
        loaded before the collectors were discovered)."""
        return self._of(self.sections, cls) if cls.name in self.sections else None

    def __repr__(self) -> str:
        return f"Config(source={self.source!r})"


def _check_value(key_name: str, key: Key, value: Any) -> str | None:
    """The problem with `value` for `key` (naming the key, what was expected and the value), or None."""
    if value is None:
        return None if key.nullable else f"key '{key_name}' is null; expected {key.describe()}"
    types_ = key.type if isinstance(key.type, tuple) else (key.type,)
    ok = isinstance(value, types_) and not (isinstance(value, bool) and bool not in types_)
    if not ok:  # checked before anything formats the value, and then only a bounded part of it
        return f"key '{key_name}' is {type(value).__name__} {show(value)}; expected {key.describe()}"
    if key.check:
        problem = key.check(value)
        if problem:
            return f"key '{key_name}' is {show(value)}; expected {problem}"
    return None


def validate(data: Any, source: str = "<defaults>", overrides: dict[str, Any] | None = None) -> Config:
    """Validate a parsed YAML document plus dotted-key overrides (from the CLI) into a Config;
    raises one ConfigError listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level is {type(data).__name__}; expected a mapping of keys")
    schema = sections()
    values: dict[str, dict[str, Any]] = {"": {}, **{name: {} for name in schema}}
    errors: list[str] = []
    bad: set[str] = set()  # sections with a bad key: their checks across keys are not run

    def put(where: str, section: str, k: Any, v: Any) -> None:
        keys = TOP if not section else schema[section].keys()
        name = k if isinstance(k, str) and len(k) <= SHOW_LIMIT else show(k)
        dotted = f"{section}.{name}" if section else name
        if k not in keys:
            known = ", ".join(f"{section}.{n}" for n in keys) if section else ", ".join([*keys, *schema])
            errors.append(f"{where}: unknown key '{dotted}'; expected one of {known}")
            bad.add(section)
            return
        problem = _check_value(dotted, keys[k], v)
        if problem:
            errors.append(f"{where}: {problem}")
            bad.add(section)
        else:
            values[section][k] = v

    for k, v in data.items():
        if k in schema:
            if v is None:
                continue
            if not isinstance(v, dict):
                errors.append(f"{source}: key '{k}' is {type(v).__name__} {show(v)}; expected a mapping")
                continue
            for sk, sv in v.items():
                put(source, k, sk, sv)
        else:
            put(source, "", k, v)
    for dotted, v in (overrides or {}).items():
        section, _, sk = dotted.partition(".")
        if sk and section in schema:
            put("command line", section, sk, v)
        else:
            put("command line", "", dotted, v)
    top = TopLevel(**values[""])
    parts: dict[str, Section] = {}
    for name, cls in schema.items():
        part = parts[name] = cls(**values[name])
        if name in bad:
            continue
        for check in cls.checks:
            problem = check(vars(part))
            if problem:
                errors.append(f"{source}: {problem}")
    if errors:
        raise ConfigError.of(errors)
    return Config(top, parts, source)


SHOW_LIMIT = 60  # characters of a value quoted in an error


def show(value: Any, limit: int = SHOW_LIMIT) -> str:
    """A value as an error quotes it: repr-like, cut to about `limit` characters without ever
    building the whole repr (a value can be a huge string, a huge int or a deep structure)."""
    out: list[str] = []
    room = [limit]

    def emit(text: str) -> None:
        out.append(text[:room[0]])
        if len(text) > room[0]:
            raise _Full
        room[0] -= len(text)

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            emit("{")
            for i, (k, x) in enumerate(v.items()):
                emit(", " if i else "")
                walk(k)
                emit(": ")
                walk(x)
            emit("}")
        elif isinstance(v, list):
            emit("[")
            for i, x in enumerate(v):
                emit(", " if i else "")
                walk(x)
            emit("]")
        elif isinstance(v, str):
            emit(repr(v[:limit + 1]))
        elif isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 4 * limit:
            emit(f"<an integer of {v.bit_length()} bits>")
        else:
            emit(repr(v))

    try:
        walk(value)
    except _Full:
        return "".join(out) + "..."
    return "".join(out)


class _Full(Exception):
    pass


MAX_FILE_BYTES = 1 << 20  # a config file is a few KiB; this bounds what a wrong path can cost
MAX_NODES = 100_000  # YAML nodes after alias expansion (an "alias bomb" of 1 KiB expands to 10^9)


def read_config_bytes(path: Path, what: str, origin: Path | None = None) -> bytes:
    """The bytes of a regular file of at most MAX_FILE_BYTES (exporter.regular_file); otherwise
    ConfigError, starting with `origin` (the file that names this one) when given, and naming
    `what` and the path."""
    where = f"{origin}: {what} {path}" if origin is not None else f"{path}: the {what}"
    try:
        # during a reload's start-up, the bytes it validated (exporter.reload_snapshot)
        data = reload_snapshot.read(path, lambda: read_regular(path, MAX_FILE_BYTES))
    except NotRegularFile as e:
        raise ConfigError(f"{where}: not a regular file ({e.kind})") from e
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read: {e.strerror or e}") from e
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: over {MAX_FILE_BYTES} bytes")
    return data


def read_config_file(p: Path) -> str:
    """The config file's text (read_config_bytes), UTF-8."""
    data = read_config_bytes(p, "config file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})") from e


def parse_yaml(text: str, name: str) -> Any:
    """The YAML document, or ConfigError naming the file, line and column."""
    loader = None
    try:
        loader = _Loader(text)  # the reader refuses characters YAML does not allow here
        loader.name = name  # marks name the file, not "<unicode string>"
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = "; ".join(str(x) for x in (e.context, e.problem) if x)
        raise ConfigError(f"{name}: not valid YAML: {at}{what}") from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        raise ConfigError(f"{name}: not valid YAML: line {line}, column {column}: character "
                          f"#x{e.character:04x} is not allowed ({e.reason})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{name}: not valid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{name}: not valid YAML: nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise ConfigError(f"{name}: not valid YAML: {show(str(e), 120)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load(path: str | Path | None, overrides: dict[str, Any] | None = None, text: str | None = None) -> Config:
    """Load and validate a config file (None: defaults only); `text`, when given, is the file's
    content as read before (a reload's validated snapshot)."""
    if path is None:
        return validate({}, overrides=overrides)
    p = Path(path)
    data = parse_yaml(read_config_file(p) if text is None else text, str(p))
    return validate(resolve_paths(data, Path(os.path.abspath(p)).parent), str(p), overrides)


def resolve_paths(data: Any, base: Path) -> Any:
    """The document with every relative path value (a `path` key's string) made absolute
    against `base`, the config file's directory: the file means the same whatever the working
    directory (systemd's is /). Command-line values stay relative to the working directory.
    Anything not a string is left for validate() to report."""
    if not isinstance(data, dict):
        return data
    schema = sections()
    out = dict(data)
    for name, part in data.items():
        if name not in schema or not isinstance(part, dict):
            continue
        keys = schema[name].keys()
        out[name] = {k: os.path.abspath(base / v) if isinstance(v, str) and v and k in keys and keys[k].path
                     and not os.path.isabs(v) else v
                     for k, v in part.items()}
    return out


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes in the document with every alias expanded; raises ValueError past `limit` or on a
    recursive alias. Each node is sized once (memo), so this costs the document's size."""
    sizes: dict[int, int | None] = {}

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node), 0)
        if known is None:
            raise ValueError("a recursive alias (a node that contains itself)")
        if known:
            return known
        sizes[id(node)] = None
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        total = 1
        for child in children:
            total += size(child)
            if total > limit:
                raise ValueError(f"more than {limit} values once its aliases are expanded (an alias bomb?)")
        sizes[id(node)] = total
        return total

    return size(root)


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML says keys are unique; the
    plain loader silently keeps the last one, so an edit could be ignored unnoticed), a key that
    cannot be a key (a mapping or a list), and a document whose aliases expand it beyond
    MAX_NODES values (before anything is built from it)."""

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            try:
                _expanded_size(node, MAX_NODES)
            except ValueError as e:
                raise yaml.composer.ComposerError(None, None, str(e), node.start_mark) from None
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found a {type(key).__name__} as a key; expected a name", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)
