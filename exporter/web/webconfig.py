"""TLS and basic authentication from a web configuration file in the Prometheus exporter-toolkit
format (`--web.config.file`), so the file users write for node_exporter works here.

Supported (the rest of the format is refused with an error naming the key, never ignored):

    tls_server_config:
      cert_file: server.crt        # with key_file: serve HTTPS
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
      client_ca_file: ca.crt       # needed by the two verifying client_auth_types
      min_version: TLS12           # TLS10..TLS13 (default TLS12, as the toolkit)
      max_version: TLS13
    http_server_config:
      http2: true                  # accepted; this server speaks HTTP/1.1 (Prometheus does too)
      headers: {Strict-Transport-Security: max-age=31536000}   # added to every response
    basic_auth_users:
      prometheus: $2b$12$...       # bcrypt hash (htpasswd -nBC 12 '' | tr -d ':\\n')

Refused: `cipher_suites`, `curve_preferences` (Go's names, no faithful mapping to OpenSSL),
`client_allowed_sans`, inline `cert`/`key`, `RequestClientCert` and `RequireAnyClientCert`
(Python's ssl cannot ask for a certificate without verifying it). Relative file names are
relative to the web config file, as in the toolkit. Read once at start-up; a bad file stops
the start with exit status 2 and a message naming the file and the key.

Basic auth guards every path but /healthz and /readyz, which carry no data, so liveness and
readiness probes need no secret. A verified user and password is cached in memory (as an HMAC),
so a scrape pays bcrypt's cost once, not every 15 s; the server (exporter.web.httpd) runs uncached
checks on their own bounded threads and queue, so wrong passwords cannot take its workers. With
client certificates required, probes need one too (use an exec or TCP probe, or
VerifyClientCertIfGiven).

Every file named here is opened non-blocking and must be a regular file (a FIFO or a device
where a file belongs is refused, never waited on).
"""

from __future__ import annotations

import os
import re
import reprlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from exporter.config import ConfigError, read_config_bytes

if TYPE_CHECKING:
    import ssl  # imported when TLS is configured: ~5 MiB RSS a node without TLS does not pay

# Names in ssl.TLSVersion and ssl.VerifyMode.
_VERSIONS = {"TLS10": "TLSv1", "TLS11": "TLSv1_1", "TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
_CLIENT_AUTH = {"": "CERT_NONE", "NoClientCert": "CERT_NONE", "VerifyClientCertIfGiven": "CERT_OPTIONAL",
                "RequireAndVerifyClientCert": "CERT_REQUIRED"}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
             "prefer_server_cipher_suites"}
_TLS_REFUSED = {"cipher_suites", "curve_preferences", "client_allowed_sans", "cert", "key"}
# The response headers the toolkit lets a web config set.
_HEADERS = {"Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options", "X-XSS-Protection",
            "Content-Security-Policy"}
_BCRYPT = re.compile(r"^\$2[aby]?\$\d\d\$[./A-Za-z0-9]{53}$")
_repr = reprlib.Repr()  # values in messages: bounded, whatever the file holds
_repr.maxstring = _repr.maxother = 60
_repr.maxlist = _repr.maxdict = 4
_repr.maxlevel = 2
_short = _repr.repr


def _key(k: object) -> str:
    """A mapping key as written in a message: as is when a short string, else bounded."""
    return k if isinstance(k, str) and len(k) <= 60 else _short(k)


@dataclass
class WebConfig:
    source: str = ""
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: list[tuple[str, str]] = field(default_factory=list)


def load_web_config(path: str | Path | None) -> WebConfig:
    """Parse and check the file; a bad file raises ConfigError naming the file and the key."""
    if path is None:
        return WebConfig()
    p = Path(path)
    try:
        data = yaml.safe_load(read_config_bytes(p, "web config file").decode())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from e
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level is {type(data).__name__}; expected a mapping")
    out = WebConfig(source=str(p))
    for key, val in data.items():
        if key == "tls_server_config":
            out.ssl_context = _tls(p, _mapping(p, key, val))
        elif key == "basic_auth_users":
            out.users = _users(p, _mapping(p, key, val))
        elif key == "http_server_config":
            out.headers = _http(p, _mapping(p, key, val))
        else:
            raise ConfigError(f"{p}: unknown key {_short(key)}; expected tls_server_config, "
                              "http_server_config or basic_auth_users")
    return out


def _mapping(p: Path, key: str, val: Any) -> dict[str, Any]:
    if val is None:
        return {}
    if not isinstance(val, dict):
        raise ConfigError(f"{p}: key '{key}' is {type(val).__name__}; expected a mapping")
    return val


def _string(p: Path, key: str, val: Any) -> str:
    if not isinstance(val, str):
        raise ConfigError(f"{p}: key '{key}' is {type(val).__name__} {_short(val)}; expected a string")
    return val


def _tls(p: Path, c: dict[str, Any]) -> ssl.SSLContext | None:
    for k in c:
        if k in _TLS_REFUSED:
            raise ConfigError(f"{p}: key 'tls_server_config.{k}' is not supported by gpu-health-exporter "
                              "(see docs/configuration.md, web config)")
        if k not in _TLS_KEYS:
            raise ConfigError(f"{p}: unknown key 'tls_server_config.{_key(k)}'; expected one of "
                              + ", ".join(sorted(_TLS_KEYS)))
    s = {k: _string(p, f"tls_server_config.{k}", v) for k, v in c.items()
         if k != "prefer_server_cipher_suites"}  # a no-op in Go's TLS too
    if not s:
        return None
    if not s.get("cert_file") or not s.get("key_file"):
        raise ConfigError(f"{p}: tls_server_config needs both cert_file and key_file")
    auth = s.get("client_auth_type", "")
    if auth not in _CLIENT_AUTH:
        raise ConfigError(f"{p}: key 'tls_server_config.client_auth_type' is {_short(auth)}; expected one of "
                          "NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert")
    ca = s.get("client_ca_file", "")
    if ca and _CLIENT_AUTH[auth] == "CERT_NONE":
        raise ConfigError(f"{p}: tls_server_config.client_ca_file is set without a verifying "
                          "client_auth_type (as the exporter-toolkit, this is refused)")
    if _CLIENT_AUTH[auth] != "CERT_NONE" and not ca:
        raise ConfigError(f"{p}: tls_server_config.client_auth_type {auth} needs client_ca_file")
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for k, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        v = s.get(k, default)
        if v not in _VERSIONS:
            raise ConfigError(f"{p}: key 'tls_server_config.{k}' is {_short(v)}; expected one of "
                              + ", ".join(_VERSIONS))
        try:
            setattr(ctx, k, ssl.TLSVersion[_VERSIONS[v]])
        except (ValueError, ssl.SSLError) as e:
            raise ConfigError(f"{p}: tls_server_config.{k} {v}: {e}") from e
    base = p.parent
    cert, key = base / s["cert_file"], base / s["key_file"]
    # read as config files (ssl would block on a FIFO), and loaded from those bytes: what a
    # reload validated is what its new process loads (exporter.reload_snapshot)
    pems = (read_config_bytes(cert, "tls_server_config.cert_file", p),
            read_config_bytes(key, "tls_server_config.key_file", p))
    try:
        _load_cert_chain(ctx, *pems)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{p}: tls_server_config cert_file {cert} / key_file {key}: {e}") from e
    if ca:
        pem = read_config_bytes(base / ca, "tls_server_config.client_ca_file", p)
        try:
            ctx.load_verify_locations(cadata=pem.decode("ascii", "replace"))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"{p}: tls_server_config.client_ca_file {base / ca}: {e}") from e
    ctx.verify_mode = ssl.VerifyMode[_CLIENT_AUTH[auth]]
    return ctx


def _load_cert_chain(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """SSLContext.load_cert_chain from bytes (it takes only paths): anonymous memory files."""
    fds = []
    try:
        for data in (cert_pem, key_pem):
            fds.append(os.memfd_create("gpu-health-exporter-tls"))
            with open(fds[-1], "wb", closefd=False) as f:
                f.write(data)
        ctx.load_cert_chain(*(f"/proc/self/fd/{fd}" for fd in fds))
    finally:
        for fd in fds:
            os.close(fd)


def _users(p: Path, c: dict[str, Any]) -> dict[str, bytes]:
    out = {}
    for user, h in c.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(f"{p}: basic_auth_users key {_short(user)} is not a user name")
        h = _string(p, f"basic_auth_users.{user}", h)
        if not _BCRYPT.match(h):
            raise ConfigError(f"{p}: basic_auth_users.{user} is not a bcrypt hash ($2y$, $2b$ or $2a$, "
                              "60 characters; make one with htpasswd -nBC 12 '' or Python's bcrypt)")
        out[user] = h.encode()
    return out


def _http(p: Path, c: dict[str, Any]) -> list[tuple[str, str]]:
    headers = []
    for k, v in c.items():
        if k == "http2":
            if not isinstance(v, bool):
                raise ConfigError(f"{p}: key 'http_server_config.http2' is {_short(v)}; expected a boolean")
        elif k == "headers":
            for name, val in _mapping(p, "http_server_config.headers", v).items():
                if name not in _HEADERS:
                    raise ConfigError(f"{p}: http_server_config.headers.{_key(name)} cannot be set; "
                                      "expected one of " + ", ".join(sorted(_HEADERS)))
                headers.append((name, _string(p, f"http_server_config.headers.{name}", val)))
        else:
            raise ConfigError(f"{p}: unknown key 'http_server_config.{_key(k)}'; expected http2 or headers")
    return headers


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes. A verified user:password is cached
    (as an HMAC under a per-process key, never the password) so a scrape every 15 s does not pay
    bcrypt's ~0.25 s each time. An unknown user costs one bcrypt against a dummy hash made at the
    highest cost of the configured hashes, so a wrong password takes as long for a user that does
    not exist as for one that does. Only verified credentials enter the cache (bounded), so a
    client without them cannot fill or flush it. A wrong user:password is remembered too
    (bounded, the oldest forgotten first): the users and hashes are fixed for the process's life,
    so a client repeating the same wrong password is answered 401 at once, without a bcrypt or a
    place in the server's password-check queue. A password over bcrypt's 72 bytes is wrong (as
    in Go's bcrypt), after the same bcrypt as any other."""

    _MAX_CACHED = 64
    _MAX_WRONG = 4096  # 32 bytes each
    _MAX_PASSWORD = 72  # bcrypt's limit; the bcrypt library raises beyond it
    realm = "gpu-health-exporter"

    def __init__(self, users: dict[str, bytes]) -> None:
        import hmac  # as bcrypt: loads libcrypto, which a node without basic auth does not need

        import bcrypt  # only needed when basic auth is configured

        self._bcrypt = bcrypt
        self._hmac = hmac
        self.users = users
        cost = max((bcrypt_cost(h) for h in users.values()), default=12)
        self._dummy = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(min(31, max(4, cost))))
        self._key = os.urandom(32)
        self._ok: set[bytes] = set()
        self._wrong: dict[bytes, None] = {}  # insertion-ordered: the oldest is forgotten first
        self._lock = threading.Lock()
        self.bcrypt_checks = 0  # how many times bcrypt ran (tests check the cache)

    def _parse(self, authorization: str) -> tuple[str, str] | None:
        import base64
        import binascii

        scheme, _, cred = authorization.strip().partition(" ")
        if scheme.lower() != "basic" or len(cred) > 4096:
            return None
        try:
            user, sep, password = base64.b64decode(cred.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return (user, password) if sep else None

    def _token(self, user: str, password: str) -> bytes:
        return self._hmac.digest(self._key, user.encode() + b"\0" + password.encode(), "sha256")

    def cached(self, authorization: str) -> bool | None:
        """True for cached verified credentials, False for a header that is not Basic
        credentials at all or credentials already found wrong, None when only bcrypt can tell
        (cheap: one HMAC)."""
        cred = self._parse(authorization)
        if cred is None:
            return False
        token = self._token(*cred)
        with self._lock:
            if token in self._ok:
                return True
            return False if token in self._wrong else None

    def verify(self, authorization: str) -> bool:
        """The full check: one bcrypt, at the same cost for known and unknown users."""
        cred = self._parse(authorization)
        if cred is None:
            return False
        user, password = cred
        stored = self.users.get(user)
        self.bcrypt_checks += 1
        secret = password.encode()
        ok = self._bcrypt.checkpw(secret[:self._MAX_PASSWORD], stored or self._dummy) \
            and stored is not None and len(secret) <= self._MAX_PASSWORD
        token = self._token(user, password)
        with self._lock:
            if ok:
                if len(self._ok) >= self._MAX_CACHED:
                    self._ok.clear()
                self._ok.add(token)
            else:
                if len(self._wrong) >= self._MAX_WRONG:
                    del self._wrong[next(iter(self._wrong))]
                self._wrong[token] = None
        return ok

    def check(self, authorization: str) -> bool:
        ok = self.cached(authorization)
        return self.verify(authorization) if ok is None else ok


def bcrypt_cost(h: bytes) -> int:
    """The cost (log2 rounds) of a checked bcrypt hash: `$2b$12$...` -> 12."""
    return int(h.split(b"$")[2])
