"""Other frameworks' loss-scaling APIs, as thin faces over this package's one scaler:
``torch``, ``mindspore`` and ``keras`` (whose ``LossScaleOptimizer`` is also top-level).

A face translates names, arguments and errors; it reaches the scaler only through its
public API, Paddle's contract names and ``core.scaler.EXTENSION_INTERFACE``: the update
rule and the state machine are the core's, once.
"""
