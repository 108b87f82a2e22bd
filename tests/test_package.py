"""Packaging promises: the import surface, what the wheel ships, the no-Paddle message,
autocast."""

import os
import shutil
import subprocess
import sys

import paddle

import paddle_amp_scaler


def test_public_names():
    for name in ("AmpScaler", "GradScaler", "amp_guard", "auto_cast", "decorate"):
        assert hasattr(paddle_amp_scaler, name)


def test_the_wheel_ships_every_module_and_the_type_marker(tmp_path):
    package = os.path.dirname(paddle_amp_scaler.__file__)
    root = os.path.dirname(package)
    expected = {
        os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
        for folder, _, names in os.walk(package)
        for name in names
        if name.endswith(".py")
    } | {"paddle_amp_scaler/py.typed"}
    # Built from a copy: a build/ folder left in the checkout would hide a missing module.
    source = tmp_path / "source"
    shutil.copytree(
        package, source / "paddle_amp_scaler", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(root, name), source)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(source), "-w", str(wheels)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("*.whl")
    # Listed by a fresh interpreter: zipfile needs zlib, which Paddle 2.6 breaks in-process.
    listing = subprocess.run(
        [sys.executable, "-m", "zipfile", "-l", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    shipped = {line.split()[0] for line in listing.splitlines()[1:]}
    assert expected <= shipped, sorted(expected - shipped)


def test_autocast_helpers_are_paddles():
    assert paddle_amp_scaler.auto_cast is paddle.amp.auto_cast
    assert paddle_amp_scaler.amp_guard is paddle.amp.amp_guard
    assert paddle_amp_scaler.decorate is paddle.amp.decorate


def test_import_without_paddle_says_how_to_install():
    code = (
        "import sys; sys.modules['paddle'] = None\n"
        "try:\n    import paddle_amp_scaler\n"
        "except ImportError as e:\n    print(e)\n"
    )
    root = os.path.dirname(os.path.dirname(paddle_amp_scaler.__file__))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True
    ).stdout
    assert "pip install paddlepaddle`" in out and "pip install paddlepaddle-gpu" in out


def test_no_print_or_bare_assert_in_the_package():
    package_dir = os.path.dirname(paddle_amp_scaler.__file__)
    checked = set()
    for folder, _, names in os.walk(package_dir):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                checked.add(os.path.relpath(path, package_dir).replace(os.sep, "/"))
                with open(path, encoding="utf-8") as source:
                    for number, line in enumerate(source, 1):
                        stripped = line.strip()
                        assert not stripped.startswith(("print(", "assert ")), f"{path}:{number}"
    # The subpackages are read too.
    assert {"cli/doctor.py", "checkpoint/file_format.py", "core/scaler.py"} <= checked
