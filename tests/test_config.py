import subprocess
import sys

import pytest

from exporter.config import ConfigError, load, validate
from tests.helpers import ROOT


def write(tmp_path, text):
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_defaults_without_file():
    cfg = load(None)
    assert cfg.listen == "0.0.0.0:9858"
    assert cfg.paths.sysfs == "/sys"
    assert cfg.collector_timeout_seconds == 5.0


def test_file_values_and_cli_overrides(tmp_path):
    p = write(tmp_path, "listen: 127.0.0.1:9999\npaths:\n  sysfs: /tmp/sys\n")
    cfg = load(p, {"paths.sysfs": "/other/sys"})
    assert cfg.listen == "127.0.0.1:9999"
    assert cfg.paths.sysfs == "/other/sys"


@pytest.mark.parametrize("text, key, expected", [
    ("bogus: 1\n", "'bogus'", "expected one of"),
    ("paths:\n  sysfss: /x\n", "'paths.sysfss'", "paths.sysfs"),
    ("collector_timeout_seconds: fast\n", "'collector_timeout_seconds'", "a number"),
    ("collector_timeout_seconds: -1\n", "'collector_timeout_seconds'", "greater than 0"),
    ("listen: nowhere\n", "'listen'", "HOST:PORT"),
    ("log_level: loud\n", "'log_level'", "one of debug"),
    ("paths: 3\n", "'paths'", "a mapping"),
    ("node:\n  expected_gpus: true\n", "'node.expected_gpus'", "an integer"),
])
def test_bad_values_name_file_key_and_expectation(tmp_path, text, key, expected):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load(p)
    msg = str(e.value)
    assert str(p) in msg and key in msg and expected in msg


def test_not_yaml(tmp_path):
    p = write(tmp_path, "listen: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(p)


def test_top_level_must_be_mapping():
    with pytest.raises(ConfigError, match="expected a mapping"):
        validate(["a"], "x.yaml")


def test_unknown_key_exits_2_naming_the_key(tmp_path):
    p = write(tmp_path, "gpu_frobnicate: yes\n")
    r = subprocess.run([sys.executable, "-m", "exporter", "--config", str(p)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "gpu_frobnicate" in r.stderr and str(p) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_duplicate_keys_are_refused_naming_the_file_and_key(tmp_path):
    import exporter.collectors.gpu  # noqa: F401 - declares the gpu section

    p = write(tmp_path, "gpu:\n  parallel: true\n  nvlink: false\n  parallel: false\n")
    with pytest.raises(ConfigError, match=r"config.yaml: not valid YAML: [\s\S]*duplicate key 'parallel' "
                                          r"\(first at line 2\)"):
        load(p)
    p = write(tmp_path, "log_level: debug\nlog_level: info\n")
    with pytest.raises(ConfigError, match="duplicate key 'log_level'"):
        load(p)


def test_a_non_utf8_config_file_names_the_file(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_bytes(b"log_level: info\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"config.yaml: not UTF-8 text \(byte 21"):
        load(p)


def test_gpu_read_timeout_above_its_share_of_the_timeout_is_an_error(tmp_path):
    import exporter.collectors.gpu  # noqa: F401 - declares the gpu section

    p = write(tmp_path, "gpu:\n  timeout_seconds: 2\n  read_timeout_seconds: 3\n")
    with pytest.raises(ConfigError, match=r"config.yaml: key 'gpu.read_timeout_seconds' is 3; expected at "
                                          r"most 0.8 x gpu.timeout_seconds \(1.6\)"):
        load(p)
    assert load(write(tmp_path, "gpu:\n  timeout_seconds: 2\n  read_timeout_seconds: 1.6\n")) is not None
