r"""The planner (`python -m mesh_tensorflow.plan`) against published large runs.

Rows:

* Shazeer et al. 2018, "Mesh-TensorFlow: Deep Learning for Supercomputers"
  (NeurIPS; arXiv 1811.02084), its largest language model: 4.9B parameters
  trained on the one-billion-word benchmark on a 512-core TPU v2 mesh at
  about 6 of the 11.5 PFLOP/s peak (the paper's text: "more than 50%" of
  peak). The sizes and mesh are those of the paper's released configuration,
  tensor2tensor/models/mtf_transformer.py, `mtf_transformer_paper_lm(5)` and
  `mtf_transformer_paper_lm_5` (github.com/tensorflow/tensor2tensor), whose
  docstring lists the same 4.90B parameters as the paper's LM table: 6
  decoder layers, d_model 1024, d_ff 8192 x 32 = 262,144, 8 x 32 = 256 heads
  of d_kv 256, separate embedding and softmax weights, batch 256 packed
  sequences of 256 tokens (`max_length`), Adafactor, float32 activations
  and dropout 0.1 on the attention weights, the feed-forward layer's hidden
  units and every sublayer's output (`mtf_transformer_base`: its
  `activation_dtype` was "float32" in every version of the file that
  carried these results, until a later change, after the paper's runs, made
  it "bfloat16"); mesh `batch:16;model:32`, layout `batch:batch;vocab:model;
  d_ff:model;heads:model`. Vocabulary: the lm1b 32k subword vocabulary, 32,768 entries
  here (its exact size is not stated in either source; 128 rows more or less
  change nothing visible). Compared: FLOP/s (model FLOPs / step time).
* Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters Using Megatron-LM" (SC'21), Table 1: GPT models of 1.7B to 1T
  parameters on 32 to 3,072 A100 80 GB GPUs (DGX A100, Selene), sequence
  2048, vocabulary 51,200, tensor-parallel size t (inside a host) and
  pipeline size p as in the table, the rest data parallel; Adam. The
  settings the table does not list are those of the authors' script for
  it, examples/sc21/run_table_1.sh in github.com/NVIDIA/Megatron-LM: the
  micro-batch size (MBS: 16 for 1.7B to 7.5B, 8 for 18.4B, 4 for 39.1B, 2
  for 76.1B and 145.6B, 1 above), full activation recomputation of every
  layer (`--recompute-method uniform`) in every row, and the interleaved
  schedule (`transformer.make_layer_stack.pipeline_schedule =
  "interleaved"`, `virtual_stages`) where the script sets
  `--num-layers-per-virtual-pipeline-stage`
  (76.1B: 5 layers, 3 chunks per device; 145.6B: 5, 2 chunks; 310.1B: 3, 2
  chunks; 529.6B: 1, 3 chunks), else 1F1B. Batch / (replicas x MBS)
  micro-batches per step: pipeline micro-batches, or without a pipeline
  gradient accumulation. Compared: the table's achieved teraFLOP/s per GPU,
  with the paper's own FLOP count 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))
  divided by the predicted step time and the GPU count.

* Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing
  NLG 530B, A Large-Scale Generative Language Model" (arXiv 2201.11990),
  Section 2.4: the 530B model (105 layers, hidden 20,480, 128 heads,
  sequence 2048) at global batch 1920 on 280, 350 and 420 DGX A100 servers
  (2,240 to 3,360 A100 80 GB), 8-way tensor and 35-way pipeline
  parallelism, the rest data parallel: 60.1, 50.2 and 44.4 s per iteration
  (126, 121 and 113 teraFLOP/s per GPU with the same FLOP count as
  Narayanan et al.). Another software stack (DeepSpeed's pipeline engine
  with Megatron's tensor parallelism) on the same hardware: held out. What
  the section does not state is assumed: micro-batch size 1, the 1F1B
  schedule, full recomputation of every layer, vocabulary 51,200 (GPT-2's
  50,257 padded as Megatron pads it).

* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models" (arXiv 2205.05198), held out: GPT models of 22B, 175B,
  530B and 1T parameters (Table 3: 48, 96, 105 and 128 layers, hidden 6144,
  12,288, 20,480 and 25,600, 64 to 160 heads) on 8, 64, 280 and 512 A100
  80 GB (Selene), 8-way tensor and 1-, 8-, 35- and 64-way pipeline
  parallelism, no data parallelism, global batch 4, 64, 280 and 512 in
  micro-batches of 4, 1, 1 and 1 sequences, sequence 2048, vocabulary
  51,200, the interleaved schedule with 3 chunks for 175B and 530B
  (Section 6; 1F1B assumed for 1T). Table 5 gives seconds per iteration
  with every layer recomputed and with sequence parallelism and selective
  recomputation (the attention's scores, softmax and weighted sum),
  planned as `recompute = 'layer'` and as `recompute = 'selective'` with
  `sequence_parallel = True`. Compared: teraFLOP/s per GPU with the paper's
  model FLOP count (its Eq. 7), 72 B s l h^2 (1 + s / (6h) + V / (12 h l)).

* Runs sharded FSDP-style (ZeRO stage 3 here), held out:
  - Zhang et al. 2022, "OPT: Open Pre-trained Transformer Language Models"
    (arXiv 2205.01068), Section 2.4: OPT-175B (96 layers, hidden 12,288, 96
    heads, sequence 2048; Table 1: batch about 2M tokens) on 992 A100 80 GB
    with Fully Sharded Data Parallel and 8-way Megatron tensor parallelism,
    "up to 147 TFLOP/s per GPU". Assumed: 992 sequences per step (8 per
    data-parallel replica), every layer recomputed, vocabulary 51,200, and
    the FLOP count of Narayanan et al. (with recomputation).
  - Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language
    Models" (arXiv 2302.13971), Section 2.4 and Table 2: LLaMA-65B (80
    layers, dimension 8192, 64 heads, sequence 2048, batch 4M tokens,
    vocabulary 32,000) at about 380 tokens/s per GPU on 2048 A100 80 GB.
    Its SwiGLU feed-forward layer (three 8192 x 22,016 matrices) is planned
    as this library's two-matrix layer of the same parameters and FLOPs
    (d_ff 33,024). Its attention is xformers' memory-efficient kernel
    (Section 2.4): planned with `attention = "fused"`. Assumed: no tensor
    parallelism (`data:2048`), ZeRO 3, every layer recomputed (the paper
    recomputes selectively and shards sequences as well; neither degree is
    stated).

* BigScience's BLOOM 176B (Megatron-DeepSpeed), held out: the training
  script and README of the run, train/tr11-176B-ml in
  github.com/bigscience-workshop/bigscience: 70 layers, hidden 14,336, 112
  heads, sequence 2048, vocabulary padded to 250,880 (tied embeddings),
  global batch 2048 in micro-batches of 2, 4-way tensor, 12-way pipeline
  and 8-way data parallelism on 384 A100 80 GB (48 nodes of 8), every layer
  recomputed (`--checkpoint-activations`), ZeRO stage 1 (DeepSpeed's
  BF16_Optimizer: bfloat16 weights, float32 masters in the sharded
  optimizer state, planned as `run.float32_master_in_optimizer = True`),
  Megatron-LM's default dropout (the README says so).
  The nodes reach each other over 4 Omni-Path links of 100 Gb/s: 6.25 GB/s
  per GPU, a quarter of a DGX A100's (benchmarks/hardware/jean_zay_a100.json;
  the rest as the `a100-80gb` preset). Published: the README's log line of
  iteration 85,376 at batch 2048, 104.70 s per iteration, 19.561 samples/s
  (149.77 TFLOP/s per GPU by its own count). Planned on DeepSpeed's 1F1B
  pipeline schedule and with the library's layer (GeLU and ALiBi left
  out: a few elementwise operations); its 70 layers on 12 stages give the
  busiest stage 6 (the run put the embedding on the first and last stages
  beside 5 layers). Compared: samples per second.
* Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways"
  (arXiv 2204.02311), held out: PaLM 540B (Table 1: 118 layers, d_model
  18,432, 48 heads of 256, d_ff 73,728 with SwiGLU, multi-query attention,
  attention and feed-forward layers in parallel, a 256k vocabulary;
  sequence 2048, batch 2048 at the end of training) on 6,144 TPU v4 chips,
  two pods of 12-way model and 256-way data parallelism (Section 4),
  238.3K tokens/s, 46.2% model FLOPs utilization (Section 4). Planned with
  the library's layers (a ParallelLayer of SelfAttention with one memory
  head and DenseReluDense with ["swish", "linear"]), mesh data:512;model:12
  on two slices of 3,072 chips (`--hardware=tpu-v4:2x3072`: the data
  dimension's collectives cross the data-center network between the pods),
  ZeRO 3 (the weights are sharded over the data dimension too), the first
  89 of the 118 layers recomputed (`recompute_layers = 89`: PaLM's 57.8%
  hardware FLOPs utilization against its 46.2% model FLOPs utilization
  means it recomputed a quarter of the model FLOPs, three quarters of the
  forward pass: 89 / (3 x 118) = 0.251), Adam-sized optimizer state
  (PaLM's Adafactor without factorization keeps the same). Compared:
  tokens per second.
* Megatron-LM's own H100 runs, held out: the model table of the
  "Performance Benchmarking" section of github.com/NVIDIA/Megatron-LM's
  README (images/model_table.png): GPT models of 1.7B to 462B parameters on
  48 to 6,144 H100 GPUs, sequence 4096, vocabulary 131,072, tensor- and
  pipeline-parallel sizes as in the table, 48-way data parallelism, with
  "fine-grained overlapping" of data-parallel (gradient reduction and
  parameter gathering), tensor-parallel and pipeline communication. The
  table's parameter counts are those of 4h feed-forward layers and separate
  embedding and softmax weights. Assumed (not stated): micro-batches of
  one sequence, no recomputation, fused attention (Transformer Engine),
  the interleaved schedule with the number of layer chunks per device,
  among those Megatron-LM accepts (dividing the layers of a stage), that
  plans fastest (1F1B where none does better), and its distributed
  optimizer planned as ZeRO 2
  with bfloat16 weights and float32 masters in the sharded optimizer state
  (`run.float32_master_in_optimizer = True`: the same reduce-scatter and
  all-gather, in 16 bits). Compared: the table's per-GPU
  teraFLOP/s, with Megatron-LM's FLOP count without recomputation,
  72 B s l h^2 (1 + s / (6 h)) + 6 B s h V. The rows with tensor
  parallelism are planned sequence parallel, as Megatron-LM runs them, and
  with the overlap the README states (`plan --overlap=model_parallel,
  param_gather`, an estimate only: this library overlaps neither): each
  layer's tensor-parallel collectives pipelined with its products, the
  updated parameters gathered under the next step's first forward pass.
  The README's strong-scaling result is why the schedule is interleaved;
  it gives two more rows: the 177B model of the table ("the standard GPT-3
  model") at its batch of 1,152 on 96 and on 4,608 H100 GPUs, MFU 47% and
  42% (compared as teraFLOP/s per GPU, 0.47 and 0.42 of the 989 peak),
  planned with the table's 8-way tensor and 6-way pipeline split (2 and
  96-way data parallelism). With 1F1B the 4,608-GPU run's 12 micro-batches
  per replica over 6 stages would leave MFU near 31%; the published 42%
  needs the bubble that interleaving leaves.
* MosaicML's MPT benchmarks, held out: the tables of
  scripts/train/benchmarking/README.md in github.com/mosaicml/llm-foundry
  (measured tokens per second per GPU of MPT models trained with PyTorch
  FSDP, FULL_SHARD, bf16, FlashAttention; node-to-node 1,600 Gb/s, i.e. 25
  GB/s per A100 as the presets price it). Seven rows: on A100 80 GB, 7B
  (8 GPUs, micro-batches of 6 sequences, 2 accumulated, no recomputation),
  30B (8 GPUs, 3 x 21, every layer recomputed) and 70B (64 GPUs, 8 x 4,
  recomputed); on A100 40 GB, 7B (128 GPUs, 18 x 1, recomputed) and 13B
  (32 GPUs, 14 x 1, recomputed); on H100 80 GB, 7B (8 GPUs, 6 x 1) and 70B
  (64 GPUs, 8 x 4, recomputed); sequence 2048. MPT sizes from the
  repository's yamls and the table's parameter counts (d_model 4096, 5120,
  7168, 8192; 32, 40, 64, 64 heads; 32, 40, 48, 80 layers; 4 d_model
  feed-forward, vocabulary 50,368, tied embeddings, no dropout). Planned
  as ZeRO 3 over `data:N` with bfloat16 weights and float32 masters in
  the sharded optimizer state, fused attention, the step priced as XLA
  compiles it; ALiBi and the absence of biases left out. Compared: tokens
  per second per GPU.
* MaxText's TPU runs: the tables of configs/v5e/README.md and
  configs/v5p/README.md in github.com/AI-Hypercomputer/maxtext, each beside
  the script it was published with (configs/v5e/16b.sh, ...). The tables'
  figures have stood unchanged since they were published with those
  scripts and with the base.yml of that version, so the rows plan that
  model and those scripts (later versions of the scripts lowered the
  per-chip batches for a different base model, without new figures):
  MaxText's decoder then (base.yml: d_model 2560, 8 heads of 256, d_ff
  8192 with ReLU, 16 layers at global_parameter_scale 1; attention and
  feed-forward side by side on one RMS norm; the output projection the
  embedding's transpose; vocabulary 32,768; sequence 2,048, AdamW, float32
  weights and bfloat16 compute, flash attention) at global_parameter_scale
  16 to 1024 (`maxtext_sizes`); per-chip batch, remat_policy and
  ici_tensor_parallelism as in each script, FSDP over the other chips.
  Twelve single-slice runs: 16B, 32B, 64B on 256 v5e chips (full
  recomputation, no tensor parallelism) and 128B (16-way tensor
  parallelism); 32B to 1024B on 64 to 2,048 v5p chips (v5p-N names N
  TensorCores, two per chip; remat_policy=minimal, JAX's
  checkpoint_dots_with_no_batch_dims, the library's "projections", up to
  256B, full above). Planned as ZeRO 3 over
  `data`, 4- to 16-way tensor parallelism over `model` with the stream
  between the layers split over d_model (MaxText shards its activations'
  embedding dimension over the tensor axis), fused attention, and
  `--overlap=model_parallel` (the scripts set
  --xla_tpu_overlap_compute_collective_tc). Compared: the tables'
  TFLOP/s per chip with MaxText's own FLOP count then (`maxtext_flops`).
* The same tables' multi-slice rows (`maxtext_multislice_rows`): the runs
  above on 2 to 32 slices (v5e) or 2 slices (v5p) joined by the
  data-center network, as MaxText runs them: data
  parallelism across the slices and FSDP inside each (hybrid sharding:
  `slices:S` first in the mesh, `outer_batch:slices`, run.outer_batch_size
  = S, ZeRO 3 over `data`), the per-chip batch of the single-slice run.
* MaxText's Trillium (TPU v6e) recipes, on one 256-chip slice: the runs
  behind the "optimized models" table of MaxText's
  docs/reference/models/tiering.md, each a recipe in
  github.com/AI-Hypercomputer/tpu-recipes (training/trillium/...) whose
  log line gives the tokens per second per chip, with the MaxText
  configuration it ran (benchmarks/maxtext_trillium_model_configs.py).
  Llama 2 70B (`llama2_70b_4096_sc`:
  2 sequences of 4,096 per chip, 905 tokens/s per chip: the logged step,
  9.052 s for 2,097,152 tokens on 256 chips; the configuration the recipe
  lists has 3), Llama 3.1 8B
  (`llama3_1_8b_8192`: 4 of 8,192, 7,207) and Llama 3.1 70B
  (`llama3_1-70b-8192`: 5 of 8,192, about 960); FSDP over the 256 chips
  (ZeRO 3 over `data:256`), flash attention, grouped-query attention with
  8 key/value heads, SwiGLU, untied embeddings, AdamW, bfloat16 compute.
  Their recomputation keeps a few projections' outputs in host memory and
  recomputes the rest of each layer (Llama 2: q, k and v; Llama 3.1: the
  layer's input and the attention's projections); planned as
  `recompute = 'layer'`, which also recomputes the kept projections (for
  these models 2 to 4% more of a step) and keeps each layer's input
  in HBM: the Llama 3.1 plans' memory is not the runs' (they do not fit
  in 32 GiB; the runs held the layer inputs in the host's memory).
  Compared: tokens per second per chip.
* The same table's Mixtral 8x7B on TPU v5p (tpu-recipes
  training/v5p/Mixtral-8X7B-Maxtext: 36 sequences of 4,096 per chip,
  bfloat16 weights, flash attention, MaxText's defaults otherwise: every
  layer recomputed, 8 experts with 2 per token and no token dropped;
  2,909 tokens/s per chip, MFU 52.56%). The table says 8x4x4 chips (128),
  the recipe v5p-128 (64): with FSDP over all of them each chip's work is
  the same, planned on 128. Each layer's feed-forward is `MoE1D` with 8
  SwiGLU experts of 14,336 and capacity factor 2.0 (each expert's slots
  per group are what its share of the two choices fills on average: the
  experts' products do the dropless run's work); `batch:data` leaves the
  experts unsplit, so each chip runs every expert on its own tokens, as
  MaxText's FSDP does. The dispatch and combine of this library's MoE are
  one-hot einsums (GShard's), which MaxText's grouped products avoid.
  Compared: tokens per second per chip.

Dropout, where the runs used it: Megatron-LM's defaults, which none of the
Megatron-LM rows' scripts or texts change (`--attention-dropout 0.1` on
the attention weights, `--hidden-dropout 0.1` on each sublayer's output),
and OPT's "dropout of 0.1 throughout" (Zhang et al., Section 2.2), planned
as `SelfAttention.dropout_rate = 0.1` and
`transformer.make_layer_stack.dropout_rate = 0.1` (`DROPOUT`); PaLM was
trained without dropout (Chowdhery et al., Section 5), LLaMA's and the
Mesh-TensorFlow LM's are not stated (none planned). With dropout the
attention's weights pass through memory once more and a mask is kept for
the backward pass, a cost that grows with the sequence over the hidden
size: it weighs most on the smallest models.

Activation memory, against Korthikanti et al. 2022, Table 2 (activation
bytes per transformer layer, 16-bit activations, one-byte dropout masks,
s sequence, b micro-batch, h hidden, a heads, t tensor-parallel size):
sbh (34 + 5as/h) unsplit; sbh (10 + 24/t + 5as/(ht)) with tensor
parallelism; sbh (34/t + 5as/(ht)) with sequence parallelism too; the same
without the 5as/(ht) term with selective recomputation; 2sbh with every
layer recomputed (each layer's input; 2sbh/t sequence parallel). Each of
the paper's four models (its Table 3: heads, hidden, micro-batch; dropout
as above) is planned with 2 and with 3 layers on `model:8` (`model:1`
unsplit), and the difference of the planned activation memory is one
layer's. Nothing is fitted: this checks which tensors the library's
layers keep for the backward pass.

The fitted constants are the GPUs' `matmul_efficiency` (fraction of
peak of a large matrix product) and `hbm_efficiency` (fraction of the HBM
bandwidth that memory-bound kernels reach), fitted together on the GPU rows
marked "fit" (1.7B, 18.4B and 145.6B of Narayanan et al.), and the TPUs'
`matmul_efficiency`, fitted on the TPU rows marked "fit" (MaxText's 16B on
v5e and 32B on v5p, its smallest run on each) with the GPUs' HBM
efficiency; both with the planner's default pricing (the step as XLA
compiles it). The other rows are held out. `--fit` refits them and prints
the values to put in hardware.py; `--quick` runs the two smallest GPU rows.
`--calibrate` plans each source's runs with the efficiency fitted to its
smallest run, as `plan --measured_step_time` would (a user's own stack).

    python benchmarks/scale_validation.py            # all rows, about a minute
    python benchmarks/scale_validation.py --quick
    python benchmarks/scale_validation.py --auto=1.7,18.4   # --auto against the published plan
    python benchmarks/scale_validation.py --auto=H100,22    # names and sizes
    python benchmarks/scale_validation.py --auto=all        # every row (long: run it in the background)
    python benchmarks/scale_validation.py --calibrate       # from each source's smallest run
    python benchmarks/scale_validation.py --memory          # the activation memory table only
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from mesh_tensorflow.analysis.cost_model import hardware  # noqa: E402
from mesh_tensorflow.transformer import planner  # noqa: E402
from mesh_tensorflow.transformer import plan_calibration  # noqa: E402
from mesh_tensorflow.transformer import plan_search  # noqa: E402
from mesh_tensorflow.transformer import plan_types  # noqa: E402
from mesh_tensorflow.transformer import gin_config  # noqa: E402

SHAZEER = "Shazeer et al. 2018 (Mesh-TensorFlow), 4.9B LM"
NARAYANAN = "Narayanan et al. 2021, Table 1"

# Narayanan et al. 2021, Table 1, and (mbs, chunks) from the authors'
# examples/sc21/run_table_1.sh (MBS; layers per stage / layers per virtual
# pipeline stage).
# (params B, heads, hidden, layers, t, p, GPUs, batch, published TFLOP/s per GPU, mbs, chunks)
MEGATRON_TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, 1),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, 1),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, 1),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 1),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 1),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 3),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 2),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 2),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 3),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 1),
]
FIT_ROWS = (1.7, 18.4, 145.6)

# Smith et al. 2022 (MT-NLG 530B), Section 2.4: (DGX A100 servers, published
# seconds per iteration) at global batch 1920; t = 8, p = 35.
MT_NLG_ITERATIONS = [(280, 60.1), (350, 50.2), (420, 44.4)]
SMITH = "Smith et al. 2022 (MT-NLG), Section 2.4"
SEQ, VOCAB = 2048, 51200
ZHANG = "Zhang et al. 2022 (OPT), Section 2.4"
CHOWDHERY = "Chowdhery et al. 2022 (PaLM), Section 4"
TOUVRON = "Touvron et al. 2023 (LLaMA), Section 2.4"
MEGATRON_H100 = "Megatron-LM README, H100 model table"
MEGATRON_H100_STRONG = "Megatron-LM README, H100 strong scaling"
BIGSCIENCE = "BigScience tr11-176B-ml README (BLOOM)"
MOSAIC = "MosaicML llm-foundry, benchmarking README (MPT)"
# MPT sizes: name -> (d_model, heads, layers).
MPT_SIZES = {"7B": (4096, 32, 32), "13B": (5120, 40, 40), "30B": (7168, 56, 48),
             "70B": (8192, 64, 80)}
# (model, hardware, GPUs, micro-batch, accumulated micro-batches, recomputed, tokens/s/GPU)
MOSAIC_TABLE = [
    ("7B", "a100-80gb", 8, 6, 2, False, 4641),
    ("30B", "a100-80gb", 8, 3, 21, True, 916),
    ("70B", "a100-80gb", 64, 8, 4, True, 410),
    ("7B", "a100-40gb", 128, 18, 1, True, 3623),
    ("13B", "a100-40gb", 32, 14, 1, True, 1998),
    ("7B", "h100-sxm", 8, 6, 1, False, 10643),
    ("70B", "h100-sxm", 64, 8, 4, True, 1039),
]
# (params B, heads, hidden, layers, t, p, GPUs, batch, published TFLOP/s per GPU)
MEGATRON_H100_TABLE = [
    (1.7, 16, 2048, 24, 1, 1, 48, 192, 408.8),
    (7.1, 32, 4096, 30, 2, 1, 96, 192, 465.9),
    (16, 48, 6144, 32, 4, 1, 192, 192, 489.1),
    (32, 56, 7168, 48, 8, 1, 384, 192, 459.6),
    (70, 64, 8192, 84, 8, 2, 768, 384, 419.7),
    (119, 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    (177, 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    (314, 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    (462, 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
]


KORTHIKANTI = "Korthikanti et al. 2022, Tables 3 and 5"
# (name, heads, hidden, layers, t, p, GPUs, batch = micro-batches x MBS, MBS, chunks per
# device, seconds per iteration with full recomputation, with sequence parallelism and
# selective recomputation)
KORTHIKANTI_TABLE = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49),
]


MAXTEXT = "MaxText, TPU v5e and v5p config READMEs"
# MaxText's base.yml model at global_parameter_scale S as the READMEs' figures
# were measured (the configs they were published with): d_model 2560, 8 heads
# of 256, d_ff 8192 (ReLU) and 16 layers, doubled in turn (heads and d_ff,
# then d_model, then layers) log2(S) times; attention and feed-forward side
# by side on one norm; the output projection the embedding's transpose.
# (TPU, scale, chips, per-chip batch, recompute, tensor-parallel size,
#  published TFLOP/s per chip, fit)
MAXTEXT_TABLE = [
    ("tpu-v5e", 16, 256, 6, "layer", 1, 120, True),
    ("tpu-v5e", 32, 256, 4, "layer", 1, 132, False),
    ("tpu-v5e", 64, 256, 2, "layer", 1, 118, False),
    ("tpu-v5e", 128, 256, 1, "layer", 16, 110, False),
    ("tpu-v5p", 32, 64, 8, "projections", 4, 328, True),
    ("tpu-v5p", 64, 64, 4, "projections", 4, 323, False),
    ("tpu-v5p", 128, 128, 2, "projections", 8, 315, False),
    ("tpu-v5p", 128, 256, 2, "projections", 8, 316, False),
    ("tpu-v5p", 256, 512, 2, "projections", 8, 308, False),
    ("tpu-v5p", 512, 512, 2, "layer", 16, 294, False),
    ("tpu-v5p", 1024, 1024, 2, "layer", 16, 254, False),
    ("tpu-v5p", 1024, 2048, 2, "layer", 16, 297, False),
]
MAXTEXT_VOCAB = 32768
MAXTEXT_HEAD = 256

MAXTEXT_MULTISLICE = "MaxText, multi-slice rows of the same READMEs"
# (TPU, scale, chips per slice) -> [(slices, published TFLOP/s per chip)]
MAXTEXT_SLICES = {
    ("tpu-v5e", 16, 256): [(2, 117), (4, 117), (8, 115), (16, 111), (32, 108)],
    ("tpu-v5e", 32, 256): [(2, 128), (4, 126), (8, 125), (16, 123), (32, 119)],
    ("tpu-v5e", 64, 256): [(2, 112), (4, 110), (8, 108), (16, 105), (32, 99)],
    ("tpu-v5e", 128, 256): [(2, 110), (4, 108), (8, 104), (16, 100), (32, 91)],
    ("tpu-v5p", 32, 64): [(2, 319)],
    ("tpu-v5p", 64, 64): [(2, 309)],
    ("tpu-v5p", 128, 128): [(2, 305)],
    ("tpu-v5p", 128, 256): [(2, 274)],
    ("tpu-v5p", 256, 512): [(2, 289)],
    ("tpu-v5p", 512, 512): [(2, 282)],
    ("tpu-v5p", 1024, 1024): [(2, 237)],
    ("tpu-v5p", 1024, 2048): [(2, 279)],
}

# Megatron-LM's default dropout (attention weights and sublayer outputs),
# which its runs here kept, and OPT's.
DROPOUT = ["SelfAttention.dropout_rate = 0.1", "transformer.make_layer_stack.dropout_rate = 0.1"]


@dataclasses.dataclass
class Row:
  name: str
  source: str
  hardware: str
  count: int
  mesh_shape: str
  layout: str
  bindings: list
  published: float  # in `unit`
  unit: str
  paper_flops: float = 0.0  # Megatron: the paper's FLOPs per step
  fit: bool = False
  attention: str = "unfused"  # PlanOptions.attention: "fused" where the run used such a kernel
  overlap: tuple = ()  # PlanOptions.overlap: what the run overlapped beyond this library
  slices: int = 0  # TPU slices joined by the data-center network (0: one, up to a pod)

  @property
  def cluster(self) -> str:
    """The --hardware spec: NAME:COUNT, or NAME:SxN for S slices."""
    if self.slices:
      return f"{self.hardware}:{self.slices}x{self.count // self.slices}"
    return f"{self.hardware}:{self.count}"


def _make_sequence_parallel(row: Row) -> None:
  """Splits `row`'s residual stream over its tensor-parallel `model`
  dimension too (Megatron-LM's sequence parallelism)."""
  row.layout += ";residual_length:model"
  row.bindings.append("transformer.make_layer_stack.sequence_parallel = True")


def megatron_rows():
  return [_gpt_row(f"GPT {params}B", NARAYANAN, heads, h, layers, t, p, gpus, batch,
                   tflops, mbs, chunks, fit=params in FIT_ROWS)
          for params, heads, h, layers, t, p, gpus, batch, tflops, mbs, chunks
          in MEGATRON_TABLE_1]


def mt_nlg_rows():
  rows = []
  for servers, seconds in MT_NLG_ITERATIONS:
    gpus, batch, h, layers = 8 * servers, 1920, 20480, 105
    tflops = _paper_flops(batch, layers, h) / seconds / gpus / 1e12
    rows.append(_gpt_row(f"MT-NLG 530B, {gpus}", SMITH, 128, h, layers, 8, 35, gpus,
                         batch, tflops, 1, 1))
  return rows


def fsdp_rows():
  opt = _gpt_row("OPT 175B", ZHANG, 96, 12288, 96, 8, 1, 992, 992, 147, 1, 1)
  opt.bindings = [b for b in opt.bindings if not b.startswith("run.grad_accum_steps")]
  opt.bindings.append("run.zero_stage = 3")
  llama = Row(
      "LLaMA 65B", TOUVRON, "a100-80gb", 2048, "data:2048", "batch:data",
      ["num_layers = 80", "d_model = 8192", "d_ff = 33024", "num_heads = 64", "d_kv = 128",
       "run.model_type = 'lm'", f"run.sequence_length = {{'inputs': {SEQ}, 'targets': {SEQ}}}",
       "run.batch_size = 2048", "run.activation_dtype = 'bfloat16'",
       "run.vocabulary = @vocabulary.SizedVocabulary()", "vocabulary.SizedVocabulary.size = 32000",
       "run.optimizer = @optimize.AdamWeightDecayOptimizer",
       "transformer.make_layer_stack.recompute = 'layer'", "run.zero_stage = 3"],
      380.0, "tokens/s per GPU", attention="fused")
  return [opt, llama]


def mosaic_rows():
  """MPT models as MosaicML benchmarked them with FSDP (see the module docstring)."""
  gpu = {"a100-80gb": "A100 80GB", "a100-40gb": "A100 40GB", "h100-sxm": "H100"}
  return [mosaic_row(f"MPT {model}, {gpus} {gpu[hw]}", MPT_SIZES[model], hw, gpus, mbs,
                     accumulated, recompute, tokens)
          for model, hw, gpus, mbs, accumulated, recompute, tokens in MOSAIC_TABLE]


def mosaic_row(name, size, hw, gpus, mbs, accumulated, recompute, tokens, seq=2048,
               zero_stage=3):
  """One MosaicML MPT run: `size` (d_model, heads, layers) on `gpus` GPUs of
  preset `hw`, micro-batches of `mbs` sequences of `seq` tokens accumulated
  `accumulated` times, FSDP as ZeRO `zero_stage`, every layer recomputed if
  `recompute`; `tokens`: the published tokens/s per GPU."""
  d, heads, layers = size
  bindings = [
      f"num_layers = {layers}", f"d_model = {d}", f"d_ff = {4 * d}", f"num_heads = {heads}",
      f"d_kv = {d // heads}", "run.model_type = 'lm'",
      f"run.sequence_length = {{'inputs': {seq}, 'targets': {seq}}}",
      f"run.batch_size = {gpus * mbs * accumulated}", "run.activation_dtype = 'bfloat16'",
      "run.vocabulary = @vocabulary.SizedVocabulary()", "vocabulary.SizedVocabulary.size = 50368",
      "run.optimizer = @optimize.AdamWeightDecayOptimizer", f"run.zero_stage = {zero_stage}",
      "run.float32_master_in_optimizer = True",
      f"transformer.make_layer_stack.recompute = '{'layer' if recompute else 'none'}'"]
  if accumulated > 1:
    bindings.append(f"run.grad_accum_steps = {accumulated}")
  return Row(name, MOSAIC, hw, gpus, f"data:{gpus}", "batch:data", bindings, float(tokens),
             "tokens/s per GPU", attention="fused")


def maxtext_sizes(scale: int):
  """(d_model, heads, d_ff, layers) of MaxText's model at global_parameter_scale `scale`."""
  steps, rem = divmod(int(math.log2(scale)), 3)
  wide = steps + (rem > 0)  # heads and d_ff
  return 2560 * 2 ** (steps + (rem > 1)), 8 * 2 ** wide, 8192 * 2 ** wide, 16 * 2 ** steps


def maxtext_parameters(scale: int) -> int:
  """Parameters of MaxText's model at `scale`: per layer the four attention
  projections, the feed-forward's two and one norm's scale; the embedding
  (also the output projection) and the final norm's scale."""
  d, heads, ff, layers = maxtext_sizes(scale)
  return layers * (4 * d * heads * MAXTEXT_HEAD + 2 * d * ff + d) + MAXTEXT_VOCAB * d + d


def maxtext_flops(scale: int, batch: int, seq: int = 2048) -> float:
  """MaxText's training FLOPs per step as the tables were measured (its
  train.py calculate_training_tflops then): 6 x parameters x tokens, plus
  the attention's 12 x heads x layers x head size x sequence^2 per
  sequence, halved for the causal mask."""
  _, heads, _, layers = maxtext_sizes(scale)
  return (6 * maxtext_parameters(scale) * batch * seq
          + 6 * heads * layers * MAXTEXT_HEAD * seq * seq * batch)


def maxtext_rows():
  """MaxText's TPU v5e and v5p runs on one slice (see the module docstring)."""
  return [_maxtext_row(*entry) for entry in MAXTEXT_TABLE]


def maxtext_multislice_rows():
  """The same runs on 2 to 32 slices (see the module docstring): hybrid
  sharding, the batch's outer dimension over the slices."""
  rows = []
  for tpu, scale, chips, per_chip, recompute, t, _, _ in MAXTEXT_TABLE:
    for slices, tflops in MAXTEXT_SLICES.get((tpu, scale, chips), []):
      rows.append(_maxtext_row(tpu, scale, chips, per_chip, recompute, t, tflops, False,
                               slices))
  return rows


MAXTEXT_RECIPES = "MaxText, tpu-recipes (tiering table)"
# (name, per-chip batch, sequence, layers, d_model, heads, d_ff, vocabulary, published
# tokens/s per chip); 128-wide heads, 8 key/value heads, SwiGLU.
TRILLIUM_TABLE = [
    ("Llama 2 70B", 2, 4096, 80, 8192, 64, 28672, 32000, 905.0),
    ("Llama 3.1 8B", 4, 8192, 32, 4096, 32, 14336, 128256, 7207.0),
    ("Llama 3.1 70B", 5, 8192, 80, 8192, 64, 28672, 128256, 960.0),
]


def _recipe_row(name, tpu, chips, per_chip, seq, layers, d, heads, ff, vocab, tokens, ffn):
  """One of MaxText's recipes (see the module docstring): a Llama-style
  decoder (128-wide heads sharing 8 key/value heads, untied embeddings,
  AdamW, bfloat16) with the feed-forward bindings `ffn`, every layer
  recomputed, FSDP over all `chips`."""
  bindings = [
      f"num_layers = {layers}", f"d_model = {d}", f"d_ff = {ff}", f"num_heads = {heads}",
      "d_kv = 128", "SelfAttention.num_memory_heads = 8", *ffn,
      "Unitransformer.shared_embedding_and_softmax_weights = False",
      "run.model_type = 'lm'", f"run.sequence_length = {{'inputs': {seq}, 'targets': {seq}}}",
      f"run.batch_size = {per_chip * chips}", "run.activation_dtype = 'bfloat16'",
      "run.vocabulary = @vocabulary.SizedVocabulary()", f"vocabulary.SizedVocabulary.size = {vocab}",
      "run.optimizer = @optimize.AdamWeightDecayOptimizer",
      "transformer.make_layer_stack.recompute = 'layer'", "run.zero_stage = 3"]
  return Row(name, MAXTEXT_RECIPES, tpu, chips, f"data:{chips}", "batch:data", bindings, tokens,
             "tokens/s per chip", attention="fused")


def trillium_rows():
  """MaxText's Llama recipes on one 256-chip TPU v6e slice (see the module
  docstring)."""
  return [_recipe_row(f"{name}, v6e-256", "tpu-v6e", 256, per_chip, seq, layers, d, heads, ff,
                      vocab, tokens, ["DenseReluDense.activation = ['swish', 'linear']"])
          for name, per_chip, seq, layers, d, heads, ff, vocab, tokens in TRILLIUM_TABLE]


def mixtral_row():
  """MaxText's Mixtral 8x7B recipe on TPU v5p (see the module docstring):
  a mixture of 8 SwiGLU experts, 2 per token, in each of 32 layers."""
  experts = [
      "transformer.make_layer_stack.layers = [@transformer_layers.SelfAttention, @moe.MoE1D]",
      "MoE1D.num_experts = 8", "MoE1D.hidden_size = 14336",
      "MoE1D.activation = ['swish', 'linear']", "MoE1D.capacity_factor_train = 2.0"]
  return _recipe_row("Mixtral 8x7B, v5p-256", "tpu-v5p", 128, 36, 4096, 32, 4096, 32, 14336,
                     32000, 2909.0, experts)


def _maxtext_row(tpu, scale, chips, per_chip, recompute, t, tflops, fit_row, slices=1):
  """One MaxText run: `slices` slices of `chips` chips each."""
  d, heads, ff, layers = maxtext_sizes(scale)
  batch = per_chip * chips * slices
  mesh = f"data:{chips // t}" + (f";model:{t}" if t > 1 else "")
  layout = "batch:data" + (";heads:model;d_ff:model;vocab:model;residual_d_model:model"
                           if t > 1 else "")
  bindings = [
      f"num_layers = {layers}", f"d_model = {d}", f"d_ff = {ff}", f"num_heads = {heads}",
      f"d_kv = {MAXTEXT_HEAD}", "run.model_type = 'lm'",
      "run.sequence_length = {'inputs': 2048, 'targets': 2048}",
      f"run.batch_size = {batch}", "run.activation_dtype = 'bfloat16'",
      "run.vocabulary = @vocabulary.SizedVocabulary()",
      f"vocabulary.SizedVocabulary.size = {MAXTEXT_VOCAB}",
      "run.optimizer = @optimize.AdamWeightDecayOptimizer",
      "transformer.make_layer_stack.layers = [@transformer_layers.ParallelLayer]",
      "transformer_layers.ParallelLayer.layer_classes = "
      "[@transformer_layers.SelfAttention, @transformer_layers.DenseReluDense]",
      f"transformer.make_layer_stack.recompute = '{recompute}'", "run.zero_stage = 3"]
  if t > 1:  # the stream between the layers split over d_model, as MaxText's
    bindings.append("transformer.make_layer_stack.sequence_parallel = 'd_model'")
  cores = chips * (2 if tpu == "tpu-v5p" else 1)  # v5p-N names N TensorCores, 2 per chip
  name, source = f"MaxText {scale}B, {tpu[-3:]}-{cores}", MAXTEXT
  if slices > 1:  # hybrid sharding: ZeRO inside each slice, the batch split across them
    mesh, layout = f"slices:{slices};{mesh}", f"outer_batch:slices;{layout}"
    bindings.append(f"run.outer_batch_size = {slices}")
    name, source = f"MaxText {scale}B, {slices}x {tpu[-3:]}-{cores}", MAXTEXT_MULTISLICE
  return Row(name, source, tpu, chips * slices, mesh, layout, bindings, float(tflops),
             "TFLOP/s per chip", maxtext_flops(scale, batch), fit=fit_row, attention="fused",
             overlap=("model_parallel",), slices=slices if slices > 1 else 0)


def palm_row():
  """PaLM 540B: parallel attention and feed-forward layers, multi-query
  attention, SwiGLU, as the library's layers express them."""
  return Row(
      "PaLM 540B", CHOWDHERY, "tpu-v4", 6144, "data:512;model:12",
      "batch:data;heads:model;d_ff:model;vocab:model;residual_d_model:model",
      ["num_layers = 118", "d_model = 18432", "d_ff = 73728", "num_heads = 48", "d_kv = 256",
       "run.model_type = 'lm'", "run.sequence_length = {'inputs': 2048, 'targets': 2048}",
       "run.batch_size = 2048", "run.activation_dtype = 'bfloat16'",
       "run.vocabulary = @vocabulary.SizedVocabulary()", "vocabulary.SizedVocabulary.size = 256000",
       "Unitransformer.vocab_divisor = 384",  # 256,128 rows: a multiple of the 12-way split
       "run.optimizer = @optimize.AdamWeightDecayOptimizer",
       "transformer.make_layer_stack.layers = [@transformer_layers.ParallelLayer]",
       "transformer_layers.ParallelLayer.layer_classes = "
       "[@transformer_layers.SelfAttention, @transformer_layers.DenseReluDense]",
       "SelfAttention.num_memory_heads = 1", "DenseReluDense.activation = ['swish', 'linear']",
       # The stream between the layers split over d_model, as PaLM's (2,048 is
       # not a multiple of 12, so the length cannot be split).
       "transformer.make_layer_stack.sequence_parallel = 'd_model'",
       # 89 of 118 layers recomputed: PaLM's hardware / model FLOPs, 57.8 / 46.2.
       "transformer.make_layer_stack.recompute = 'layer'",
       "transformer.make_layer_stack.recompute_layers = 89", "run.zero_stage = 3"],
      238.3, "thousand tokens/s", slices=2)  # two TPU v4 pods of 3,072 chips


def bloom_row():
  """BLOOM 176B as BigScience trained it (see the module docstring)."""
  row = _gpt_row("BLOOM 176B", BIGSCIENCE, 112, 14336, 70, 4, 12, 384, 2048, 2048 / 104.70,
                 2, 1, vocab=250880)
  row.hardware = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hardware",
                              "jean_zay_a100.json")
  row.bindings += ["run.zero_stage = 1", "run.float32_master_in_optimizer = True"]
  row.unit = "samples/s"
  return row


def korthikanti_rows():
  """Each model twice: every layer recomputed, and sequence parallelism with
  selective recomputation (the paper's "present work")."""
  rows = []
  for name, heads, h, layers, t, p, gpus, batch, mbs, chunks, full_s, present_s in \
      KORTHIKANTI_TABLE:
    # The paper's model FLOPs per iteration (its Eq. 7: no recomputation).
    flops = 72 * batch * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (12 * h * layers))
    for label, seconds, recompute in (("full", full_s, "layer"),
                                      ("SP+sel", present_s, "selective")):
      row = _gpt_row(f"{name} {label}", KORTHIKANTI, heads, h, layers, t, p, gpus, batch,
                     flops / seconds / gpus / 1e12, mbs, chunks, recompute=recompute)
      row.paper_flops = flops
      if recompute == "selective":
        _make_sequence_parallel(row)
      rows.append(row)
  return rows


# Korthikanti et al. 2022, Table 2: activation bytes per layer over sbh.
# (scheme, tensor-parallel size, recompute, sequence parallel, the formula)
ACTIVATION_SCHEMES = [
    ("unsplit", 1, "none", False, lambda t, core: 34 + core),
    ("tensor", 8, "none", False, lambda t, core: 10 + 24 / t + core),
    ("tensor+sequence", 8, "none", True, lambda t, core: 34 / t + core),
    ("tensor+selective", 8, "selective", False, lambda t, core: 10 + 24 / t),
    ("tensor+sequence+selective", 8, "selective", True, lambda t, core: 34 / t),
    ("full recompute", 8, "layer", False, lambda t, core: 2),
    ("full recompute+sequence", 8, "layer", True, lambda t, core: 2 / t),
]


@dataclasses.dataclass
class MemoryRow:
  model: str
  scheme: str
  published: float  # bytes per layer, the paper's formula
  predicted: float  # bytes per layer, planned


def activation_memory_rows(models=None):
  """One layer's planned activation memory against Korthikanti et al.'s
  Table 2 formulas, for each of their models (or those named in `models`)
  and each scheme of ACTIVATION_SCHEMES."""
  rows = []
  for name, heads, h, _, _, _, _, _, mbs, _, _, _ in KORTHIKANTI_TABLE:
    if models and name not in models:
      continue
    for scheme, t, recompute, sequence_parallel, formula in ACTIVATION_SCHEMES:
      core = 5 * heads * SEQ / (h * t)
      published = SEQ * mbs * h * formula(t, core)
      per_layer = []
      for layers in (2, 3):
        row = _gpt_row(name, KORTHIKANTI, heads, h, layers, t, 1, t, mbs, 0.0, mbs, 1,
                       recompute=recompute)
        if sequence_parallel:
          _make_sequence_parallel(row)
        per_layer.append(predict(row)[1].memory["activations"])
      rows.append(MemoryRow(name, scheme, published, per_layer[1] - per_layer[0]))
  return rows


def print_activation_memory(models=None) -> None:
  print(f"{'model':<6} {'scheme':<26} {'published GiB':>13} {'predicted GiB':>13} {'ratio':>6}"
        "   (one layer's activations, Korthikanti et al. 2022, Table 2)")
  worst = 0.0
  for r in activation_memory_rows(models):
    ratio = r.predicted / r.published
    worst = max(worst, abs(ratio - 1))
    print(f"{r.model:<6} {r.scheme:<26} {r.published / 2**30:>13.3f} "
          f"{r.predicted / 2**30:>13.3f} {ratio:>6.3f}")
  print(f"largest deviation, activation memory per layer: {100 * worst:.3f}%")


def megatron_h100_rows():
  return [_h100_row(f"H100 GPT {params}B", MEGATRON_H100, heads, h, layers, t, p, gpus, batch,
                    tflops)
          for params, heads, h, layers, t, p, gpus, batch, tflops in MEGATRON_H100_TABLE]


def megatron_h100_strong_rows():
  """The README's strong scaling of its 177B model (see the module docstring)."""
  return [_h100_row(f"H100 GPT 177B, {gpus}", MEGATRON_H100_STRONG, 96, 12288, 96, 8, 6, gpus,
                    1152, mfu * 989) for gpus, mfu in ((96, 0.47), (4608, 0.42))]


def _h100_row(name, source, heads, h, layers, t, p, gpus, batch, tflops):
  seq, vocab = 4096, 131072
  row = _gpt_row(name, source, heads, h, layers, t, p, gpus, batch, tflops, 1, 1, seq=seq,
                 vocab=vocab, recompute="none")
  row.hardware, row.attention = "h100-sxm", "fused"
  row.overlap = ("model_parallel", "param_gather")
  row.bindings += ["run.zero_stage = 2", "run.float32_master_in_optimizer = True",
                   "Unitransformer.shared_embedding_and_softmax_weights = False"]
  if t > 1:  # sequence parallelism with the tensor parallelism
    _make_sequence_parallel(row)
  row.paper_flops = (72 * batch * seq * layers * h * h * (1 + seq / (6 * h))
                     + 6 * batch * seq * h * vocab)
  if p > 1:
    _fastest_interleaving(row, layers // p)
  return row


def _fastest_interleaving(row: Row, layers_per_stage: int) -> None:
  """Plans `row`'s pipeline on 1F1B and on the interleaved schedule with
  each number of chunks that divides its stages' layers (as Megatron-LM
  requires), and keeps the fastest."""
  best = (predict(row)[0], None)
  for chunks in range(2, layers_per_stage + 1):
    if layers_per_stage % chunks == 0:
      candidate = dataclasses.replace(row, bindings=row.bindings + [
          "transformer.make_layer_stack.pipeline_schedule = 'interleaved'",
          f"transformer.make_layer_stack.virtual_stages = {chunks}"])
      best = max(best, (predict(candidate)[0], candidate), key=lambda b: b[0])
  if best[1] is not None:
    row.bindings = best[1].bindings


def _paper_flops(batch, layers, h):
  """Narayanan et al.'s FLOPs per step (with recomputation)."""
  return 96 * batch * SEQ * layers * h * h * (1 + SEQ / (6 * h) + VOCAB / (16 * layers * h))


def _gpt_row(name, source, heads, h, layers, t, p, gpus, batch, tflops, mbs, chunks,
             fit=False, seq=SEQ, vocab=VOCAB, recompute="layer"):
  """A GPT row planned as Megatron-LM lays it out: t-way tensor parallelism
  inside a host, p pipeline stages, the rest data parallel."""
  d = gpus // (t * p)
  micro = batch // (d * mbs)  # micro-batches of mbs sequences per data-parallel replica
  dims = ([f"pipe:{p}"] if p > 1 else []) + [f"data:{d}"] + ([f"model:{t}"] if t > 1 else [])
  layout = (["stages:pipe"] if p > 1 else []) + ["batch:data"] + (
      ["d_ff:model", "heads:model", "vocab:model"] if t > 1 else [])
  bindings = [
      f"num_layers = {layers}", f"d_model = {h}", f"d_ff = {4 * h}", f"num_heads = {heads}",
      f"d_kv = {h // heads}", "run.model_type = 'lm'",
      f"run.sequence_length = {{'inputs': {seq}, 'targets': {seq}}}",
      f"run.batch_size = {batch}", "run.activation_dtype = 'bfloat16'",
      "run.vocabulary = @vocabulary.SizedVocabulary()", f"vocabulary.SizedVocabulary.size = {vocab}",
      "run.optimizer = @optimize.AdamWeightDecayOptimizer",
      f"transformer.make_layer_stack.recompute = '{recompute}'",
      f"transformer.make_layer_stack.num_stages = {p}",
      f"transformer.make_layer_stack.num_microbatches = {micro if p > 1 else 1}",
      "transformer.make_layer_stack.pipeline_schedule = "
      + ("'interleaved'" if chunks > 1 else "'1f1b'")] + DROPOUT
  if chunks > 1:  # layer chunks per stage of the interleaved schedule
    bindings.append(f"transformer.make_layer_stack.virtual_stages = {chunks}")
  if p == 1 and micro > 1:  # gradient accumulation over micro-batches of mbs sequences
    bindings.append(f"run.grad_accum_steps = {micro}")
  return Row(name, source, "a100-80gb", gpus, ";".join(dims), ";".join(layout), bindings,
             tflops, "TFLOP/s per GPU", _paper_flops(batch, layers, h), fit=fit)


def shazeer_row():
  # tensor2tensor mtf_transformer_paper_lm(5): n = 2 ** 5, d_ff = 8192 n,
  # num_heads = 8 n, d_kv = 256, d_model = 1024, batch_size = 256; 6 layers,
  # max_length 256, float32 activations and the three dropouts of 0.1 from
  # mtf_transformer_base; mesh from mtf_transformer_paper_lm_5.
  bindings = [
      "num_layers = 6", "d_model = 1024", "d_ff = 262144", "num_heads = 256", "d_kv = 256",
      "run.model_type = 'lm'", "run.sequence_length = {'inputs': 256, 'targets': 256}",
      "run.batch_size = 256", "run.activation_dtype = 'float32'",
      "run.optimizer = @optimize.AdafactorOptimizer",
      "run.vocabulary = @vocabulary.SizedVocabulary()", "vocabulary.SizedVocabulary.size = 32768",
      "Unitransformer.shared_embedding_and_softmax_weights = False",
      "SelfAttention.dropout_rate = 0.1", "DenseReluDense.dropout_rate = 0.1",
      "transformer.make_layer_stack.dropout_rate = 0.1"]
  return Row("Transformer LM 4.9B", SHAZEER, "tpu-v2", 512, "batch:16;model:32",
             "batch:batch;vocab:model;d_ff:model;heads:model", bindings, 6.0, "PFLOP/s")


def predict(row: Row, efficiency=None, hbm_efficiency=None, attention_efficiency=None):
  cluster = hardware.parse_cluster(row.cluster)
  changes = {k: v for k, v in (("matmul_efficiency", efficiency),
                               ("hbm_efficiency", hbm_efficiency),
                               ("attention_efficiency", attention_efficiency)) if v is not None}
  if changes:
    cluster = dataclasses.replace(
        cluster, hardware=dataclasses.replace(cluster.hardware, **changes))
  gin_config.parse([], row.bindings)
  options = planner.options_from_gin()
  options.attention = row.attention
  options.overlap = row.overlap
  plan = planner.plan_current_config(cluster, row.mesh_shape, row.layout, options)
  return predict_value(row, plan), plan


def squared_log_error(rows, **efficiencies) -> float:
  """The sum over `rows` of log(predicted / published)^2, each planned with
  `efficiencies` (`predict`'s keyword arguments)."""
  return sum(math.log(predict(r, **efficiencies)[0] / r.published) ** 2 for r in rows)


def golden_section(loss, lo: float, hi: float, steps: int) -> float:
  """The middle of [lo, hi] after `steps` golden-section narrowings toward
  the minimum of `loss` (one argument)."""
  for _ in range(steps):
    a, b = hi - (hi - lo) / 1.618, lo + (hi - lo) / 1.618
    lo, hi = (lo, b) if loss(a) < loss(b) else (a, hi)
  return (lo + hi) / 2


def fit(rows, hbm_grid=None):
  """(matmul efficiency, HBM efficiency) that minimise the squared log
  ratio on the fit rows: a golden-section search of the first for each of
  a grid of the second (0.40 to 1.00 by 0.05, or `hbm_grid`)."""
  fit_rows = [r for r in rows if r.fit]
  best = None
  for hbm in hbm_grid or [round(0.40 + 0.05 * i, 2) for i in range(13)]:
    loss = lambda e, hbm=hbm: squared_log_error(fit_rows, efficiency=e, hbm_efficiency=hbm)  # noqa: E731
    efficiency = golden_section(loss, 0.3, 1.0, 15)
    candidate = (loss(efficiency), efficiency, hbm)
    best = min(best, candidate) if best else candidate
  return best[1], best[2]


def _on_tpu(row: Row) -> bool:
  return hardware.parse_cluster(row.cluster).hardware.kind == "tpu"


def fit_tpu(rows):
  """The TPUs' matmul efficiency fitted on the TPU fit rows, their HBM
  efficiency kept at the GPUs' (memory-bound kernels are not what differs)."""
  tpu_rows = [r for r in rows if _on_tpu(r)]
  return fit(tpu_rows, hbm_grid=[hardware.preset("a100-80gb").hbm_efficiency])[0]


def _describe(plan) -> str:
  o = plan.options
  parts = [plan.mesh_shape]
  if o.num_stages > 1:
    parts.append(f"{o.num_microbatches} micro-batches, {plan_search.schedule_label(o)}")
  parts.append(f"recompute {plan_types.recompute_label(o)}")
  if o.zero_stage:
    parts.append(f"ZeRO {o.zero_stage}"
                 + ("" if o.zero_reshard_after_forward else " gathered once"))
  return (f"{', '.join(parts)}: {plan.step_time_s:.3f} s/step, "
          f"{plan.memory_bytes_per_device / 2**30:.1f} GiB")


def _selected(row: Row, selectors) -> bool:
  """Whether a selector names `row`: a number is a model size in billions
  (a "1T" row is 1000), anything else a part of its name."""
  sizes = []
  for token in row.name.replace(",", " ").split():
    if token[-1] in "BT" and token[:-1].replace(".", "", 1).isdigit():
      sizes.append(float(token[:-1]) * (1000 if token[-1] == "T" else 1))
  for selector in selectors:
    try:
      size = float(selector)
    except ValueError:  # a part of the name
      if selector.lower() in row.name.lower():
        return True
      continue
    if any(abs(s - size) < 1e-6 for s in sizes):
      return True
  return False


def all_rows():
  """Every validation row, in the table's order."""
  return ([shazeer_row()] + megatron_rows() + mt_nlg_rows() + korthikanti_rows() + fsdp_rows()
          + [bloom_row(), palm_row()] + megatron_h100_rows() + megatron_h100_strong_rows()
          + mosaic_rows() + maxtext_rows()
          + maxtext_multislice_rows() + trillium_rows() + [mixtral_row()])


def compare_auto(selectors=None):
  """For each validated row (all, or those `selectors` name: sizes in
  billions or parts of names), plan --auto's search on the row's cluster and
  batch, against the published plan: the fastest plan within the published
  plan's memory per device, and the fastest that fits the device at all.
  The search covers the published plan (its mesh, micro-batch size,
  schedule, recomputation), so the first is never slower (but for a plan
  recomputing some of its layers, PaLM's: the search recomputes the fewest
  layers that fit the device, not the published plan's memory). Rows that differ
  only in recomputation or sequence parallelism (Korthikanti et al.'s) share
  one search."""
  rows = all_rows()
  if selectors:
    rows = [r for r in rows if _selected(r, selectors)]
  searches = {}
  for row in rows:
    _, published = predict(row)
    gin_config.parse([], row.bindings)
    start = time.time()
    key = (row.cluster, row.attention, row.overlap,
           published.options.virtual_stages,
           tuple(b for b in row.bindings if "recompute" not in b and "sequence_parallel" not in b))
    cluster = hardware.parse_cluster(row.cluster)
    shared = key in searches
    if not shared:
      searches[key] = plan_search.search(
          cluster, top=1, micro_sizes=(1, 2, 4),
          virtual_stages=tuple(sorted({*plan_search.VIRTUAL_STAGES,
                                       published.options.virtual_stages})),
          attention=row.attention, overlap=row.overlap)
    result = searches[key]
    seconds = time.time() - start
    budget = published.memory_bytes_per_device * (1 + 1e-9)
    same_memory = [p for p in result.plans if p.memory_bytes_per_device <= budget]
    print(f"{row.name} on {row.count} x {cluster.hardware.name} ({result.tried} plans searched"
          + (", the search above)" if shared else f" in {seconds:.0f} s)"))
    print(f"  published:         {_describe(published)}")
    if not same_memory:
      print("  same memory:       none: no searched plan fits in the published plan's "
            f"{published.memory_bytes_per_device / 2**30:.1f} GiB")
    else:
      best = same_memory[0]
      speedup = published.step_time_s / best.step_time_s
      if speedup < 1 + 1e-6:
        print("  same memory:       nothing faster: the published plan is the fastest that "
              "fits in its memory")
      else:
        print(f"  same memory:       {_describe(best)} ({speedup:.2f}x)")
    if result.plans:
      best = result.plans[0]
      print(f"  fits the device:   {_describe(best)} "
            f"({published.step_time_s / best.step_time_s:.2f}x)")
    else:
      print(f"  fits the device:   none; the closest: {'; '.join(result.rejected[:3])}")
    sys.stdout.flush()
  return 0


def published_step_s(row: Row, plan) -> float:
  """The published step time of `row` (its figure, in its unit, back to
  seconds per step: the figure is inversely proportional to it)."""
  value = predict_value(row, plan)
  return plan.step_time_s * value / row.published


def predict_value(row: Row, plan) -> float:
  """`row`'s figure (in its unit) of a plan."""
  if row.unit == "PFLOP/s":
    return plan.model_flops_per_step / plan.step_time_s / 1e15
  if row.unit in ("tokens/s per GPU", "tokens/s per chip"):
    return plan.tokens_per_s / row.count
  if row.unit == "thousand tokens/s":
    return plan.tokens_per_s / 1e3
  if row.unit == "samples/s":
    return plan.tokens_per_s / planner.configured_sequence_length()
  return row.paper_flops / plan.step_time_s / row.count / 1e12


def compare_calibrated():
  """`plan --measured_step_time` as a user would run it: each source's
  smallest run (fewest devices) is the measured one; the source's other
  runs, on the same software stack, are planned with the efficiency fitted
  to it."""
  groups = {}
  for row in (megatron_rows() + mt_nlg_rows() + korthikanti_rows() + megatron_h100_rows()
              + megatron_h100_strong_rows()):
    key = row.source + (" " + row.name.split()[-1] if row.source == KORTHIKANTI else "")
    groups.setdefault(key, []).append(row)
  print(f"{'run':<22} {'devices':>8} {'preset':>7} {'calibrated':>10}")
  for key, rows in groups.items():
    base = min(rows, key=lambda r: r.count)
    _, plan = predict(base)
    fit = plan_calibration.calibrate(hardware.parse_cluster(f"{base.hardware}:{base.count}"),
                                     published_step_s(base, plan), base.mesh_shape,
                                     base.layout, plan.options)
    efficiency = fit.hardware.matmul_efficiency
    print(f"{key}: calibrated on {base.name} ({base.count} devices): matmul_efficiency "
          f"{efficiency:.3f} (preset {fit.preset_efficiency:.3f})")
    for row in rows:
      if row is base:
        continue
      preset_value, _ = predict(row)
      value, _ = predict(row, efficiency)
      print(f"  {row.name:<20} {row.count:>8} {preset_value / row.published:>7.2f} "
            f"{value / row.published:>10.2f}")
    sys.stdout.flush()
  return 0


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="the two smallest GPU rows only")
  parser.add_argument("--fit", action="store_true", help="refit the GPU matmul efficiency")
  parser.add_argument("--auto", default="",
                      help="'all' or comma-separated model sizes in billions (4.9 is the "
                      "Mesh-TensorFlow row) or parts of row names (H100, MT-NLG): run plan "
                      "--auto's search for those rows and compare its best plans with the "
                      "published one")
  parser.add_argument("--calibrate", action="store_true",
                      help="plan each source's runs with the efficiency fitted to its smallest "
                      "run (plan --measured_step_time), against the presets'")
  parser.add_argument("--memory", action="store_true",
                      help="only the activation memory per layer against Korthikanti et al.")
  args = parser.parse_args(argv)
  if args.memory:
    print_activation_memory()
    return 0
  if args.calibrate:
    return compare_calibrated()
  if args.auto:
    return compare_auto(None if args.auto == "all" else args.auto.split(","))
  rows = megatron_rows()
  if args.quick:
    rows = rows[:2]
  else:
    rows = all_rows()
  if args.fit:
    gpu_rows = [r for r in rows if not _on_tpu(r)]
    efficiency, hbm = fit(gpu_rows)
    print(f"fitted GPU matmul_efficiency {efficiency:.3f}, hbm_efficiency {hbm:.2f}")
    if not args.quick:
      print(f"fitted TPU matmul_efficiency {fit_tpu(rows):.3f}")
  print(f"{'run':<22} {'source':<44} {'devices':>8} {'published':>10} {'predicted':>10} "
        f"{'ratio':>6}  {'role':<8} unit")
  worst = {}  # source -> largest |ratio - 1|
  outside = []
  for row in rows:
    t0 = time.time()
    value, plan = predict(row)
    ratio = value / row.published
    worst[row.source] = max(worst.get(row.source, 0.0), abs(ratio - 1))
    if abs(ratio - 1) > 0.15:
      outside.append(row.name)
    role = "fit" if row.fit else "held out"
    print(f"{row.name:<22} {row.source:<44} {row.count:>8} {row.published:>10.1f} "
          f"{value:>10.1f} {ratio:>6.2f}  {role:<8} {row.unit}  "
          f"(MFU {100 * plan.mfu:.0f}%, {plan.memory_bytes_per_device / 2**30:.0f} GiB/device"
          f"{'' if plan.fits else ', does not fit'}, planned in {time.time() - t0:.1f} s)")
  for source, deviation in worst.items():
    print(f"largest deviation, {source}: {100 * deviation:.1f}%")
  print(f"rows outside 15%: {len(outside)} of {len(rows)}"
        + (f" ({', '.join(outside)})" if outside else ""))
  if not args.quick:
    print()
    print_activation_memory()
  return 0


if __name__ == "__main__":
  sys.exit(main())
