"""Other frameworks' loss-scaling APIs, as thin faces over this package's one scaler.

``compat.torch``: PyTorch's ``GradScaler``. ``compat.mindspore``: MindSpore's loss-scale
managers and the ``mindspore.amp`` functions. ``compat.keras``: TensorFlow/Keras'
``LossScaleOptimizer``, also importable from the top-level package.

A face translates names, arguments and errors. It reaches the scaler only through its
public API, Paddle's contract names and the extension interface
(``core.scaler.EXTENSION_INTERFACE``): the update rule and the state machine are the
core's, once.
"""
