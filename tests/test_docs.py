"""The documentation tells the truth: its worked trace of the update rule is what the
scaler does, its code runs as pasted, and the outputs it shows are what the code prints."""

import math
import os
import re
import subprocess
import sys
import textwrap

import paddle
import pytest

from paddle_amp_scaler import GradScaler

from helpers import GradInjector, batches, make_model, tool, train_step

CONCEPTS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "concepts.md"
)
ROW = re.compile(r"^\| (\d+) \| (finite|inf|nan) \| (\d+) \| (\d+) \| (\d+) \| (yes|skipped)")


def test_worked_trace_in_concepts_matches_the_scaler():
    with open(CONCEPTS, encoding="utf-8") as page:
        rows = [ROW.match(line).groups() for line in page if ROW.match(line)]
    assert len(rows) >= 5
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    injector = GradInjector(model[0].weight)
    scaler = GradScaler(init_loss_scaling=1024, incr_every_n_steps=3, decr_every_n_nan_or_inf=2)
    data = batches(steps=len(rows))
    for (step, gradients, incr, decr, scale, taken), batch in zip(rows, data):
        inject = {"finite": None, "inf": math.inf, "nan": math.nan}[gradients]
        train_step(scaler, model, optimizer, batch, injector=injector, inject=inject)
        assert (
            scaler.get_incr_count(),
            scaler.get_decr_count(),
            scaler.get_loss_scaling(),
            bool(scaler._cache_found_inf),
        ) == (int(incr), int(decr), float(scale), taken == "skipped"), f"row {step}"


# -- every Python block of the README and the docs runs as pasted, or says where it is from

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.join("docs", name)
    for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md")
)
BLOCK = re.compile(r"^(?P<indent> *)```python\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
# A fragment says so on its first line, where a reader sees it, and names the example
# that runs it whole.
FRAGMENT = re.compile(r"^# (?:Fragment\b|\w+, for comparison\b).*?\b(examples/\w+\.py)")


def python_blocks():
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as source:
            text = source.read()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            code = textwrap.dedent(match["body"])
            yield pytest.param(code, id=f"{page}:{line}")


@pytest.mark.parametrize("code", list(python_blocks()))
def test_a_block_runs_as_pasted_or_is_a_marked_fragment(code, tmp_path):
    fragment = FRAGMENT.match(code)
    if fragment:
        assert os.path.isfile(os.path.join(ROOT, fragment[1])), fragment[1]
        return
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    # This checkout's package, not whatever copy is installed, as the examples' tests do.
    environment["PYTHONPATH"] = ROOT
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Paddle 3 warns on import that ccache is missing; a page's code imports this package
    # first, which keeps that note off a newcomer's first run.
    assert "No ccache found" not in result.stderr, result.stderr[-3000:]


def test_the_outputs_the_pages_show_are_what_the_code_prints():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "docs_outputs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("figure", ["demo.png", "visualdl.png"])
def test_a_figure_of_the_demo_shows_the_run_the_readme_quotes(figure):
    pytest.importorskip("PIL")
    figures, outputs = tool("docs_figures"), tool("docs_outputs")
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as page:
        blocks = [
            match["body"]
            for match in outputs.MARKED.finditer(page.read())
            if match["command"] == "python examples/train_digits.py"
        ]
    assert len(blocks) == 1, "the README quotes the demo's output once, in a marked block"
    quoted = figures.summary(blocks[0])
    assert quoted.count("\n") == 1, quoted  # a line per policy
    with figures.Image.open(os.path.join(figures.FIGURES, figure)) as image:
        shown = image.text.get(figures.SUMMARY_FIELD)
    assert shown == quoted, (
        f"docs/figures/{figure} shows another run of the demo than the README's: run "
        "`make docs-figures`, then read the words beside the figures again (docs/index.md, "
        "docs/monitoring.md)"
    )


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES)
def test_every_link_resolves_in_the_repository_or_is_a_public_url(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as source:
        links = LINK.findall(source.read())
    folder = os.path.dirname(os.path.join(ROOT, page))
    for link in links:
        if link.startswith(("https://", "http://", "#")):
            continue
        target = os.path.normpath(os.path.join(folder, link.split("#")[0]))
        assert target.startswith(ROOT + os.sep), (page, link)
        assert os.path.exists(target), (page, link)
