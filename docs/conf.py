"""Sphinx configuration for the paddle-amp-scaler documentation."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "paddle-amp-scaler"
author = "the paddle-amp-scaler developers"
release = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# paddle_amp_scaler.compat.mindspore.DynamicLossScaleManager(...) would not wrap.
add_module_names = False
html_theme = "alabaster"
html_title = "paddle-amp-scaler"
