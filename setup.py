"""Install with `pip install -e .` (see README.md)."""
from setuptools import find_packages, setup

setup(
    name="mesh-tensorflow",
    version="0.2.0",
    description="Mesh TensorFlow for TensorFlow 2: distributed models over named dimensions",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["mesh_tensorflow", "mesh_tensorflow.*"]),
    # The transformer's gin configs (models/, layouts/, learning_rate_schedules/).
    package_data={"mesh_tensorflow.transformer": ["gin/*.gin", "gin/*/*.gin"]},
    include_package_data=True,
    python_requires=">=3.9",
    install_requires=["tensorflow>=2.16", "numpy", "gin-config", "absl-py", "tensorboard"],
    extras_require={
        # pytest-xdist: the suite runs in two processes (tracing and lowering
        # are single-threaded Python, so the second core would idle).
        "test": ["pytest", "pytest-xdist>=3.0", "hypothesis", "scikit-learn", "matplotlib"],
        # Layout report PNGs (mtf.layout_report(...).to_png, python -m mesh_tensorflow.report --png).
        "report": ["matplotlib"],
        # auto_mtf needs no extra: it searches exhaustively or with a beam (OR-Tools,
        # whose solver crashes when imported after TensorFlow, is not used).
        "auto_mtf": [],
        "examples": ["scikit-learn"],
        "sentencepiece": ["sentencepiece"],
        "tfds": ["tensorflow-datasets"],
        "docs": ["sphinx", "myst-parser"],
    },
    entry_points={
        "console_scripts": ["mtf-transformer = mesh_tensorflow.transformer.main:console_main"],
    },
)
