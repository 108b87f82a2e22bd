#!/usr/bin/env python
"""The pages' figures of the demo, made again from one run of it (``make docs-figures``):
the demo's own figure (``docs/figures/demo.png``, on the landing page) and VisualDL's
scalar page for the same run, photographed by headless Chromium
(``docs/figures/visualdl.png``, on the monitoring page).

    python tools/docs_figures.py

Each figure carries, as a PNG text field, the summary lines the run printed: the pages'
test compares them with the README's, so a figure from another demo than the one the
README quotes fails the suite. Needs VisualDL (the ``integrations`` extra) and a Chromium
(``apt-get install chromium``).
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from PIL import Image, PngImagePlugin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "docs", "figures")
DEMO_FIGURE = os.path.join(FIGURES, "demo.png")
VISUALDL_FIGURE = os.path.join(FIGURES, "visualdl.png")
# The PNG text field that holds the run's summary; tests/test_docs.py reads it.
SUMMARY_FIELD = "demo summary"
POLICY_LINES = ("interval:", "headroom:")
# Two rows of charts on a laptop-sized page: the loss, the scale, the skips, the streak.
WINDOW = "1280,880"


def summary(output: str) -> str:
    """The lines of the demo's output that describe the run: one per policy."""
    return "\n".join(line for line in output.splitlines() if line.startswith(POLICY_LINES))


def stamp(figure: str, text: str) -> None:
    """Write ``text`` into ``figure``'s PNG text field, the pixels unchanged."""
    with Image.open(figure) as image:
        image.load()
    info = PngImagePlugin.PngInfo()
    info.add_text(SUMMARY_FIELD, text)
    image.save(figure, pnginfo=info)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_served(url: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium on PATH: apt-get install chromium")
    with tempfile.TemporaryDirectory() as folder:
        demo = subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "examples", "train_digits.py"),
                "--no-progress",
                "--plot",
                DEMO_FIGURE,
                "--visualdl-dir",
                os.path.join(folder, "vdl_digits"),
            ],
            check=True,
            cwd=folder,
            stdout=subprocess.PIPE,
            text=True,
        )
        port = free_port()
        visualdl = shutil.which("visualdl", path=os.path.dirname(sys.executable))
        # --language: without it VisualDL 2.5 fails its pages for a client that names none.
        server = subprocess.Popen(
            [
                visualdl or "visualdl",
                "--logdir",
                "vdl_digits",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--language",
                "en",
            ],
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            page = f"http://127.0.0.1:{port}/app/scalar"
            wait_until_served(page)
            subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    f"--window-size={WINDOW}",
                    "--virtual-time-budget=15000",
                    f"--screenshot={VISUALDL_FIGURE}",
                    page,
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=180,
            )
        finally:
            server.terminate()
            server.wait()
    for figure in (DEMO_FIGURE, VISUALDL_FIGURE):
        stamp(figure, summary(demo.stdout))
        print(f"wrote {os.path.relpath(figure, ROOT)}")
    print(summary(demo.stdout))


if __name__ == "__main__":
    main()
