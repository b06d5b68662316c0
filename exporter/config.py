"""Configuration: a YAML file validated against a declared schema at start-up.

Every key is declared once with its type, default and documentation; sections are declared by
the modules that own them (`declare_section`). An unknown key, a wrong type or an impossible
value raises ConfigError naming the file, the key and what was expected. docs/configuration.md
is generated from the schema (exporter.docs).
"""

from __future__ import annotations

import types
from collections.abc import Callable
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


def _check_value(where: str, key_name: str, key: Key, value: Any) -> Any:
    if value is None:
        if key.nullable:
            return None
        raise ConfigError(f"{where}: key '{key_name}' is null; expected {key.describe()}")
    types_ = key.type if isinstance(key.type, tuple) else (key.type,)
    ok = isinstance(value, types_) and not (isinstance(value, bool) and bool not in types_)
    if not ok:
        raise ConfigError(
            f"{where}: key '{key_name}' is {type(value).__name__} {value!r}; expected {key.describe()}")
    if key.check:
        problem = key.check(value)
        if problem:
            raise ConfigError(f"{where}: key '{key_name}' is {value!r}; expected {problem}")
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


def load(path: str | Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Load and validate a config file (None: defaults only)."""
    if path is None:
        return validate({}, overrides=overrides)
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the config file: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})") from e
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from e
    return validate(data, str(p), overrides)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML says keys are unique; the
    plain loader silently keeps the last one, so an edit could be ignored unnoticed)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)
