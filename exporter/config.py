"""Configuration: a YAML file validated against a declared schema at start-up.

Every key is declared once with its type, default and documentation; sections are declared by
the modules that own them (`declare_section`). An unknown key, a wrong type or an impossible
value raises ConfigError naming the file, the key and what was expected. docs/configuration.md
is generated from the schema (exporter.docs).
"""

from __future__ import annotations

import os
import stat
import types
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ConfigError(Exception):
    """A bad configuration: the message names the file, the key and what was expected."""


@dataclass(frozen=True)
class Key:
    type: type | tuple[type, ...]
    default: Any
    doc: str
    # Returns None when the value is acceptable, else a description of what was expected.
    check: Callable[[Any], str | None] | None = None
    nullable: bool = False
    expected: str = ""  # how to describe the type in errors and docs; derived when empty

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
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return "HOST:PORT with a port from 1 to 65535 (for example 0.0.0.0:9858)"
    return None


DEFAULT_PORT = 9858

# Top-level keys, then sections: section name -> (doc, keys).
TOP: dict[str, Key] = {
    "listen": Key(str, f"0.0.0.0:{DEFAULT_PORT}", "Address and port of the HTTP endpoint.", check=host_port),
    "log_level": Key(str, "info", "Log level.", check=one_of("debug", "info", "warning", "error")),
    "collector_timeout_seconds": Key(
        (int, float), 5.0,
        "Deadline for each collector in one collection; a collector past it reports failure "
        "for that scrape while the others are served. Keep it under Prometheus' scrape timeout.",
        check=positive),
    "shutdown_timeout_seconds": Key(
        (int, float), 5.0,
        "After SIGTERM (or a SIGHUP reload) the process exits within this many seconds, the XID state "
        "file flushed first, whatever a source is doing (a read blocked in NVML or the kernel is "
        "abandoned).", check=positive),
}
SECTIONS: dict[str, tuple[str, dict[str, Key]]] = {
    "paths": ("Where each file source is read from (node_exporter's --path.* style).", {
        "sysfs": Key(str, "/sys", "Root of sysfs."),
        "procfs": Key(str, "/proc", "Root of procfs."),
        "debugfs": Key(str, "/sys/kernel/debug", "Root of debugfs."),
        "kmsg": Key(str, "/dev/kmsg", "Kernel log device (or a file of /dev/kmsg records)."),
        "state_dir": Key(str, "/var/lib/gpu-health-exporter", "Directory for the exporter's state file."),
    }),
    "web": ("The HTTP endpoint: TLS and basic auth from a web config file, and the server's limits "
            "(see 'The web config file' below and docs/design.md).", {
        "config_file": Key(str, None, "Web config file in the Prometheus exporter-toolkit format (TLS, "
                           "basic auth); --web.config.file overrides. Unset: plain HTTP, no auth.",
                           nullable=True),
        "max_connections": Key(
            int, 512, "Connections held at once (idle, slow or busy). At the limit a new connection "
            "replaces the longest-idle one; lowered to fit the open-file limit.", check=positive),
        "read_header_timeout_seconds": Key((int, float), 10.0, "Time a new connection has for its TLS "
                                           "handshake and first request head.", check=positive),
        "idle_timeout_seconds": Key((int, float), 60.0, "Time a kept-alive connection may wait for its next "
                                    "request.", check=positive),
        "write_timeout_seconds": Key((int, float), 10.0, "Time a client has to take a response.",
                                     check=positive),
        "workers": Key(int, 4, "Threads serving requests; more requests wait for one without a thread of "
                       "their own (concurrent scrapes share one collection).", check=positive),
    }),
    "node": ("What the node is and what it should have.", {
        "instance_type": Key(str, None, "EC2 instance type; when unset, the DMI product name (sysfs "
                             "devices/virtual/dmi/id/product_name), else instance metadata.",
                             nullable=True),
        "expected_gpus": Key(int, None, "GPUs the node should have; from the instance type when unset.",
                             nullable=True, check=non_negative),
    }),
}


def declare_section(name: str, doc: str, keys: dict[str, Key]) -> None:
    """Add (or extend) a section of the schema; collectors declare their own keys."""
    if name in SECTIONS:
        old_doc, old = SECTIONS[name]
        clash = set(old) & set(keys)
        if clash:
            raise ValueError(f"config keys declared twice in {name}: {sorted(clash)}")
        SECTIONS[name] = (old_doc or doc, {**old, **keys})
    else:
        SECTIONS[name] = (doc, dict(keys))


# Checks across the keys of one section: section -> [fn(values) -> problem or None].
SECTION_CHECKS: dict[str, list[Callable[[dict[str, Any]], str | None]]] = {}


def declare_check(section: str, check: Callable[[dict[str, Any]], str | None]) -> None:
    """A check of a section's values together (one key bounded by another); the problem it
    returns names the keys."""
    SECTION_CHECKS.setdefault(section, []).append(check)


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


def _check_value(where: str, key_name: str, key: Key, value: Any) -> Any:
    if value is None:
        if key.nullable:
            return None
        raise ConfigError(f"{where}: key '{key_name}' is null; expected {key.describe()}")
    types_ = key.type if isinstance(key.type, tuple) else (key.type,)
    ok = isinstance(value, types_) and not (isinstance(value, bool) and bool not in types_)
    if not ok:  # checked before anything formats the value, and then only a bounded part of it
        raise ConfigError(
            f"{where}: key '{key_name}' is {type(value).__name__} {show(value)}; expected {key.describe()}")
    if key.check:
        problem = key.check(value)
        if problem:
            raise ConfigError(f"{where}: key '{key_name}' is {show(value)}; expected {problem}")
    return value


def _namespace(values: dict[str, Any]) -> types.SimpleNamespace:
    return types.SimpleNamespace(**values)


class Config(types.SimpleNamespace):
    """Top-level keys as attributes; each section as a namespace attribute (cfg.paths.sysfs)."""

    source: str


def defaults() -> dict[str, Any]:
    out: dict[str, Any] = {k: key.default for k, key in TOP.items()}
    for name, (_doc, keys) in SECTIONS.items():
        out[name] = {k: key.default for k, key in keys.items()}
    return out


def validate(data: Any, source: str = "<defaults>", overrides: dict[str, Any] | None = None) -> Config:
    """Validate a parsed YAML document plus dotted-key overrides (from the CLI) into a Config."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level is {type(data).__name__}; expected a mapping of keys")
    merged = defaults()
    for k, v in data.items():
        if k in TOP:
            merged[k] = _check_value(source, k, TOP[k], v)
        elif k in SECTIONS:
            if v is None:
                continue
            if not isinstance(v, dict):
                raise ConfigError(f"{source}: key '{k}' is {type(v).__name__}; expected a mapping")
            keys = SECTIONS[k][1]
            for sk, sv in v.items():
                if sk not in keys:
                    raise ConfigError(f"{source}: unknown key '{k}.{sk}'; expected one of "
                                      + ", ".join(f"{k}.{n}" for n in keys))
                merged[k][sk] = _check_value(source, f"{k}.{sk}", keys[sk], sv)
        else:
            raise ConfigError(f"{source}: unknown key '{k}'; expected one of "
                              + ", ".join(list(TOP) + list(SECTIONS)))
    for dotted, v in (overrides or {}).items():
        section, _, sk = dotted.partition(".")
        if sk:
            merged[section][sk] = _check_value("command line", dotted, SECTIONS[section][1][sk], v)
        else:
            merged[section] = _check_value("command line", dotted, TOP[section], v)
    for section, checks in SECTION_CHECKS.items():
        for check in checks:
            problem = check(merged.get(section, {}))
            if problem:
                raise ConfigError(f"{source}: {problem}")
    cfg = Config(**{k: (_namespace(v) if k in SECTIONS else v) for k, v in merged.items()})
    cfg.source = source
    return cfg


MAX_FILE_BYTES = 1 << 20  # a config file is a few KiB; this bounds what a wrong path can cost
MAX_NODES = 100_000  # YAML nodes after alias expansion (an "alias bomb" of 1 KiB expands to 10^9)


def read_config_file(p: Path) -> str:
    """The file's text, refusing what is not a regular file before anything can block on it (a
    FIFO, a device): it is opened non-blocking and checked with fstat."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the config file: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{p}: not a regular file (a {_file_kind(st.st_mode)}); expected a YAML file")
        if st.st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{p}: {st.st_size} bytes; expected a config file of at most {MAX_FILE_BYTES}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the config file: {e.strerror or e}") from e
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{p}: more than {MAX_FILE_BYTES} bytes; expected a config file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})") from e


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


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


def load(path: str | Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Load and validate a config file (None: defaults only)."""
    if path is None:
        return validate({}, overrides=overrides)
    p = Path(path)
    data = parse_yaml(read_config_file(p), str(p))
    return validate(data, str(p), overrides)


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

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        if node is not None:
            try:
                _expanded_size(node, MAX_NODES)
            except ValueError as e:
                raise yaml.composer.ComposerError(None, None, str(e), node.start_mark) from None
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
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
