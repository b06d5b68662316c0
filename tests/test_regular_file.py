"""exporter.regular_file: the one opener of files that must be regular files."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from exporter.regular_file import NotRegularFile, read_regular


def test_a_fifo_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)  # no writer: a blocking open would never return
    with pytest.raises(NotRegularFile) as e:
        read_regular(fifo, 100)
    assert e.value.kind == "a FIFO" and str(fifo) in str(e.value)


def test_a_socket_and_a_directory_are_named(tmp_path: Path) -> None:
    sock_path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        with pytest.raises(NotRegularFile) as e:
            read_regular(sock_path, 100)
    assert e.value.kind == "a socket"
    with pytest.raises(NotRegularFile) as e:
        read_regular(tmp_path, 100)
    assert e.value.kind == "a directory"


def test_symbolic_links_are_followed_only_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.write_bytes(b"abc")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert read_regular(link, 100) == b"abc"  # a ConfigMap's files are links
    with pytest.raises(NotRegularFile) as e:
        read_regular(link, 100, follow=False)  # a state file must not be one
    assert e.value.kind == "a symbolic link"


def test_at_most_one_byte_over_the_limit_is_read(tmp_path: Path) -> None:
    f = tmp_path / "big"
    f.write_bytes(b"x" * 10_000)
    assert read_regular(f, 10_000) == b"x" * 10_000
    assert len(read_regular(f, 99)) == 100  # the caller sees it is over
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", 10)
