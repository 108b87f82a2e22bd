#!/usr/bin/env python
"""The monitoring page's VisualDL figure, made again: the demo's run (``make demo``) into a
temporary log, VisualDL serving it, and headless Chromium photographing the scalar page.

    python tools/visualdl_screenshot.py [docs/figures/visualdl.png]

Needs VisualDL (the ``integrations`` extra) and a Chromium (``apt-get install chromium``).
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURE = os.path.join(ROOT, "docs", "figures", "visualdl.png")
# Two rows of charts on a laptop-sized page: the loss, the scale, the skips, the streak.
WINDOW = "1280,880"


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
    figure = sys.argv[1] if len(sys.argv) > 1 else FIGURE
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium on PATH: apt-get install chromium")
    with tempfile.TemporaryDirectory() as folder:
        logs = os.path.join(folder, "vdl_digits")
        subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "examples", "train_digits.py"),
                "--no-progress",
                "--plot",
                "",
                "--visualdl-dir",
                logs,
            ],
            check=True,
            cwd=folder,
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
                    f"--screenshot={os.path.abspath(figure)}",
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
    print(f"wrote {figure}")


if __name__ == "__main__":
    main()
