"""TLS and basic auth from an exporter-toolkit web config file, with certificates made by the
openssl CLI at test time and bcrypt hashes from the bcrypt package."""

import shutil
import signal
import subprocess
import sys

import bcrypt
import pytest
import requests

from exporter.runner import Runner
from exporter.web.server import Server
from exporter.web.webconfig import ConfigError, load_web_config
from tests.helpers import HANG_GUARD_S, ROOT, START_HANG_GUARD_S, start_exporter, test_pool, value, wait_for
from tests.test_runner import Probe

PASSWORD = "s3cret-scrape"


def _openssl(*args: str, cwd) -> None:
    exe = shutil.which("openssl")
    assert exe, "openssl is missing: install Debian's 'openssl' package (.ci/run does)"
    subprocess.run([exe, *args], cwd=cwd, check=True, capture_output=True, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test-ca",
             cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


def _web(pki, text: str):
    p = pki / "web.yml"
    p.write_text(text)
    return p


def _users() -> str:
    h = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    return f"basic_auth_users:\n  prometheus: '{h}'\n"


def _serve(web_file):
    runner = Runner([Probe("alpha")], deadline_s=1, pool=test_pool())
    srv = Server(runner, "127.0.0.1", 0, load_web_config(web_file))
    srv.start()
    return srv, runner


def test_tls_and_basic_auth(pki):
    web = _web(pki, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                    "http_server_config:\n  headers:\n    X-Frame-Options: deny\n" + _users())
    srv, runner = _serve(web)
    url = f"https://127.0.0.1:{srv.port}"
    ca = str(pki / "ca.crt")
    try:
        r = requests.get(url + "/metrics", auth=("prometheus", PASSWORD), verify=ca, timeout=10)
        assert r.status_code == 200
        assert value(r.text, "gpu_health_exporter_collector_success", collector="alpha") == 1
        assert r.headers["X-Frame-Options"] == "deny"
        # Verified credentials are cached: more scrapes pay no bcrypt.
        checks = srv.app.auth.bcrypt_checks
        for _ in range(3):
            assert requests.get(url + "/metrics", auth=("prometheus", PASSWORD), verify=ca,
                                timeout=10).status_code == 200
        assert srv.app.auth.bcrypt_checks == checks
        for auth in (None, ("prometheus", "wrong"), ("nobody", PASSWORD)):
            r = requests.get(url + "/metrics", auth=auth, verify=ca, timeout=10)
            assert r.status_code == 401 and "gpu_health" not in r.text
            assert r.headers["WWW-Authenticate"].startswith("Basic")
        assert requests.get(url + "/", verify=ca, timeout=10).status_code == 401
        # Probes need no secret; they carry no data.
        assert requests.get(url + "/healthz", verify=ca, timeout=10).status_code == 200
        # Plain HTTP on the TLS port gets 400 and a hint, as from Go's net/http.
        r = requests.get(f"http://127.0.0.1:{srv.port}/metrics", auth=("prometheus", PASSWORD), timeout=10)
        assert r.status_code == 400 and "HTTPS server" in r.text and "gpu_health" not in r.text
        # An untrusted certificate is refused by the client: the server really serves ours.
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(url + "/healthz", timeout=10)
    finally:
        srv.shutdown()
        runner.close()


def test_client_certificate_required(pki):
    web = _web(pki, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                    "  client_ca_file: ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n"
                    "  min_version: TLS13\n")
    srv, runner = _serve(web)
    url = f"https://127.0.0.1:{srv.port}/metrics"
    ca = str(pki / "ca.crt")
    try:
        r = requests.get(url, verify=ca, cert=(str(pki / "client.crt"), str(pki / "client.key")), timeout=10)
        assert r.status_code == 200
        with pytest.raises(requests.ConnectionError):
            requests.get(url, verify=ca, timeout=10)
        # A certificate the CA did not sign is refused too (the server's own key and a self-signed cert).
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", "rogue.key", "-out", "rogue.crt", "-days", "2", "-subj", "/CN=rogue", cwd=pki)
        with pytest.raises(requests.ConnectionError):
            requests.get(url, verify=ca, cert=(str(pki / "rogue.crt"), str(pki / "rogue.key")), timeout=10)
    finally:
        srv.shutdown()
        runner.close()


TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"


@pytest.mark.parametrize("text, words", [
    (TLS + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     ["tls_server_config.cipher_suites", "not supported"]),
    (TLS + "  client_auth_type: RequestClientCert\n",
     ["client_auth_type", "RequestClientCert"]),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n",
     ["client_ca_file", "client_auth_type"]),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
     "  client_auth_type: VerifyClientCertIfGiven\n", ["needs client_ca_file"]),
    ("tls_server_config:\n  cert_file: server.crt\n", ["cert_file and key_file"]),
    ("tls_server_config:\n  cert_file: missing.crt\n  key_file: server.key\n", ["missing.crt"]),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS9\n",
     ["tls_server_config.min_version", "TLS9"]),
    ("basic_auth_users:\n  prometheus: plaintext\n", ["basic_auth_users.prometheus", "bcrypt"]),
    ("basic_auth_user:\n  prometheus: x\n", ["unknown key 'basic_auth_user'"]),
    ("http_server_config:\n  headers:\n    Server: me\n", ["http_server_config.headers.Server"]),
    ("- a list\n", ["top level"]),
])
def test_bad_web_config_names_file_and_key(pki, text, words):
    p = _web(pki, text)
    with pytest.raises(ConfigError) as e:
        load_web_config(p)
    assert str(e.value).startswith(str(p))
    for w in words:
        assert w in str(e.value)


def test_daemon_with_web_config_file(pki, tmp_path):
    """--web.config.file end to end: the daemon serves HTTPS with basic auth; a bad file exits 2."""
    web = _web(pki, f"tls_server_config:\n  cert_file: {pki}/server.crt\n  key_file: {pki}/server.key\n"
               + _users())
    ca = str(pki / "ca.crt")
    proc, url, _ = start_exporter(tmp_path, "--simulate", "p5.48xlarge", "--collectors", "efa",
                                  "--web.config.file", str(web), path="/readyz", verify=ca)
    url = url.removesuffix("/readyz")
    try:
        assert requests.get(url + "/metrics", verify=ca, timeout=10).status_code == 401
        r = requests.get(url + "/metrics", auth=("prometheus", PASSWORD), verify=ca, timeout=10)
        assert r.status_code == 200 and value(r.text, "efa_devices") > 0
    finally:
        proc.terminate()
        proc.wait(15)
    bad = tmp_path / "bad.yml"
    bad.write_text("basic_auth_users: [x]\n")
    r = subprocess.run([sys.executable, "-m", "exporter", "--listen", "127.0.0.1:0",
                        "--web.config.file", str(bad)], cwd=ROOT, capture_output=True, text=True,
                        timeout=HANG_GUARD_S)
    assert r.returncode == 2 and str(bad) in r.stderr and "basic_auth_users" in r.stderr


@pytest.mark.slow
def test_sighup_with_a_broken_web_config_keeps_serving(tmp_path):
    """SIGHUP validates the web config file too before restarting in place: a bad edit of it
    must not turn into an exporter that cannot start."""
    web = tmp_path / "web.yml"
    web.write_text(_users())
    proc, url, log = start_exporter(tmp_path, "--simulate", "p5.48xlarge", "--collectors", "efa",
                                    "--web.config.file", str(web), path="/readyz")
    url = url.removesuffix("/readyz")
    try:
        web.write_text("basic_auth_users:\n  prometheus: not-a-hash\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: not reloading" in log.read_text(), START_HANG_GUARD_S,
                 "the reload refusal", proc, log)
        assert "basic_auth_users.prometheus" in log.read_text() and proc.poll() is None
        r = requests.get(url + "/metrics", auth=("prometheus", PASSWORD), timeout=10)
        assert r.status_code == 200  # still the running configuration
    finally:
        proc.terminate()
        proc.wait(15)
