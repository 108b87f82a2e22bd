"""The release as a newcomer gets it: the sdist and the wheel built by the standard
frontend, the wheel installed into a fresh virtual environment holding only Paddle and
the wheel's own dependencies, and used from a folder outside the checkout."""

import json
import os
import shutil
import subprocess
import sys
import tarfile

import paddle
import pytest

import paddle_amp_scaler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "release_smoke.py")
SOURCES = ["paddle_amp_scaler", "pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"]
SOURCES += ["MANIFEST.in"]
BUILD_WORDS = ("ccache", "extension", "compil", "building", "setup", "helper")


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result


def clean_environment():
    """This process's environment without what would reach back into the checkout."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """(the sdist, the wheel, the fresh environment's Python) built from a copy of the
    checkout: a build/ folder or an editable install left behind would hide a missing
    file."""
    work = tmp_path_factory.mktemp("release")
    source = work / "source"
    source.mkdir()
    for name in SOURCES:
        origin = os.path.join(ROOT, name)
        if os.path.isdir(origin):
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(origin, source / name)
    dist = work / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)])
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")

    environment = work / "env"
    run([sys.executable, "-m", "venv", str(environment)])
    python = str(environment / "bin" / "python")
    # The versions this suite runs with (numpy, protobuf, ...), so that the fresh
    # environment differs from it only by what the wheel brings.
    freeze = run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"]).stdout
    constraints = work / "constraints.txt"
    constraints.write_text(freeze)
    # As the README says to: a Python's bundled pip predates the licence field.
    run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], env=clean_environment())
    run(
        [python, "-m", "pip", "install", "--quiet", "--constraint", str(constraints)]
        + [str(wheel), f"paddlepaddle=={paddle.__version__}"],
        env=clean_environment(),
    )
    return sdist, wheel, python


def test_the_sdist_and_the_wheel_ship_the_licence_and_the_changelog(release):
    sdist, wheel, _ = release
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= names
    # The wheel is listed by a fresh interpreter: zipfile needs zlib, which Paddle 2.6
    # breaks in-process.
    listing = run([sys.executable, "-m", "zipfile", "-l", str(wheel)]).stdout
    shipped = {line.split()[0] for line in listing.splitlines()[1:]}
    version = paddle_amp_scaler.__version__
    assert f"paddle_amp_scaler-{version}.dist-info/licenses/LICENSE" in shipped
    assert "paddle_amp_scaler/py.typed" in shipped
    assert "paddle_amp_scaler/compat/torch.py" in shipped
    assert wheel.name.startswith(f"paddle_amp_scaler-{version}-")


def test_pip_show_tells_the_licence_summary_and_classifiers(release):
    _, _, python = release
    shown = run([python, "-m", "pip", "show", "--verbose", "paddle-amp-scaler"]).stdout
    fields = dict(line.split(": ", 1) for line in shown.splitlines() if ": " in line)
    assert fields["Version"] == paddle_amp_scaler.__version__
    assert fields["License-Expression"] == "Apache-2.0"
    assert fields["Summary"].startswith("Dynamic loss scaling for PaddlePaddle")
    assert "Typing :: Typed" in shown and "Programming Language :: Python :: 3.11" in shown
    read = (
        "import importlib.metadata as m; print(m.metadata('paddle-amp-scaler')['Requires-Python'])"
    )
    assert run([python, "-c", read]).stdout.strip() == ">=3.9"


def test_a_newcomer_trains_skips_and_resumes_outside_the_checkout(release, tmp_path):
    _, _, python = release
    result = run([python, SMOKE], cwd=tmp_path, env=clean_environment())
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # The installed package, not the checkout's.
    environment = os.path.dirname(os.path.dirname(python))
    assert report["module_file"].startswith(environment), report["module_file"]
    assert report["version"] == paddle_amp_scaler.__version__
    assert len(report["imported"]) == 6 and len(report["names"]) == 7
    assert report["skip_left_parameters_unchanged"] is True
    assert report["stats"] == {"iterations": 4, "skipped": 1}
    assert report["scale"] == 512.0
    assert (report["resumed_step"], report["resume_identical"]) == (4, True)
    # The command line of the installed package: doctor sees the environment, inspect
    # reads the checkpoint the training run saved.
    doctor = report["doctor"]
    assert doctor["status"] == 0 and doctor["ok"] is True, doctor
    assert doctor["last_line"] == "Nothing here stands in the way of training."
    assert doctor["package"].startswith(environment), doctor["package"]
    inspected = report["inspect"]
    assert inspected["status"] == 0 and inspected["step_line"].split() == ["step", "4"]
    assert (inspected["step"], inspected["scale"], inspected["skipped"]) == (4, 512.0, 1)
    # A first run in a new environment builds nothing and says nothing of building (on
    # Paddle 2.6 the checkpoint warns that its random generator cannot be saved).
    chatter = [
        line for line in result.stderr.splitlines() if any(word in line for word in BUILD_WORDS)
    ]
    assert chatter == [], result.stderr
