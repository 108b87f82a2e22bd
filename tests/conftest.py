import os
import sys
import warnings

# Paddle prints a note of its own on every import where OMP_NUM_THREADS is above 1, as a
# user's shell may set it, and sets it to 1 where it is unset: the suite, and every
# process it starts, runs as Paddle does by default, its outputs free of that note.
os.environ.pop("OMP_NUM_THREADS", None)

import paddle
import pytest

sys.path.insert(0, os.path.dirname(__file__))
warnings.filterwarnings("ignore", message="No ccache found")
paddle.set_device("cpu")


@pytest.fixture(autouse=True)
def _restore_amp_dtype():
    # Paddle's auto_cast leaves its global dtype behind; keep tests independent.
    from paddle.amp.auto_cast import amp_global_state

    saved = amp_global_state().amp_dtype
    yield
    amp_global_state().amp_dtype = saved
