"""The HTML report and the Chrome trace (issue 13 part 2): parsed, not eyeballed.

Every test counts on CPU in predicted mode. The browser test at the end renders the page in headless
Chromium (Debian's ``chromium``) and is skipped where it is not installed.
"""
import json
import math
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import torch
from torch import nn

import kernelab
from kernelab.cli import main
from kernelab.html_report import render_html
from kernelab.report import Kernel, Report
from kernelab.trace import to_chrome_trace

EVIL = "<script>alert(1)</script>"
VOID = {"br", "meta", "img", "input", "hr", "link", "wbr"}


class Element:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, dict(attrs), parent, [], []

    @property
    def classes(self) -> set:
        return set((self.attrs.get("class") or "").split())

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def find_all(self, tag, cls=None):
        return [e for e in self.walk() if e.tag == tag and (cls is None or cls in e.classes)]

    def all_text(self) -> str:
        return "".join(t for e in self.walk() for t in e.text)

    def ancestor(self, tag, cls=None):
        e = self.parent
        while e is not None and not (e.tag == tag and (cls is None or cls in e.classes)):
            e = e.parent
        return e


class Tree(HTMLParser):
    """A strict little DOM: every non-void element must be closed by its own end tag."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {}, None)
        self.stack = [self.root]
        self.feed(text)
        self.close()
        assert self.stack == [self.root], f"unclosed: {[e.tag for e in self.stack[1:]]}"

    def handle_starttag(self, tag, attrs):
        e = Element(tag, attrs, self.stack[-1])
        self.stack[-1].children.append(e)
        if tag not in VOID:
            self.stack.append(e)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Element(tag, attrs, self.stack[-1]))

    def handle_endtag(self, tag):
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data):
        self.stack[-1].text.append(data)


class Block(nn.Module):
    def __init__(self, width=64, hidden=256):
        super().__init__()
        self.fc = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.proj = nn.Linear(hidden, width)
        self.ln = nn.LayerNorm(width)

    def forward(self, x):
        return self.ln(x + self.proj(self.act(self.fc(x))))


def _net(width=64, hidden=256):
    net = nn.Sequential()
    net.add_module("block", Block(width, hidden))
    net.add_module(EVIL, nn.Linear(width, width))  # a module path a page must show as text
    return net


@pytest.fixture(scope="module")
def block_reports():
    net = _net()

    def step(x):
        net(x).sum().backward()

    c = kernelab.compare(step, torch.randn(199, 64, requires_grad=True), modes=("eager", "inductor", "kernelab"),
                         predict=True)
    return list(c.reports.values())


@pytest.fixture(scope="module")
def gpt2_reports():
    from kernelab.zoo import ZOO

    zm = ZOO["gpt2"]
    model, inputs = zm.build("tiny")

    def train_step(inputs):
        zm.loss(model, inputs).backward()

    c = kernelab.compare(train_step, inputs, modes=("eager", "inductor"), predict=True)
    return list(c.reports.values())


def _check_page(reports, html: str) -> Element:
    """What every page must hold: each mode's section with every module of its tree and a row per
    kernel (full name in the row, short name shown), and nothing fetched from elsewhere."""
    doc = Tree(html).root
    sections = doc.find_all("section", "mode")
    assert len(sections) == len(reports)
    for p, (report, section) in enumerate(zip(reports, sections)):
        paths = {node.path for node in report.by_module().walk()}
        details = section.find_all("details", "mod")
        assert {d.attrs["data-path"] for d in details} == paths
        for d in details:  # the module's path (the target's name for the root) is its summary's text
            summary = d.children[0]
            assert summary.tag == "summary"
            assert summary.find_all("span", "path")[0].all_text() == (d.attrs["data-path"] or report.target)
        rows = {e.attrs["id"]: e for e in section.find_all("tr") if "id" in e.attrs}
        assert sorted(rows) == sorted(f"k{p}-{i}" for i in range(len(report.kernels)))
        for i, k in enumerate(report.kernels):
            row = rows[f"k{p}-{i}"]
            assert row.find_all("td")[1].attrs["title"] == k.name
            assert ", ".join(k.ops) in row.all_text()
            # a kernel's row sits in its module's <details>
            assert row.ancestor("details", "mod").attrs["data-path"] == k.module
    _check_offline(doc)
    return doc


def _check_offline(doc: Element) -> None:
    """No URL but the SVG namespace; no external script, style sheet, image or frame."""
    for e in doc.walk():
        for name, value in e.attrs.items():
            if value and "://" in value:
                assert (e.tag, name, value) == ("svg", "xmlns", "http://www.w3.org/2000/svg")
        assert e.tag not in ("link", "img", "iframe", "object", "embed")
        if e.tag == "script":
            assert "src" not in e.attrs


def test_page_holds_every_module_and_kernel_in_every_mode(block_reports):
    html = render_html(block_reports, title="a block")
    doc = _check_page(block_reports, html)
    assert doc.find_all("title")[0].all_text() == "a block"
    # the modes side by side: one row per module any mode has, each mode's three columns
    side = doc.find_all("table", "side")[0]
    body = [r for r in side.find_all("tr") if r.find_all("td")]
    paths = {n.path for r in block_reports for n in r.by_module().walk()}
    assert len(body) == len(paths)
    root = [r for r in body if r.find_all("td")[0].all_text() == "step"][0]
    cells = [td.all_text() for td in root.find_all("td")[1:]]
    assert cells[0::3] == [str(r.num_kernels) for r in block_reports]
    # the summary: one column per mode, the kernel count and a labelled time in each
    summary = doc.find_all("table", "summary")[0]
    rows = {r.find_all("th")[0].all_text(): [td.all_text() for td in r.find_all("td")] for r in summary.find_all("tr")}
    assert [c.split()[0] for c in rows["kernels"]] == [str(r.num_kernels) for r in block_reports]
    assert all(c.endswith("predicted") for c in rows["GPU time (kernels)"] + rows["one call (host + GPU)"])


def test_tiny_gpt2_training_step(gpt2_reports):
    html = render_html(gpt2_reports)
    doc = _check_page(gpt2_reports, html)
    for report, section in zip(gpt2_reports, doc.find_all("section", "mode")):
        points = section.find_all("circle", "pt")
        assert len(points) == sum(1 for k in report.kernels if k.bytes > 0)
    assert "model.transformer.h.1.attn.c_attn" in {d.attrs["data-path"] for d in doc.find_all("details", "mod")}


def test_user_strings_stay_text(block_reports):
    html = render_html(block_reports, title=f"title {EVIL}")
    assert EVIL not in html
    doc = Tree(html).root
    assert len(doc.find_all("script")) == 1  # the page's own
    assert doc.find_all("title")[0].all_text() == f"title {EVIL}"
    assert f"net.{EVIL}" in {d.attrs["data-path"] for d in doc.find_all("details", "mod")}
    assert any(f"net.{EVIL}" == s.all_text() for s in doc.find_all("span", "path"))
    assert any(f"net.{EVIL}" == c.all_text() for c in doc.find_all("table", "side")[0].find_all("code"))


def test_predicted_is_labelled(block_reports):
    doc = Tree(render_html(block_reports)).root
    badges = [b.all_text() for b in doc.find_all("span", "badge")]
    assert badges and set(badges) == {"predicted"}
    for table in doc.find_all("table", "kernels"):
        assert "time (predicted)" in table.find_all("tr")[0].all_text()
    lanes = [t.all_text() for t in doc.find_all("svg", "timeline")[0].find_all("text", "muted")]
    assert lanes == ["predicted"] * len(block_reports)


def _line_y(line: Element, x: float) -> float:
    x1, y1, x2, y2 = (float(line.attrs[a]) for a in ("x1", "y1", "x2", "y2"))
    return y1 + (x - x1) / (x2 - x1) * (y2 - y1)


def test_roofline_puts_each_kernel_where_its_numbers_say():
    """Large enough that no kernel sits on the launch floor: a predicted kernel runs at the roof that
    binds it, so its dot is on that roof (memory-bound on the slope, compute-bound on the flat)."""
    from kernelab.hardware import get_profile

    net = _net(1024, 4096)
    r = kernelab.count(net, torch.randn(8192, 1024, device="meta"), predict=True)
    h200 = get_profile("h200")
    svg = Tree(r.to_html()).root.find_all("svg", "roofline")[0]
    points = svg.find_all("circle", "pt")
    assert sorted(p.attrs["data-k"] for p in points) == [f"k0-{i}" for i, k in enumerate(r.kernels) if k.bytes]
    memory_roof = svg.find_all("line", "mem")[0]
    (math_roof,) = svg.find_all("line", "math")
    assert "51 TFLOP/s (float32)" in math_roof.all_text()
    on_roof = 0
    for point in points:
        k = r.kernels[int(point.attrs["data-k"].split("-")[1])]
        if not k.flops or k.time_us <= h200.launch_us:
            continue
        cx, cy = float(point.attrs["cx"]), float(point.attrs["cy"])
        compute = k.category == "matmul" and k.flops / h200.matmul_flops["float32"] > k.bytes / h200.copy_bandwidth
        roof_y = float(math_roof.attrs["y1"]) if compute else _line_y(memory_roof, cx)
        assert cy == pytest.approx(roof_y, abs=0.3), k.name
        on_roof += 1
    assert on_roof >= 4  # three GEMMs (compute-bound) and the pointwise and norm kernels


def _measured_report() -> Report:
    """A hand-built measured report: a GEMM at half the matmul rate, a copy at 80% of bandwidth, a
    memset moving nothing, a kernel the profiler gave no time."""
    bw, peak = 4e12, 5e14
    gemm = Kernel("sm90_xmma_gemm_bf16", "matmul", ["mm"], 4 << 20, 2 << 20, 2e11, time_us=2e11 / (0.5 * peak) * 1e6,
                  measured=True, ceiling_bytes_per_s=bw, ceiling_flops=peak, modules=["model.fc"], source="m.py:3")
    copy = Kernel("void at::native::elementwise_kernel<128, 4>(int, Op)", "copy", ["copy_"], 8 << 20, 8 << 20,
                  time_us=(16 << 20) / (0.8 * bw) * 1e6, measured=True, ceiling_bytes_per_s=bw, modules=["model"])
    memset = Kernel("Memset (Device)", "memset", ["?"], 0, 0, time_us=1.0, measured=True, modules=["model"])
    lost = Kernel("mystery", "other", ["?"], 1024, 1024, time_us=None, measured=True, modules=["model"])
    return Report("eager", "step", True, "NVIDIA H200", [gemm, copy, memset, lost], 8 << 20, 16 << 20,
                  wall_time_us=400.0, module_types={"model": "Net", "model.fc": "Linear"})


def test_measured_report_page_and_roofline_geometry():
    r = _measured_report()
    doc = _check_page([r], r.to_html())
    assert {b.all_text() for b in doc.find_all("span", "badge")} == {"measured"}
    svg = doc.find_all("svg", "roofline")[0]
    points = {p.attrs["data-k"]: p for p in svg.find_all("circle", "pt")}
    assert sorted(points) == ["k0-0", "k0-1"]  # the memset moves no bytes; the lost kernel has no time
    (math_roof,) = svg.find_all("line", "math")
    # half the matmul rate: log10(2) of a decade below the flat roof
    ticks = {t.all_text(): float(t.attrs["y"]) - 4 for t in svg.find_all("text") if t.all_text().endswith("FLOP/s")}
    decade = ticks["100 TFLOP/s"] - ticks["1 PFLOP/s"]
    below_roof = float(points["k0-0"].attrs["cy"]) - float(math_roof.attrs["y1"])
    assert below_roof == pytest.approx(math.log10(2) * decade, abs=0.2)
    # the copy: no FLOPs, in the strip at 80% of the copy ceiling
    strip = [t for t in svg.find_all("text") if t.all_text() in ("0%", "100%")]
    x0, x100 = (float(t.attrs["x"]) for t in strip)
    assert float(points["k0-1"].attrs["cx"]) == pytest.approx(x0 + 0.8 * (x100 - x0), abs=0.2)
    rows = {e.attrs["id"]: e.all_text() for e in doc.find_all("tr") if "id" in e.attrs}
    assert "50% of matmul rate" in rows["k0-0"] and "80% of copy bandwidth" in rows["k0-1"]


def test_timeline_lays_kernels_back_to_back_in_launch_order():
    r = _measured_report()
    svg = Tree(r.to_html()).root.find_all("svg", "timeline")[0]
    rects = svg.find_all("rect", "kr")
    assert [e.attrs["data-k"] for e in rects] == ["k0-0", "k0-1", "k0-2"]  # the kernel without a time is not drawn
    x = [float(e.attrs["x"]) for e in rects]
    w = [float(e.attrs["width"]) for e in rects]
    times = [k.time_us for k in r.kernels[:3]]
    assert [b - a for a, b in zip(x, x[1:])] == pytest.approx(w[:2], abs=0.02)
    assert w[0] / times[0] == pytest.approx(w[1] / times[1], rel=1e-3)
    call = svg.find_all("rect", "call")[0]
    assert float(call.attrs["width"]) / r.wall_time_us == pytest.approx(w[0] / times[0], rel=1e-3)
    assert "400 µs measured" in call.all_text()


def _check_trace(trace: dict, reports) -> None:
    assert json.loads(json.dumps(trace)) == trace
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert all(e["ph"] in ("X", "M") for e in events)
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= set(e)
    for e in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "cat", "args"} <= set(e) and e["dur"] > 0
    lanes = {}
    for e in complete:
        lanes.setdefault((e["pid"], e["tid"]), []).append(e)
    for lane in lanes.values():
        assert all(b["ts"] == pytest.approx(a["ts"] + a["dur"]) for a, b in zip(lane, lane[1:]) if a["tid"] == 2)
        assert all(b["ts"] >= a["ts"] for a, b in zip(lane, lane[1:]))
    for pid, report in enumerate(reports, start=1):
        kernels = [e for e in lanes[(pid, 2)]]
        timed = [k for k in report.kernels if k.time_us is not None]
        assert [e["args"]["name"] for e in kernels] == [k.name for k in timed]
        assert [(e["cat"], e["args"]["bytes_read"], e["args"]["bytes_written"], e["args"]["flops"]) for e in kernels] \
            == [(k.category, k.bytes_read, k.bytes_written, k.flops) for k in timed]
        assert [e["args"]["module"] for e in kernels] == [k.module or report.target for k in timed]
        assert {e["args"]["time"] for e in kernels} == {"measured" if report.measured else "predicted"}
        names = {e["args"].get("name") for e in events if e["ph"] == "M" and e["pid"] == pid}
        assert f"kernelab {report.mode} ({'measured' if report.measured else 'predicted'}): {report.target}" in names
        (call,) = lanes[(pid, 1)]
        assert call["dur"] == report.wall_time_us


def test_chrome_trace_of_every_mode(block_reports):
    trace = to_chrome_trace(block_reports)
    _check_trace(trace, block_reports)
    assert [r["mode"] for r in trace["otherData"]["reports"]] == ["eager", "inductor", "kernelab"]


def test_chrome_trace_of_a_measured_report():
    r = _measured_report()
    trace = r.to_trace()
    _check_trace(trace, [r])
    assert trace["otherData"]["reports"][0]["kernels_without_time"] == 1
    gemm = trace["traceEvents"][5]
    assert gemm["args"]["source"] == "m.py:3" and gemm["args"]["bound"] == "compute"
    assert gemm["args"]["pct_of_ceiling"] == pytest.approx(50.0)


def test_report_methods_render_the_same(block_reports):
    r = block_reports[0]
    assert r.to_html(title="x") == render_html(r, title="x") == render_html([r], title="x")
    assert r.to_trace() == to_chrome_trace([r])
    with pytest.raises(TypeError, match="expected a Report"):
        render_html([])


NET_FILE = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 512)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))

def example_inputs():
    return (torch.randn(1000, 256),)
"""


@pytest.fixture
def net_file(tmp_path):
    (tmp_path / "net.py").write_text(NET_FILE)
    return tmp_path / "net.py"


def test_cli_writes_html_and_trace(net_file, tmp_path, capsys):
    html, trace = tmp_path / "r.html", tmp_path / "r.trace.json"
    code = main(["count", f"{net_file}:Net", "--mode", "eager", "--mode", "inductor", "--predict", "--html", str(html),
                 "--trace", str(trace)])
    assert code == 0
    doc = Tree(html.read_text(encoding="utf-8")).root
    sections = doc.find_all("section", "mode")
    assert [s.find_all("h2")[0].all_text().split()[0] for s in sections] == ["eager", "inductor"]
    assert [{d.attrs["data-path"] for d in s.find_all("details", "mod")} for s in sections] == [{"", "fc", "act"}] * 2
    assert [len(s.find_all("circle", "pt")) for s in sections] == [2, 2]  # the GEMM, then relu (its own kernel)
    assert f"kernelab count {net_file}:Net" == doc.find_all("h1")[0].all_text()
    data = json.loads(trace.read_text())
    assert [r["mode"] for r in data["otherData"]["reports"]] == ["eager", "inductor"]
    kernels = [(e["pid"], e["cat"], e["args"]["module"]) for e in data["traceEvents"]
               if e["ph"] == "X" and e["tid"] == 2]
    assert kernels == [(1, "matmul", "fc"), (1, "pointwise", "act"), (2, "matmul", "fc"), (2, "pointwise", "act")]


@pytest.mark.parametrize("option, where, message", [
    ("--html", "missing/r.html", "cannot write --html {p}: No such file or directory"),
    ("--trace", ".", "cannot write --trace {p}: it is a directory"),
])
def test_cli_unwritable_path_is_one_line_and_exit_2(net_file, tmp_path, capsys, option, where, message):
    path = tmp_path / where
    assert main(["count", f"{net_file}:Net", "--predict", option, str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == "kernelab: error: " + message.format(p=path)
    assert captured.out == ""  # refused before counting


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
def test_chromium_renders_the_report(gpt2_reports, tmp_path):
    """The page in a real browser: its script runs to the end, the DOM keeps every chart mark, and a
    screenshot is a picture (many colors), not a blank page."""
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(render_html(gpt2_reports), encoding="utf-8")
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--window-size=1280,2400"]
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    doc = Tree(dom.stdout).root
    html_tag = doc.find_all("html")[0]
    assert html_tag.attrs.get("data-ready") == "1"  # the page's script ran without an error
    assert [len(s.find_all("circle", "pt")) for s in doc.find_all("section", "mode")] == \
        [sum(1 for k in r.kernels if k.bytes > 0) for r in gpt2_reports]
    shot = tmp_path / "report.png"
    run = subprocess.run(flags + [f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2400)
    colors = image.getcolors(maxcolors=1 << 20)
    assert len(colors) > 200  # text, badges, bars and dots: not a blank or error page
