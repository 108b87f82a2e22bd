"""The limits of the numbers a scaler keeps, each written once.

The scale lives in float32 on the device and its streak counters in int32, the types of
Paddle's ``update_loss_scaling`` kernel, whose periods are C int attributes; gradients
in float16 turn into inf above float16's largest value.
"""

import numpy as np

FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
FLOAT32_MAX = float(np.finfo(np.float32).max)
INT32_MAX = int(np.iinfo(np.int32).max)
