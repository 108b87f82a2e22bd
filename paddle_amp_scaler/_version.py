"""The package's version, in one place: the wheel, ``__version__`` and the docs read it."""

__version__ = "0.2.0"
