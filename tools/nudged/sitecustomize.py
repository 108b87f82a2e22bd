"""Every parameter a Paddle layer creates, nudged by one unit in the last place.

On another processor Paddle's CPU kernels round a matmul or an ``exp`` differently, and
over hundreds of steps a training run drifts: the outputs the pages show move. No page
promises anything of a run's digits below that drift, so this folder, put first on
``PYTHONPATH``, moves a run the way another processor does: ``NUDGE_WEIGHTS=up`` (or
``down``) starts every floating-point parameter one float step above (below) where the
seed put it. ``tools/docs_outputs.py --check --nudged`` reruns the pages' commands so.

Paddle is patched when it is imported, not here: importing it at start-up would change
what a script imports first (Paddle 2.6 loads its own zlib).
"""

import importlib.abc
import importlib.util
import os
import sys

DIRECTIONS = {"up": float("inf"), "down": float("-inf")}


def nudge(create_parameter, toward):
    def nudged(layer, *args, **kwargs):
        import numpy as np
        import paddle

        parameter = create_parameter(layer, *args, **kwargs)  # None for bias_attr=False
        floating = parameter is not None and parameter.dtype in (paddle.float32, paddle.float64)
        if floating and paddle.in_dynamic_mode():
            value = parameter.numpy()
            parameter.set_value(np.nextafter(value, toward).astype(value.dtype))
        return parameter

    return nudged


class NudgeLayers(importlib.abc.MetaPathFinder):
    """Wraps ``Layer.create_parameter`` once the module that defines it has run."""

    def __init__(self, toward):
        self.toward = toward

    def find_spec(self, name, path, target=None):
        if name != "paddle.nn.layer.layers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            module.Layer.create_parameter = nudge(module.Layer.create_parameter, self.toward)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("NUDGE_WEIGHTS") in DIRECTIONS:
    sys.meta_path.insert(0, NudgeLayers(DIRECTIONS[os.environ["NUDGE_WEIGHTS"]]))
