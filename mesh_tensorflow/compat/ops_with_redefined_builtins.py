"""The original Mesh TensorFlow's `ops_with_redefined_builtins`: every
`mesh_tensorflow.ops` name plus `abs`, `pow`, `range` and `slice` as the mtf
operations (which shadow Python's builtins in a module that star-imports this
one; `import mesh_tensorflow as mtf` gives the same names as `mtf.*`).

    >>> from mesh_tensorflow.compat.ops_with_redefined_builtins import *  # noqa: F403
    >>> y = abs(x)  # mtf.abs
"""

from mesh_tensorflow.ops import *  # noqa: F401,F403  pylint: disable=wildcard-import
from mesh_tensorflow.ops import __all__ as _ops_names
from mesh_tensorflow.ops import mtf_abs as abs  # noqa: F401  pylint: disable=redefined-builtin
from mesh_tensorflow.ops import mtf_pow as pow  # noqa: F401  pylint: disable=redefined-builtin
from mesh_tensorflow.ops import mtf_range as range  # noqa: F401  pylint: disable=redefined-builtin
from mesh_tensorflow.ops import mtf_slice as slice  # noqa: F401  pylint: disable=redefined-builtin

__all__ = tuple(_ops_names) + ("abs", "pow", "range", "slice")
