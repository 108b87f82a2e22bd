from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="paddle-amp-scaler",
    version="0.1.0",
    description="Dynamic loss scaling for PaddlePaddle dygraph, with Paddle's scaler API",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["paddle_amp_scaler", "paddle_amp_scaler.*"]),
    package_data={"paddle_amp_scaler": ["py.typed", "fused_unscale.cc"]},
    python_requires=">=3.9",
    # Paddle comes in two builds that both provide `paddle`: the user picks one.
    install_requires=["numpy"],
    extras_require={
        "cpu": ["paddlepaddle>=2.6"],
        "gpu": ["paddlepaddle-gpu>=2.6"],
        # Lint and type-check tools pinned to a minor range: their new rules land only
        # when we move the pin. mypy 1.19 is the last to run on Python 3.9.
        "test": ["pytest>=7", "hypothesis>=6", "ruff>=0.17,<0.18", "mypy>=1.19,<1.20"],
        "examples": ["scikit-learn>=1.0", "tqdm>=4", "matplotlib>=3.5"],
        "docs": ["sphinx>=7", "myst-parser>=2"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ],
)
