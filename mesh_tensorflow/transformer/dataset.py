"""tf.data pipelines for transformers: text files -> packed batches of ids.

A language-model pipeline reads text, tokenizes it, splits long examples into
pieces of at most `sequence_length` tokens, shuffles with a seed, packs several
short examples into each fixed-length row and batches the rows:

    >>> vocab = vocabulary.ByteVocabulary()
    >>> ds = lm_dataset(["a.txt"], vocab, sequence_length=128, batch_size=8, seed=1)
    >>> sorted(ds.element_spec)
    ['targets', 'targets_position', 'targets_segmentation']

Packed rows carry, per token, the number of the example it belongs to
(`<key>_segmentation`: 1, 2, ... within the row, 0 for padding) and its
position inside that example (`<key>_position`), so a model keeps the examples
apart (attention masks, position embeddings; see packing.py). An
encoder-decoder pipeline reads tab-separated "input<TAB>target" lines and packs
`inputs` and `targets` together (`pairs_dataset`).

Every pipeline is deterministic for a given seed: the same files give the same
batches in the same order, run after run.

The default corpus needs no download: the Python standard library's own
source files (code, comments and docstrings), a fixed sorted list of them, with
every tenth file held out for evaluation (corpus.py). TensorFlow Datasets
can be used instead when it is installed and its data is reachable
(`tfds_text`).

This module is the face of the data pipelines: it defines nothing and
imports every name from the module that defines it:

* dataset_sources.py: text files, tab-separated pairs, TFDS and seqio;
* dataset_pipelines.py: tokenizing, splitting, packing and batching, and
  the complete pipelines (`lm_dataset`, `pairs_dataset`, `dataset_fn`);
* dataset_transforms.py: the original's feature-dict transforms
  (`pack_dataset`, `trim_and_pad_dataset`, `encode_all_features`, ...);
* dataset_readers.py: the original's named datasets
  (`packed_parallel_tsv_dataset`, `pretokenized_tfds_dataset`, ...);
* corpus.py and packing.py: the default corpus and the packing of rows.
"""

# pylint: disable=unused-import
from mesh_tensorflow.transformer.corpus import (  # noqa: F401
    DEFAULT_CORPUS_BYTES, HOLDOUT_EVERY, TRAIN, VALIDATION, stdlib_docstring_pairs,
    stdlib_files)
from mesh_tensorflow.transformer.dataset_pipelines import (  # noqa: F401
    dataset_fn, finish, lm_dataset, pairs_dataset, pairs_from_list, split_tokens, tokenize,
    trim)
from mesh_tensorflow.transformer.dataset_readers import (  # noqa: F401
    make_text_line_dataset, pad_dataset_with_zeroed_out_examples, packed_parallel_tsv_dataset,
    pretokenized_t2t_dataset, pretokenized_tfds_dataset, pretokenized_tfrecord_dataset,
    sample_from_text_line_datasets, simple_text_line_dataset, untokenized_tfds_dataset)
from mesh_tensorflow.transformer.dataset_sources import (  # noqa: F401
    seqio_dataset, text_dataset, tfds_pairs, tfds_text, tsv_dataset)
from mesh_tensorflow.transformer.dataset_transforms import (  # noqa: F401
    EvalDataset, encode_all_features, encode_dataset, ensure_dataset_eos, pack_dataset,
    pack_or_pad, supervised_to_dict, trim_and_pad_dataset)
from mesh_tensorflow.transformer.packing import (  # noqa: F401
    Lengths, as_lengths, pack, pad_unpacked)
