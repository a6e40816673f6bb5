"""Open pages in Debian's headless Chromium and record what they did, with the standard library only.

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: commands on
fd 3, replies on fd 4, one JSON message per NUL-terminated chunk), so no port is opened and no
Python browser package is needed. For each page we keep:

- every request the page made (`Network.requestWillBeSent`, `Network.webSocketCreated`);
- every console message, uncaught exception and browser log entry (CSP violations land there);
- every JavaScript dialog (`alert()` and friends), dismissed at once so the page can't hang;
- the DOM after the scripts ran, values of expressions evaluated in the page, a screenshot.

Besides, the browser writes a net-log (`--log-net-log`), read when it closes: every URL request
made by any part of the browser. Chromium's own services ask Google hosts even with the
background-networking switches (the Optimization Guide model manifest through the component
updater, and `ListAccounts` of the sign-in service, which can't be switched off); they are
told apart from the page's requests by their initiator ("not an origin"), and
`--host-resolver-rules` makes sure nothing actually leaves the machine.

Run as a script to take the README's screenshot of a report:

    python tests/browser.py report/report.html docs/report-torch_leak_v25-1400.png 1400 900
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-features=NetworkTimeServiceQuerying,OptimizationGuideModelDownloading,OptimizationHints",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # whatever asks, no name resolves: nothing leaves
    "--hide-scrollbars", "--mute-audio",
]
LOCAL_SCHEMES = ("file:", "data:", "about:")
TIMEOUT_S = 60.0


def find_chromium() -> Optional[str]:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Page:
    """What one page load did."""

    url: str
    dom: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    screenshot: bytes = b""
    pdf: bytes = b""  # the page printed (A4), when asked for
    requests: list[str] = field(default_factory=list)
    console: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    dialogs: list[str] = field(default_factory=list)

    @property
    def remote_requests(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(LOCAL_SCHEMES)]

    @property
    def errors(self) -> list[str]:
        return [text for level, text in self.console if level in ("error", "warning", "assert", "exception")]


class Chromium:
    """One headless Chromium with a fresh profile; `load()` pages, then `close()` (or use `with`)."""

    def __init__(self, executable: Optional[str] = None, workdir: Optional[Path] = None) -> None:
        executable = executable or find_chromium()
        if not executable:
            raise FileNotFoundError("chromium is not installed")
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="nsysan-chromium-"))
        self.netlog_path = self.workdir / "netlog.json"
        profile = self.workdir / "profile"
        profile.mkdir(parents=True, exist_ok=True)
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipes() -> None:  # in the child: our pipe ends become its fds 3 and 4
            read_end, write_end = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.stderr_path = self.workdir / "stderr.txt"
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                [executable, *FLAGS, f"--user-data-dir={profile}", f"--log-net-log={self.netlog_path}",
                 "--remote-debugging-pipe", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                pass_fds=(3, 4), preexec_fn=wire_pipes)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict] = []

    # -- protocol ----------------------------------------------------------------------------

    def _send(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer in time; its stderr is in {self.stderr_path}")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise ConnectionError(f"chromium closed the pipe; its stderr is in {self.stderr_path}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if message.get("method") == "Page.javascriptDialogOpening":
            # Record and dismiss at once: an open alert() blocks the page and every later command.
            self._send("Page.handleJavaScriptDialog", {"accept": False}, message.get("sessionId"))
        return message

    def call(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> dict:
        """Send a command and return its result, keeping the events that arrive meanwhile."""
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            message = self._receive(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self._events.append(message)

    def _wait_for(self, method: str, session: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not any(e["method"] == method and e.get("sessionId") == session for e in self._events):
            message = self._receive(deadline)
            if "method" in message:
                self._events.append(message)

    # -- pages -------------------------------------------------------------------------------

    def load(self, path: Path, width: int = 1400, height: int = 2000, evaluate: Optional[dict[str, str]] = None,
             screenshot: bool = True, settle_s: float = 0.3, pdf: bool = False, javascript: bool = True) -> Page:
        """Open a local file in a new tab, wait for its load event, and record what happened.

        `evaluate` maps names to JavaScript expressions run after the load (values by value), in
        order, before the screenshot; `pdf` prints the page to A4 (as the print dialog would);
        `javascript` False opens it as a browser with JavaScript switched off would (`evaluate`
        still runs: it comes from the debugger, not the page).
        """
        url = Path(path).resolve().as_uri()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        if not javascript:
            self.call("Emulation.setScriptExecutionDisabled", {"value": True}, session)
        self._events = [e for e in self._events if e.get("sessionId") != session]
        self.call("Page.navigate", {"url": url}, session)
        self._wait_for("Page.loadEventFired", session)
        time.sleep(settle_s)  # let late console messages and dialogs arrive
        page = Page(url=url)
        for name, expression in (evaluate or {}).items():
            page.values[name] = self._evaluate(expression, session)
        page.dom = self._evaluate("document.documentElement.outerHTML", session)
        if screenshot:
            page.screenshot = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, session)["data"])
        if pdf:
            page.pdf = base64.b64decode(self.call("Page.printToPDF", {"paperWidth": 8.27, "paperHeight": 11.69,
                                                                      "preferCSSPageSize": True}, session)["data"])
        self.call("Runtime.evaluate", {"expression": "0"}, session)  # flush events sent before now
        self._collect(page, session)
        self.call("Target.closeTarget", {"targetId": target})
        return page

    def _evaluate(self, expression: str, session: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def _collect(self, page: Page, session: str) -> None:
        for event in self._events:
            if event.get("sessionId") != session:
                continue
            method, params = event["method"], event.get("params", {})
            if method == "Network.requestWillBeSent":
                page.requests.append(params["request"]["url"])
            elif method == "Network.webSocketCreated":
                page.requests.append(params["url"])
            elif method == "Runtime.consoleAPICalled":
                text = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", []))
                page.console.append((params.get("type", "log"), text))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                page.console.append(("exception", details.get("exception", {}).get("description")
                                     or details.get("text", "")))
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                page.console.append((entry.get("level", "info"), entry.get("text", "")))
            elif method == "Page.javascriptDialogOpening":
                page.dialogs.append(f"{params.get('type')}: {params.get('message')}")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self._send("Browser.close")
                self.process.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- after close ---------------------------------------------------------------------------

    def netlog_requests(self) -> list[tuple[str, str]]:
        """(url, initiator) of every URL request in the net-log (read after close())."""
        log = json.loads(self.netlog_path.read_text())
        start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
        return [(e["params"]["url"], str(e["params"].get("initiator")))
                for e in log["events"] if e["type"] == start_job and "url" in e.get("params", {})]

    def page_netlog_requests(self) -> list[str]:
        """URLs of requests pages made (not the browser's own services) to anything but file:/data:."""
        return [url for url, initiator in self.netlog_requests()
                if initiator != "not an origin" and not url.startswith(LOCAL_SCHEMES)]


def open_page(path: Path, **options: Any) -> tuple[Page, list[str]]:
    """Load one page in a fresh browser; return it and the net-log's page requests off the machine.

    The browser's profile and net-log live in a temporary folder, removed once the log is read.
    """
    with tempfile.TemporaryDirectory(prefix="nsysan-chromium-", ignore_cleanup_errors=True) as workdir:
        with Chromium(workdir=Path(workdir)) as browser:
            page = browser.load(path, **options)
        return page, browser.page_netlog_requests()


def _main(argv: list[str]) -> None:
    """python tests/browser.py PAGE.html OUT.png [WIDTH HEIGHT]: a screenshot, palette-reduced for git."""
    from PIL import Image

    page_path, out = Path(argv[0]), Path(argv[1])
    width, height = (int(argv[2]), int(argv[3])) if len(argv) > 3 else (1200, 1500)
    page, remote = open_page(page_path, width=width, height=height)
    assert not page.remote_requests and not remote and not page.errors, (page.remote_requests, remote, page.errors)
    image = Image.open(__import__("io").BytesIO(page.screenshot)).convert("RGB")
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    print(f"{out}: {image.size[0]}x{image.size[1]}, {out.stat().st_size} bytes")


if __name__ == "__main__":
    _main(sys.argv[1:])
