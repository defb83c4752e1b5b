"""Transformer models, data, vocabularies, gin configs and the command line.

Import the modules you need, e.g.

    >>> from mesh_tensorflow.transformer import transformer, vocabulary, dataset

`python -m mesh_tensorflow.transformer.main` trains, evaluates and decodes the
models from gin configs (see `application.run`).
"""

# The model library (plain Python, no gin): imported here so that
# `mesh_tensorflow.transformer.transformer.Unitransformer` etc. resolve.
from mesh_tensorflow.transformer import attention  # noqa: F401
from mesh_tensorflow.transformer import funnel_transformer  # noqa: F401
from mesh_tensorflow.transformer import layer_stack  # noqa: F401
from mesh_tensorflow.transformer import memory_layers  # noqa: F401
from mesh_tensorflow.transformer import moe  # noqa: F401
from mesh_tensorflow.transformer import sublayers  # noqa: F401
from mesh_tensorflow.transformer import transformer  # noqa: F401
from mesh_tensorflow.transformer import transformer_layers  # noqa: F401
from mesh_tensorflow.transformer import vocab_embeddings  # noqa: F401
from mesh_tensorflow.transformer import adaptive_softmax  # noqa: F401
