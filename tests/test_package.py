"""Packaging promises: the import surface, type marker, the no-Paddle message, autocast."""

import os
import subprocess
import sys

import paddle

import paddle_amp_scaler


def test_public_names():
    for name in ("AmpScaler", "GradScaler", "amp_guard", "auto_cast", "decorate"):
        assert hasattr(paddle_amp_scaler, name)


def test_py_typed_marker_ships():
    assert os.path.exists(os.path.join(os.path.dirname(paddle_amp_scaler.__file__), "py.typed"))


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
    assert "pip install 'paddle-amp-scaler[cpu]'" in out


def test_no_print_or_bare_assert_in_the_package():
    package_dir = os.path.dirname(paddle_amp_scaler.__file__)
    for name in os.listdir(package_dir):
        if name.endswith(".py"):
            with open(os.path.join(package_dir, name), encoding="utf-8") as source:
                for number, line in enumerate(source, 1):
                    stripped = line.strip()
                    assert not stripped.startswith(("print(", "assert ")), f"{name}:{number}"
