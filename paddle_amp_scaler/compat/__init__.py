"""Other frameworks' loss-scaling APIs, as thin faces over this package's one scaler.

``compat.torch``: PyTorch's ``GradScaler``. ``compat.mindspore``: MindSpore's loss-scale
managers and the ``mindspore.amp`` functions. TensorFlow/Keras' ``LossScaleOptimizer``
is in the top-level package.
"""
