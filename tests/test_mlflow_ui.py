"""What a person sees in the MLflow UI after a sweep. `mlflow ui` serves the store of a real
two-job multirun (ATIS, debug=smoke, model.n_heads=2,4); Debian's headless `chromium`, driven over
the DevTools protocol, opens the experiment's run table and the compare view and does what a
person does there: expand the sweep, add the main metric and the swept setting as columns, show
the parameters that differ. What is checked is what is on the screen: the texts on the line of a
run's name or of a row's label, under a column's header. UPDATE_SCREENSHOTS=1 writes the two
screenshots the README shows to docs/images/; otherwise they go to tmp_path."""

import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, free_port, run, sweep_runs, wait_until_up

NO_CHROMIUM = "no chromium on PATH (apt-get install chromium): the UI is not looked at"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("chromium") is None, reason=NO_CHROMIUM)]

SWEPT, METRIC = "model.n_heads", "val/slot_f1"  # ATIS's optimized_metric
TRAINING = "workflowType=machine_learning"  # the UI's "Model training" side, not its GenAI one

# The texts a person can see, with their place: a text node counts if its beginning is what the
# window shows at that point (not scrolled out of its table, not under another element); with
# `everywhere`, every text laid out.
TEXTS = """(everywhere => {
  const out = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node; (node = walker.nextNode());) {
    const text = node.textContent.trim();
    if (!text) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const r = range.getBoundingClientRect();
    if (r.width < 2 || r.height < 2) continue;
    const hit = document.elementFromPoint(r.left + Math.min(r.width / 2, 4), r.top + r.height / 2);
    const seen = hit && (hit.contains(node) || node.parentElement.contains(hit));
    if (everywhere ? r.left >= 0 && r.right <= innerWidth : seen)
      out.push({text, x: r.left, y: r.top + r.height / 2, h: r.height});
  }
  return out;
})"""


class Tab:
    """One chromium tab over the DevTools protocol (aiohttp's websocket client: an MLflow dependency)."""

    def __init__(self, ws):
        self.ws, self.calls = ws, 0

    async def call(self, method: str, **params):
        self.calls += 1
        await self.ws.send_json({"id": self.calls, "method": method, "params": params})
        while True:  # events (none asked for) and late answers are skipped
            message = await asyncio.wait_for(self.ws.receive_json(), timeout=60)
            if message.get("id") == self.calls:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    async def js(self, expression: str):
        answer = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression[:200]}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def open(self, url: str, *texts: str, width: int, height: int):
        """Opens `url` in a window of that size; the page's text once `texts` are all in it."""
        self.width = width
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                        mobile=False)
        await self.call("Page.navigate", url=url)
        return await self.wait_for(*texts)

    async def wait_for(self, *texts: str, timeout: float = 60) -> str:
        """The page's text once every one of `texts` is in it (the UI fills itself in from API calls)."""
        deadline = time.monotonic() + timeout
        while True:
            shown = await self.js("document.body ? document.body.innerText : ''") or ""
            if all(text in shown for text in texts):
                await asyncio.sleep(0.5)  # what arrived with them is laid out
                return shown
            if time.monotonic() > deadline:
                raise TimeoutError(f"not on the page after {timeout} s: {[t for t in texts if t not in shown]}\n"
                                   f"{shown[-3000:]}")
            await asyncio.sleep(0.25)

    async def texts(self, everywhere: bool = False) -> list[dict]:
        return await self.js(f"{TEXTS}({json.dumps(everywhere)})")

    async def line(self, label: str, length: int, everywhere: bool = False, timeout: float = 30) -> list[dict]:
        """The visible texts on the line of the one visible `label`, from it rightwards, once there
        are `length` of them (a table draws its cells after its labels); `everywhere`: seen or not."""
        deadline = time.monotonic() + timeout
        while True:
            texts = await self.texts(everywhere)
            anchors = [t for t in texts if t["text"] == label]
            assert len(anchors) == 1, f"{label!r} is on the screen {len(anchors)} times"
            [a] = anchors
            line = sorted((t for t in texts if abs(t["y"] - a["y"]) < a["h"] / 2 and t["x"] >= a["x"] - 1),
                          key=lambda t: t["x"])
            if len(line) >= length:
                return line
            assert time.monotonic() < deadline, f"the line of {label!r}: {[t['text'] for t in line]}"
            await asyncio.sleep(0.25)

    async def click(self, css: str, text: str | None = None, nth: int = -1, must: bool = True) -> None:
        """Clicks the (last) element matching `css` with exactly that text, if given."""
        done = await self.js(f"""(() => {{
            const found = Array.from(document.querySelectorAll({json.dumps(css)}))
                .filter(e => {json.dumps(text)} === null || e.textContent.trim() === {json.dumps(text)});
            const e = found.at({nth});
            if (!e) return false;
            e.scrollIntoView({{block: 'center'}}); e.click(); return true; }})()""")
        assert done or not must, f"nothing to click: {css} {text!r}"
        await asyncio.sleep(0.3)

    async def click_beside(self, label: str, css: str = "button") -> None:
        """Clicks the `css` element nearest to the left of `label` on its line (a row's expander)."""
        [a] = [t for t in await self.texts() if t["text"] == label]
        done = await self.js(f"""(() => {{
            const near = Array.from(document.querySelectorAll({json.dumps(css)}))
                .map(e => [e, e.getBoundingClientRect()])
                .filter(([e, r]) => r.width > 0 && Math.abs(r.top + r.height / 2 - {a['y']}) < {a['h']}
                                    && r.right <= {a['x']} + 1)
                .sort((p, q) => q[1].right - p[1].right);
            if (!near.length) return false;
            near[0][0].click(); return true; }})()""")
        assert done, f"no {css} left of {label!r}"
        await asyncio.sleep(0.3)

    async def type(self, css: str, text: str) -> None:
        await self.js(f"(() => {{ const e = document.querySelector({json.dumps(css)}); e.focus(); e.select(); }})()")
        await self.call("Input.insertText", text=text)
        await asyncio.sleep(0.5)

    async def key(self, name: str, code: int) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=name, code=name, windowsVirtualKeyCode=code)
        await asyncio.sleep(0.3)

    async def drag(self, css: str, dx: float) -> None:
        """Drags the (first) element matching `css` sideways by its left edge: a column header's
        resize handle, whose right half the next header covers."""
        box = await self.js(f"(() => {{ const r = document.querySelector({json.dumps(css)}).getBoundingClientRect();"
                            f" return [r.left + 1, r.top + r.height / 2]; }})()")
        x, y = box
        await self.call("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y, button="left", clickCount=1)
        for step in range(1, 11):
            await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x + dx * step / 10, y=y, button="left",
                            buttons=1)
        await self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x + dx, y=y, button="left", clickCount=1)
        await asyncio.sleep(0.3)

    async def screenshot(self, path: Path, left_of: str, down_to: str) -> None:
        """The page from its top down to the bottom of the last `down_to` element, from the left edge
        of the first `left_of` (the sidebar left out) to the window's right edge."""
        left, bottom = await self.js(f"""(() => {{
            const boxes = css => Array.from(document.querySelectorAll(css)).map(e => e.getBoundingClientRect())
                .filter(r => r.height > 0);
            return [boxes({json.dumps(left_of)})[0].left, Math.max(...boxes({json.dumps(down_to)}).map(r => r.bottom))];
        }})()""")
        left = max(0, left - 16)
        shot = await self.call("Page.captureScreenshot", format="png",
                               clip={"x": left, "y": 0, "width": self.width - left, "height": bottom + 16, "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.contextmanager
def headless_chromium(profile: Path):
    """A headless chromium on a fresh profile; the DevTools websocket of its one tab."""
    browser = subprocess.Popen(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, listening = time.monotonic() + 60, profile / "DevToolsActivePort"  # its port, once it listens
        while not listening.is_file() or len(listening.read_text().split()) < 2:
            assert browser.poll() is None and time.monotonic() < deadline, "chromium did not start"
            time.sleep(0.2)
        port = listening.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            [page] = [t for t in json.load(response) if t["type"] == "page"]
        yield page["webSocketDebuggerUrl"]
    finally:
        browser.terminate()
        browser.wait(timeout=30)


async def in_tab(websocket: str, look):
    """`look(tab)` on the tab behind that DevTools websocket; its answer."""
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(websocket, max_msg_size=0) as ws:
        return await look(Tab(ws))


@pytest.fixture
def mlflow_ui(tmp_path):
    """`mlflow ui` (what `make ui` runs, with one worker, not four) on a store of its own; the URL and the store."""
    port, store = free_port(), f"sqlite:///{tmp_path}/mlflow.db"
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "ui.log", "w") as log:
        ui = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", store,
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until_up(url, tmp_path / "ui.log")  # and the store's tables made, before anything writes to it
            yield url, store
        finally:
            ui.terminate()
            ui.wait(timeout=30)


def shown(value: float) -> float:
    return pytest.approx(value, rel=1e-3, abs=1e-3)  # the UI rounds what it shows


def under(header: list[dict], row: list[dict], column: str) -> list[str]:
    """A table row's texts in `column`: from its header's left edge to the next header's."""
    [start] = [h["x"] for h in header if h["text"] == column]
    end = min([h["x"] for h in header if h["x"] > start + 1], default=float("inf"))
    return [t["text"] for t in row if start - 8 <= t["x"] < end - 8]


async def look(tab: Tab, url: str, parent, jobs, shots: Path) -> dict:
    """What a person sees of a sweep (its parent run and jobs) in the run table and the compare view."""
    experiment = parent.info.experiment_id
    names = sorted(r.info.run_name for r in jobs)
    by_name = {r.info.run_name: r for r in jobs}
    seen = {}
    # the run table: the sweep's parent run, expanded to its jobs; the main metric and the
    # swept setting added as columns (Columns, search, tick)
    await tab.open(f"{url}/#/experiments/{experiment}/runs?{TRAINING}", parent.info.run_name, width=1500, height=900)
    await tab.click("[data-component-id='mlflow.assistant.chat_panel.close']", must=False)  # on a first visit
    await tab.click("button[aria-label='Toggle sidebar']")  # room for the table (the screenshot leaves it out)
    await tab.click_beside(parent.info.run_name)
    await tab.wait_for(*names)
    for column in (METRIC, SWEPT):
        await tab.click("button", "Columns")
        await tab.type("input[placeholder='Search columns']", column)
        await tab.click("label, span", column)
        await tab.key("Escape", 27)
    await tab.drag(".ag-header-cell[col-id*='Run Name'] .ag-header-cell-resize", 140)  # names in full
    await tab.drag(".ag-header-cell[col-id*='Dataset'] .ag-header-cell-resize", -150)  # its name, not its digest
    seen["table header"] = header = await tab.line("Run Name", 8)
    seen["table rows"] = {name: await tab.line(name, len(header)) for name in names}
    await tab.screenshot(shots / "mlflow_run_table.png", left_of=".ag-root-wrapper", down_to=".ag-row")

    # the compare view of the two jobs (what ticking them and "Compare" opens), the parameters
    # that differ only
    query = urllib.parse.urlencode({"runs": json.dumps([by_name[n].info.run_id for n in names]),
                                    "experiments": json.dumps([experiment])})
    await tab.open(f"{url}/#/compare-runs?{query}&{TRAINING}", *names, "Show diff only", width=1200, height=1400)
    await tab.click("[data-component-id='mlflow.assistant.chat_panel.close']", must=False)
    await tab.click("*", "Visualizations", nth=-1)  # folded: the tables come up to the top
    await tab.click("[role=switch][aria-label='Parameters - Show diff only']")
    for label in ("Run Name:", SWEPT):
        seen[label] = [t["text"] for t in await tab.line(label, 1 + len(jobs))]
    texts = await tab.texts()
    [top], [bottom] = ([t["y"] for t in texts if t["text"] == section] for section in ("Parameters", "Metrics"))
    [labels] = [t["x"] for t in texts if t["text"] == SWEPT]
    seen["parameters that differ"] = [t["text"] for t in texts if top < t["y"] < bottom and abs(t["x"] - labels) < 2]
    # the metrics table is a box of its own, 300 px high: the main metric is further down it, and
    # its labels do not follow a wheel turned over its values here (MLflow 3.17), so it is read
    # where it is laid out
    seen[METRIC] = [t["text"] for t in await tab.line(METRIC, 1 + len(jobs), everywhere=True)]
    await tab.screenshot(shots / "mlflow_compare.png", left_of="h2", down_to=".ReactVirtualized__Grid")  # the metrics
    return seen


def test_the_run_table_and_the_compare_view_show_a_sweep_at_a_glance(mlflow_ui, prepared_atis, tmp_path):
    url, store = mlflow_ui
    sweep = run([PYTHON, ROOT / "pipelines" / "train.py", "-m", f"{SWEPT}=2,4", "debug=smoke",
                 f"data.prepared_dir={prepared_atis}", f"hydra.sweep.dir={tmp_path / 'sweeps' / 'heads'}"],
                env={"MLFLOW_TRACKING_URI": store})
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    parent, jobs = sweep_runs(store, "atis")
    names = sorted(r.info.run_name for r in jobs)
    by_name = {r.info.run_name: r for r in jobs}
    assert {r.data.params[SWEPT] for r in jobs} == {"2", "4"}
    shots = ROOT / "docs" / "images" if os.environ.get("UPDATE_SCREENSHOTS") else tmp_path

    with headless_chromium(tmp_path / "chromium") as websocket:
        seen = asyncio.run(in_tab(websocket, lambda tab: look(tab, url, parent, jobs, shots)))

    # the run table: each job by its name (the task and its overrides), its main metric and its
    # swept setting in the columns added
    header = seen["table header"]
    assert {METRIC, SWEPT} <= {h["text"] for h in header}, header
    for name in names:
        job = by_name[name]
        assert f"{SWEPT}={job.data.params[SWEPT]}" in name
        row = seen["table rows"][name]
        assert under(header, row, SWEPT) == [job.data.params[SWEPT]], row
        [metric] = under(header, row, METRIC)
        assert float(metric) == shown(job.data.metrics[METRIC]), row

    # the compare view: one column per job, headed by its name; the swept setting among the
    # parameters that differ, the main metric among the metrics
    columns = seen["Run Name:"][1:]
    assert sorted(columns) == names, seen["Run Name:"]
    assert seen[SWEPT][1:] == [by_name[n].data.params[SWEPT] for n in columns]
    assert seen["parameters that differ"] == [SWEPT]  # not the jobs' output folders
    assert [float(v) for v in seen[METRIC][1:]] == [shown(by_name[n].data.metrics[METRIC]) for n in columns]
