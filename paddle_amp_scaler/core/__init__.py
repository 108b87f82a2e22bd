"""The core: one scaler, the update rule, and the device work of a training step.

Everything the faces (``paddle_amp_scaler.compat``) and helpers (checkpoints,
``install``, the integrations) build on. They reach the scaler through its public API,
Paddle's contract names (``scaler.PADDLE_CONTRACT``) and the extension interface
(``scaler.EXTENSION_INTERFACE``); ``docs/architecture.md`` draws the rest.
"""
