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


# Plain: as this machine prints them. Nudged: as another processor would, whose kernels
# round differently (tools/nudged/ starts every parameter one float step off); the drifts
# the pages allow must cover that, or a new user's `make test` fails where CI passed.
# (`make docs-drift` measures the nudge down too: it moves the numbers as far.)
@pytest.mark.parametrize("nudged", [[], ["--nudged", "up"]], ids=["plain", "nudged"])
def test_the_outputs_the_pages_show_are_what_the_code_prints(nudged):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "docs_outputs.py"), "--check", *nudged],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def marked_blocks():
    outputs = tool("docs_outputs")
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as source:
            yield from outputs.MARKED.finditer(source.read())


def test_the_check_fails_on_a_page_edited_to_show_a_wrong_number_or_label():
    outputs = tool("docs_outputs")
    (block,) = [b for b in marked_blocks() if b["command"] == "python examples/losing_gradients.py"]
    shown, allowed = block["body"].strip(), outputs.drifts(block["drifts"])
    assert {"loss", "subnormal_fraction", "scale"} <= set(allowed)
    assert outputs.agree(shown, shown, allowed)

    def edited(old, new):
        assert old in shown, old
        return shown.replace(old, new, 1)

    # Within the drifts: the page still says what the run says.
    loss = re.search(r"loss (\d\.\d+)", shown)[1]
    assert outputs.agree(shown, edited(f"loss {loss}", f"loss {float(loss) * 1.05:.4f}"), allowed)
    # A label, a line, a number held to the digit, a drifting number beyond its drift.
    assert not outputs.agree(shown, edited("headroom_bits", "headroom bits"), allowed)
    assert not outputs.agree(shown, shown + "\n  one more line", allowed)
    assert not outputs.agree(shown, edited("skipped 0 steps", "skipped 1 steps"), allowed)
    assert not outputs.agree(shown, edited("step  400", "step  401"), allowed)
    assert not outputs.agree(
        shown, edited(f"loss {loss}", f"loss {float(loss) * 1.5:.4f}"), allowed
    )
    fraction = re.search(r"subnormal_fraction (\S+)", shown)[1]
    tenfold = f"subnormal_fraction {float(fraction) * 10:.2e}"
    assert not outputs.agree(shown, edited(f"subnormal_fraction {fraction}", tenfold), allowed)


def test_every_drift_a_page_allows_names_a_number_of_its_block():
    # A drift whose name matches nothing (a renamed label) would silently allow nothing,
    # or a drift spelled wrong would go unused: each must name a number the block prints.
    outputs = tool("docs_outputs")
    for block in marked_blocks():
        names = {
            name for line in block["body"].splitlines() for name, *_ in outputs.numbers(line)[1]
        }
        assert set(outputs.drifts(block["drifts"])) <= names, block["command"]


@pytest.mark.parametrize("figure", ["demo.png", "visualdl.png"])
def test_a_figure_of_the_demo_shows_the_run_the_readme_quotes(figure):
    pytest.importorskip("PIL")
    figures, outputs = tool("docs_figures"), tool("docs_outputs")
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as page:
        blocks = [
            match
            for match in outputs.MARKED.finditer(page.read())
            if match["command"] == "python examples/train_digits.py"
        ]
    assert len(blocks) == 1, "the README quotes the demo's output once, in a marked block"
    quoted = figures.summary(blocks[0]["body"])
    assert quoted.count("\n") == 1, quoted  # a line per policy
    with figures.Image.open(os.path.join(figures.FIGURES, figure)) as image:
        shown = image.text.get(figures.SUMMARY_FIELD)
    # The same run, drawn on another processor, may differ within the block's drifts.
    assert outputs.agree(quoted, shown or "", outputs.drifts(blocks[0]["drifts"])), (
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
