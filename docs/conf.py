"""Sphinx configuration for the paddle-amp-scaler documentation."""

import os
import sys
import warnings

sys.path.insert(0, os.path.abspath(".."))

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Paddle 3's import-time note about ccache
    import paddle_amp_scaler

project = "paddle-amp-scaler"
author = "the paddle-amp-scaler developers"
copyright = "2026, the paddle-amp-scaler developers; Apache-2.0"
# The one version, from paddle_amp_scaler/_version.py.
release = version = paddle_amp_scaler.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_copybutton",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# paddle_amp_scaler.compat.mindspore.DynamicLossScaleManager(...) would not wrap.
add_module_names = False

html_theme = "furo"
html_title = f"paddle-amp-scaler {release}"
html_static_path = ["_static"]
html_css_files = ["wide.css"]
html_theme_options = {"navigation_with_keys": True}
# The copy button copies commands without their prompts and comments' alignment intact.
copybutton_prompt_text = r"\$ |>>> |\.\.\. "
copybutton_prompt_is_regexp = True
