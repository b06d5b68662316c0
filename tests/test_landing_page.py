"""The landing page an on-call engineer needs: for every GPU, healthy ones too, its
verdict, the workload on it now, the faults it logged with the workloads they hit, each reason's
runbook link and the `ack` command that clears it; checked as served by a simulated node, and in a
real browser (Debian's headless Chromium) with JavaScript off: the page has no script to need."""

from __future__ import annotations

import re
import struct
import time
import zlib

import pytest
import requests

from exporter import collectors
from exporter.arguments import build_parser
from exporter.runbooks import anchor
from exporter.runner import Runner
from exporter.share import CHECKOUT
from exporter.startup import build_context
from exporter.web.landing import render_page
from exporter.xid.verdict import ALL_REASONS, RUNBOOK, GpuVerdict, NodeVerdict, XidLine
from tests.browser import render
from tests.helpers import START_HANG_GUARD_S, test_pool
from tests.test_server import serving, wait_ready


def test_every_reason_links_to_a_runbook_section_that_exists():
    md = (CHECKOUT / "docs" / "runbooks.md").read_text()
    sections = {anchor(line.lstrip("#").strip()) for line in md.splitlines() if line.startswith("#")}
    assert set(RUNBOOK) == set(ALL_REASONS)
    assert {anchor(v) for v in RUNBOOK.values()} <= sections


def test_a_healthy_node_lists_every_gpu():
    gpus = [GpuVerdict(str(i), f"GPU-{i}", f"0000:{i:02x}:00.0") for i in range(8)]
    nv = NodeVerdict("healthy", [], gpus, 8, 8)
    page = render_page([], {}, time.time(), nv)
    rows = [r for r in page.split("<tr>") if r.startswith("<td>")]
    assert len(rows) == 8 and all('class="good">healthy' in r and "nothing to clear" in r for r in rows)
    assert "<script" not in page


def test_a_gpu_with_an_xid_shows_the_fault_whom_it_hit_the_runbook_and_the_ack():
    xid = XidLine(94, "replace", 2, 1795878849.0, False, "Contained uncorrectable ECC error")
    nv = NodeVerdict("replace_required", ["xid_replace", "gpu_not_answering"],
                     [GpuVerdict("1", "GPU-1", "00000000:64:00.0", "replace_required", ["xid_replace"],
                                 [xid]),
                      GpuVerdict("3", "GPU-3", "00000000:86:00.0", "unknown", ["gpu_not_answering"])], 8, 8)
    page = render_page([], {}, time.time(), nv)
    row1 = next(r for r in page.split("<tr>") if r.startswith("<td>1</td>"))
    assert "XID 94 &times;2 (replace; last 2026-" in row1 and "no workload recorded" in row1
    assert '<a href="/runbooks.html#gpuxidreplacenow"><code>xid_replace</code></a>' in row1
    assert "<code>gpu-health-exporter ack --gpu 1</code>" in row1
    row3 = next(r for r in page.split("<tr>") if r.startswith("<td>3</td>"))
    assert 'href="/runbooks.html#gpuunresponsive"' in row3 and "no ack" in row3 and "ack --gpu" not in row3


# --- served by a simulated node, read by a browser ---------------------------------------------------

def _png_is_a_page(data: bytes) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the image data) of a PNG Chromium made."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, at = b"", 8
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"IDAT":
            idat += data[at + 8:at + 8 + n]
        at += 12 + n
    return width, height, len(set(zlib.decompress(idat)))


@pytest.fixture(scope="module")
def node():
    """A simulated p5 with a Slurm job on every GPU and XID 94 on GPU 1, served on 127.0.0.1."""
    ctx, sim = build_context(build_parser().parse_args(
        ["--simulate", "p5.48xlarge", "--scenario", "slurm-job", "--scenario", "xid-94"]))
    runner = Runner.from_config(collectors.build(ctx, None), ctx.config, pool=test_pool())
    sim.start()
    runner.start()
    try:
        with serving(runner) as addr:
            base = f"http://{addr}"
            wait_ready(base)
            healthy = requests.get(base + "/", timeout=30).text  # before the XID (at 3 s)
            deadline = time.monotonic() + START_HANG_GUARD_S
            while 'xid="94"' not in requests.get(base + "/metrics", timeout=30).text:
                assert time.monotonic() < deadline, "XID 94 was not counted within 60 s"
                time.sleep(0.5)
            yield base, healthy
    finally:
        sim.close()
        runner.close()


def test_the_served_page_on_a_healthy_node_lists_every_gpu_with_its_job(node):
    _, healthy = node
    rows = [r for r in healthy.split("<tr>") if re.match(r"<td>\d</td>", r)]
    assert len(rows) == 8, healthy
    assert all("healthy" in r and "Slurm job 4242" in r for r in rows)


def test_the_browser_really_runs_no_script(tmp_path):
    """The way the tests below browse does turn JavaScript off (else "without scripts" proves
    nothing)."""
    page = "data:text/html,<p id=x>off</p><script>document.getElementById('x').textContent='on'</script>"
    got = render(page, tmp_path / "profile")
    assert '<p id="x">off</p>' in got.html, got.html


def test_the_served_page_in_a_browser_without_scripts(node, tmp_path):
    base, _ = node
    assert "<script" not in requests.get(base + "/", timeout=30).text
    got = render(base + "/", tmp_path / "profile")
    dom = got.html
    assert "Node verdict" in dom, dom[:2000]
    row1 = next(x for x in dom.split("<tr>") if x.startswith("<td>1</td>"))
    assert "XID 94" in row1 and "hit: Slurm job 4242" in row1
    assert "Slurm job 4242" in row1.split("XID 94")[0]  # the workload now, before the faults
    assert "gpu-health-exporter ack --gpu 1" in row1
    link = re.search(r'href="(/runbooks\.html#[\w-]+)"', row1)
    assert link, row1
    others = [x for x in dom.split("<tr>") if re.match(r"<td>[02-7]</td>", x)]
    assert len(others) == 7 and all("healthy" in x for x in others)
    # the runbook link opens a section of a page the exporter serves
    book = requests.get(base + link.group(1).split("#")[0], timeout=30)
    assert book.status_code == 200 and f'id="{link.group(1).split("#")[1]}"' in book.text
    # and it renders: a screenshot of the page, not a blank one
    (tmp_path / "landing.png").write_bytes(got.png)  # kept in the test's directory to look at
    width, height, distinct = _png_is_a_page(got.png)
    assert (width, height) == (1400, 1800) and distinct > 8  # text, tables, colours: not one flat colour
