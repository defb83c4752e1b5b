"""Packaging of mesh_tensorflow.

TensorFlow is not an unconditional requirement: several distributions provide
the `tensorflow` module (tensorflow, tensorflow-cpu, tf-nightly, GPU and
vendor builds) and pip cannot know that one of them is already there, so it
would install the `tensorflow` distribution on top of it. A fresh environment
gets TensorFlow through an extra:

    pip install "mesh-tensorflow[tensorflow]"      # or [tensorflow-cpu]
    pip install mesh-tensorflow                    # beside an installed TensorFlow

Importing the package checks the TensorFlow it finds (mesh_tensorflow/_environment.py).
The bounds below are what oss_scripts/version_matrix.py tests (docs/version_matrix.md).
"""
from setuptools import find_packages, setup

# The TensorFlow releases the version matrix passes on; keep in step with
# _environment.TESTED_TENSORFLOW (tests/project/test_packaging.py checks it).
TENSORFLOW = ">=2.16,<2.22"
# The Python versions the version matrix passes on.
PYTHON_VERSIONS = ("3.10", "3.11", "3.12", "3.13")



def _python_requires(versions):
  """'>=3.10,<3.14' for 3.10 to 3.13 (with '!=3.X.*' for any left out)."""
  minors = [int(v.split(".")[1]) for v in versions]
  gaps = [f",!=3.{m}.*" for m in range(minors[0], minors[-1]) if m not in minors]
  return f">=3.{minors[0]},<3.{minors[-1] + 1}" + "".join(gaps)


setup(
    name="mesh-tensorflow",
    version="0.2.0",
    description="Mesh TensorFlow for TensorFlow 2: distributed models over named dimensions",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["mesh_tensorflow", "mesh_tensorflow.*"]),
    # The transformer's gin configs (defaults.gin, models/, layouts/,
    # learning_rate_schedules/): every command reads them by name.
    package_data={"mesh_tensorflow.transformer": ["gin/*.gin", "gin/*/*.gin"]},
    python_requires=_python_requires(PYTHON_VERSIONS),
    install_requires=["numpy", "gin-config", "absl-py"],
    extras_require={
        # TensorFlow for a fresh environment, with TensorBoard for the
        # summaries (TensorFlow 2.21 does not require it).
        "tensorflow": [f"tensorflow{TENSORFLOW}", "tensorboard"],
        "tensorflow-cpu": [f"tensorflow-cpu{TENSORFLOW}", "tensorboard"],
        # TensorBoard summaries beside a TensorFlow installed without it.
        "tensorboard": ["tensorboard"],
        # pytest-xdist: the suite runs in two processes (tracing and lowering
        # are single-threaded Python, so the second core would idle); build,
        # wheel: the packaging test builds the sdist and wheel.
        # tensorboard: tests read the summaries training writes.
        "test": ["pytest", "pytest-xdist>=3.0", "hypothesis", "scikit-learn", "matplotlib",
                 "tensorboard", "build", "wheel"],
        # Layout report PNGs (mtf.layout_report(...).to_png, python -m mesh_tensorflow.report --png).
        "report": ["matplotlib"],
        # auto_mtf needs no extra: it searches exhaustively or with a beam (OR-Tools,
        # whose solver crashes when imported after TensorFlow, is not used).
        "auto_mtf": [],
        "examples": ["scikit-learn"],
        "sentencepiece": ["sentencepiece"],
        "tfds": ["tensorflow-datasets"],
        # seqio tasks and mixtures as data (dataset_fn.seqio_task); seqio
        # brings JAX and Flax with it.
        "seqio": ["seqio"],
        "docs": ["sphinx", "myst-parser"],
    },
    entry_points={
        "console_scripts": ["mtf-transformer = mesh_tensorflow.transformer.main:console_main"],
    },
    classifiers=[
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        *[f"Programming Language :: Python :: {v}" for v in PYTHON_VERSIONS],
        "Intended Audience :: Science/Research",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
