r"""The planner against every bfloat16 row of MosaicML's MPT benchmarks.

The tables of `scripts/train/benchmarking/README.md` in mosaicml/llm-foundry
(GitHub) list the measured tokens per second per GPU of MPT models (125M to
70B parameters: `scripts/train/yamls/pretrain/mpt-*.yaml` give their sizes)
trained with PyTorch FSDP, bfloat16 and FlashAttention on 8 to 512 A100 40 GB,
A100 80 GB and H100 GPUs, at sequence lengths 512 to 65,536, each with its
micro-batch size, gradient accumulation, sharding strategy and activation
checkpointing. `scale_validation.py` plans seven of them; this script plans
all 209 bfloat16 rows the same way (FULL_SHARD as ZeRO 3, SHARD_GRAD_OP as
ZeRO 2, float32 masters in the optimizer, every layer recomputed where the
row checkpoints activations, fused attention, vocabulary 50,368, no dropout;
the tables' "PURE" rows, which keep the variables in bfloat16, are planned the
same) and prints published, predicted and their ratio, then for each GPU how
many rows come within 15% and the median ratio.

One constant is fitted here: each GPU generation's `attention_efficiency`
(hardware.py), the fraction of peak at which FlashAttention runs the score
products, on the rows marked "fit": the 7B and 3B runs of 65,536 tokens on
8 GPUs (A100 80 GB for the A100s, whose 40 GB runs share the value; H100
for the H100 and the H200, the same Hopper chip). At that length the score
products are most of the work (2.7 times the 7B's other products, 4.3
times the 3B's), so those rows price the kernel and little else. Every
other row is held out, and the summary counts held-out rows only. `--fit`
refits the values and prints them for hardware.py.

    python benchmarks/mosaic_sweep.py [--gpu=h100-sxm] [--fit]
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale_validation  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

# MPT sizes (mpt-*.yaml): name -> (d_model, heads, layers); d_ff 4 d_model.
SIZES = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24),
         "1b": (2048, 16, 24), "3b": (2560, 20, 32), "7b": (4096, 32, 32),
         "13b": (5120, 40, 40), "30b": (7168, 56, 48), "70b": (8192, 64, 80)}

# One row per line: GPU preset, model, sequence length, GPUs, micro-batch
# size, gradient accumulation, sharding (full: FULL_SHARD, grad_op:
# SHARD_GRAD_OP), activation checkpointing (ckpt or -), tokens/s per GPU.
ROWS = """
h100-sxm 70b 2048 512 8 1 full ckpt 1007
h100-sxm 70b 2048 256 8 1 full ckpt 1035
h100-sxm 70b 2048 128 8 1 full ckpt 1058
h100-sxm 30b 2048 512 8 1 full ckpt 2115
h100-sxm 30b 2048 256 8 1 full ckpt 2148
h100-sxm 30b 2048 128 8 1 full ckpt 2199
h100-sxm 13b 2048 512 16 1 full ckpt 4952
h100-sxm 13b 2048 256 16 1 full ckpt 4989
h100-sxm 13b 2048 128 16 1 full ckpt 5080
h100-sxm 7b 2048 512 6 1 full - 9670
h100-sxm 7b 2048 256 6 1 full - 10119
h100-sxm 7b 2048 128 6 1 full - 10475
h100-sxm 3b 2048 512 8 1 grad_op - 21664
h100-sxm 3b 2048 256 8 1 grad_op - 22772
h100-sxm 3b 2048 128 8 1 grad_op - 23422
h100-sxm 1b 2048 512 12 1 grad_op - 39837
h100-sxm 1b 2048 256 12 1 grad_op - 42555
h100-sxm 1b 2048 128 12 1 grad_op - 44123
h100-sxm 70b 2048 64 8 4 full ckpt 1039
h100-sxm 70b 2048 32 2 16 full ckpt 882
h100-sxm 30b 8192 8 1 21 full ckpt 1384
h100-sxm 30b 4096 8 1 21 full ckpt 1802
h100-sxm 30b 2048 32 14 3 full ckpt 2308
h100-sxm 30b 2048 16 10 3 full ckpt 2263
h100-sxm 30b 2048 8 3 21 full ckpt 2002
h100-sxm 30b 1024 8 6 21 full ckpt 2084
h100-sxm 13b 32768 8 1 3 full ckpt 1976
h100-sxm 13b 16384 8 3 3 full ckpt 2985
h100-sxm 13b 4096 8 10 3 full ckpt 4717
h100-sxm 13b 2048 64 2 1 full - 4800
h100-sxm 13b 2048 32 2 1 full - 4811
h100-sxm 13b 2048 16 2 1 full - 4767
h100-sxm 13b 2048 8 2 1 full - 4792
h100-sxm 13b 1024 8 40 3 full ckpt 5502
h100-sxm 7b 65536 8 1 2 full ckpt 1956
h100-sxm 7b 32768 8 2 2 full ckpt 3318
h100-sxm 7b 8192 8 8 2 full ckpt 6935
h100-sxm 7b 4096 8 16 2 full ckpt 8611
h100-sxm 7b 2048 8 6 1 full - 10643
h100-sxm 7b 1024 8 64 2 full ckpt 10203
h100-sxm 3b 65536 8 1 2 full ckpt 3262
h100-sxm 3b 32768 8 3 6 full ckpt 5873
h100-sxm 3b 16384 8 1 6 full - 11152
h100-sxm 3b 8192 8 3 6 full - 16578
h100-sxm 3b 4096 8 5 6 full - 20964
h100-sxm 3b 2048 64 6 3 full - 22525
h100-sxm 3b 2048 32 6 3 full - 23021
h100-sxm 3b 2048 16 10 3 full - 24142
h100-sxm 3b 1024 8 20 6 full - 27046
h100-sxm 3b 512 8 40 6 full - 27965
h100-sxm 1b 65536 8 1 2 full ckpt 5506
h100-sxm 1b 32768 8 1 4 full - 12025
h100-sxm 1b 16384 8 2 4 full - 19649
h100-sxm 1b 8192 8 3 4 full - 29157
h100-sxm 1b 4096 8 7 4 full - 38535
h100-sxm 1b 2048 64 20 1 full - 44402
h100-sxm 1b 2048 32 20 1 full - 45130
h100-sxm 1b 2048 16 20 1 full - 46037
h100-sxm 1b 2048 8 14 1 full - 45455
h100-sxm 1b 1024 8 18 4 full - 48910
h100-sxm 1b 512 8 56 4 full - 52275
h100-sxm 760m 32768 8 1 2 full - 16291
h100-sxm 760m 16384 8 3 2 full - 27815
h100-sxm 760m 8192 8 6 2 full - 41825
h100-sxm 760m 4096 8 12 2 full - 55459
h100-sxm 760m 2048 32 24 1 full - 67971
h100-sxm 760m 2048 16 24 1 full - 68551
h100-sxm 760m 2048 8 24 2 full - 63147
h100-sxm 760m 1024 8 48 2 full - 78581
h100-sxm 760m 512 8 96 2 full - 83749
a100-80gb 70b 2048 64 8 4 full ckpt 410
a100-80gb 70b 2048 32 2 16 full ckpt 373
a100-80gb 30b 8192 8 1 21 full ckpt 574
a100-80gb 30b 4096 8 1 21 full ckpt 814
a100-80gb 30b 2048 8 3 21 full ckpt 916
a100-80gb 30b 1024 8 6 21 full ckpt 946
a100-80gb 30b 512 8 12 21 full ckpt 967
a100-80gb 13b 32768 8 1 3 full ckpt 1016
a100-80gb 13b 16384 8 3 3 full ckpt 1431
a100-80gb 13b 8192 8 5 3 full ckpt 1795
a100-80gb 13b 4096 8 10 3 full ckpt 2060
a100-80gb 13b 2048 8 2 3 full - 2262
a100-80gb 13b 1024 8 40 3 full ckpt 2330
a100-80gb 7b 65536 8 1 2 full ckpt 1013
a100-80gb 7b 32768 8 2 2 full ckpt 1672
a100-80gb 7b 16384 8 4 2 full ckpt 2453
a100-80gb 7b 8192 8 8 2 full ckpt 3206
a100-80gb 7b 4096 8 16 2 full ckpt 3684
a100-80gb 7b 2048 8 6 2 full - 4641
a100-80gb 7b 1024 8 64 2 full ckpt 4357
a100-80gb 3b 65536 8 1 2 full ckpt 1767
a100-80gb 3b 32768 8 3 6 full ckpt 3029
a100-80gb 3b 16384 8 1 6 full - 5529
a100-80gb 3b 8192 8 3 6 full - 7695
a100-80gb 3b 4096 8 5 6 full - 9457
a100-80gb 3b 2048 8 10 2 full - 10811
a100-80gb 3b 1024 8 20 6 full - 11580
a100-80gb 3b 512 8 40 6 full - 12127
a100-80gb 1b 65536 8 1 2 full ckpt 3044
a100-80gb 1b 32768 8 1 4 full - 6275
a100-80gb 1b 16384 8 2 4 full - 9956
a100-80gb 1b 8192 8 3 4 full - 13814
a100-80gb 1b 4096 8 7 4 full - 17807
a100-80gb 1b 2048 8 14 4 full - 20513
a100-80gb 1b 1024 8 18 4 full - 22112
a100-80gb 1b 512 8 56 4 full - 23148
a100-80gb 760m 65536 8 1 2 full ckpt 4143
a100-80gb 760m 32768 8 1 2 full - 8802
a100-80gb 760m 16384 8 3 2 full - 14274
a100-80gb 760m 8192 8 6 2 full - 20933
a100-80gb 760m 4096 8 12 2 full - 27351
a100-80gb 760m 2048 8 24 2 full - 32434
a100-80gb 760m 1024 8 48 2 full - 29765
a100-80gb 760m 512 8 96 2 full - 29446
a100-80gb 350m 65536 8 1 2 full - 7524
a100-80gb 350m 32768 8 2 2 full - 13652
a100-80gb 350m 16384 8 4 2 full - 23559
a100-80gb 350m 8192 8 8 2 full - 36569
a100-80gb 350m 4096 8 16 2 full - 49555
a100-80gb 350m 2048 8 32 2 full - 58782
a100-80gb 350m 1024 8 64 2 full - 64813
a100-80gb 350m 512 8 128 2 full - 69330
a100-80gb 125m 65536 8 1 2 full - 20368
a100-80gb 125m 32768 8 2 2 full - 36407
a100-80gb 125m 16384 8 4 2 full - 60040
a100-80gb 125m 8192 8 8 2 full - 90392
a100-80gb 125m 4096 8 16 2 full - 118396
a100-80gb 125m 2048 8 40 2 full - 142830
a100-80gb 125m 2048 8 32 2 full - 141737
a100-80gb 125m 1024 8 64 2 full - 156468
a100-80gb 125m 512 8 128 2 full - 165681
a100-40gb 70b 2048 128 4 1 full ckpt 376
a100-40gb 70b 2048 64 2 1 full ckpt 276
a100-40gb 30b 2048 128 6 1 full ckpt 865
a100-40gb 30b 2048 32 4 1 full ckpt 857
a100-40gb 13b 8192 8 1 16 full ckpt 1407
a100-40gb 13b 4096 8 2 16 full ckpt 1603
a100-40gb 13b 2048 128 16 1 full ckpt 1972
a100-40gb 13b 2048 64 16 1 full ckpt 1976
a100-40gb 13b 2048 32 14 1 full ckpt 1998
a100-40gb 13b 2048 16 10 1 full ckpt 1993
a100-40gb 13b 2048 8 4 16 full ckpt 1668
a100-40gb 13b 1024 8 8 16 full ckpt 1727
a100-40gb 13b 512 8 16 16 full ckpt 1763
a100-40gb 7b 16384 8 1 4 full ckpt 2249
a100-40gb 7b 8192 8 3 4 full ckpt 2887
a100-40gb 7b 4096 8 6 4 full ckpt 3366
a100-40gb 7b 2048 128 18 1 full ckpt 3623
a100-40gb 7b 2048 64 18 1 full ckpt 3665
a100-40gb 7b 2048 32 18 1 full ckpt 3725
a100-40gb 7b 2048 16 16 1 full ckpt 3645
a100-40gb 7b 2048 8 12 4 full ckpt 3679
a100-40gb 7b 1024 8 24 4 full ckpt 3854
a100-40gb 7b 512 8 48 4 full ckpt 3895
a100-40gb 3b 32768 8 1 4 full ckpt 2955
a100-40gb 3b 16384 8 2 8 full ckpt 4465
a100-40gb 3b 8192 8 1 8 full - 7149
a100-40gb 3b 4096 8 2 8 full - 8777
a100-40gb 3b 2048 128 6 1 full - 9538
a100-40gb 3b 2048 64 6 1 full - 9736
a100-40gb 3b 2048 32 6 1 full - 9914
a100-40gb 3b 2048 16 5 1 full - 9750
a100-40gb 3b 2048 8 5 8 full - 10065
a100-40gb 3b 1024 8 10 8 full - 10731
a100-40gb 3b 512 8 20 8 full - 11324
a100-40gb 1b 32768 8 1 4 full ckpt 5095
a100-40gb 1b 16384 8 1 8 full - 9715
a100-40gb 1b 8192 8 2 8 full - 13474
a100-40gb 1b 4096 8 4 8 full - 16856
a100-40gb 1b 2048 128 10 1 full - 18647
a100-40gb 1b 2048 64 10 1 full - 19001
a100-40gb 1b 2048 32 10 1 full - 15555
a100-40gb 1b 2048 16 8 1 full - 19085
a100-40gb 1b 2048 8 8 8 full - 19271
a100-40gb 1b 1024 8 16 8 full - 20959
a100-40gb 1b 512 8 32 8 full - 21782
a100-40gb 760m 32768 8 1 4 full ckpt 7183
a100-40gb 760m 16384 8 1 4 full - 13914
a100-40gb 760m 8192 8 3 4 full - 20106
a100-40gb 760m 4096 8 6 4 full - 25863
a100-40gb 760m 2048 128 12 1 full - 28940
a100-40gb 760m 2048 64 12 1 full - 29344
a100-40gb 760m 2048 32 12 1 full - 29648
a100-40gb 760m 2048 16 12 1 full - 29607
a100-40gb 760m 2048 8 12 4 full - 30173
a100-40gb 760m 1024 8 24 4 full - 33422
a100-40gb 760m 512 8 48 4 full - 34938
a100-40gb 350m 32768 8 1 4 full - 13416
a100-40gb 350m 16384 8 2 4 full - 22896
a100-40gb 350m 8192 8 4 4 full - 34933
a100-40gb 350m 4096 8 8 4 full - 46833
a100-40gb 350m 2048 128 18 1 full - 51934
a100-40gb 350m 2048 64 18 1 full - 52689
a100-40gb 350m 2048 32 18 1 full - 53811
a100-40gb 350m 2048 16 18 1 full - 55413
a100-40gb 350m 2048 8 16 4 full - 55995
a100-40gb 350m 1024 8 32 4 full - 62523
a100-40gb 350m 512 8 64 4 full - 66284
a100-40gb 125m 32768 8 1 4 full - 32651
a100-40gb 125m 16384 8 2 3 full - 55484
a100-40gb 125m 8192 8 5 3 full - 86858
a100-40gb 125m 4096 8 13 3 full - 115162
a100-40gb 125m 2048 128 26 1 full - 123936
a100-40gb 125m 2048 64 26 1 full - 125234
a100-40gb 125m 2048 32 26 1 full - 127122
a100-40gb 125m 2048 16 26 1 full - 130535
a100-40gb 125m 2048 8 26 3 full - 136334
a100-40gb 125m 1024 8 52 3 full - 148289
a100-40gb 125m 512 8 104 3 full - 156735
"""

# The rows `--fit` fits attention_efficiency on, by generation: (their
# names, the presets that take the fitted value).
FIT_ROWS = {"A100": (("7b 65536 x8 a100-80gb", "3b 65536 x8 a100-80gb"),
                     ("a100-40gb", "a100-80gb")),
            "H100": (("7b 65536 x8 h100-sxm", "3b 65536 x8 h100-sxm"), ("h100-sxm", "h200"))}
FIT_NAMES = {name for names, _ in FIT_ROWS.values() for name in names}


def sweep_rows(gpu=None):
  """(the line's fields, its scale_validation Row) for each line of ROWS
  (those on preset `gpu` only, if given)."""
  rows = []
  for line in ROWS.strip().splitlines():
    fields = line.split()
    hw, model, seq, gpus, mbs, accumulated, sharding, ckpt, tokens = fields
    if gpu and hw != gpu:
      continue
    row = scale_validation.mosaic_row(
        f"{model} {seq} x{gpus} {hw}", SIZES[model], hw, int(gpus), int(mbs), int(accumulated),
        ckpt == "ckpt", float(tokens), seq=int(seq), zero_stage=3 if sharding == "full" else 2)
    rows.append((fields, row))
  return rows


def fit_attention(rows):
  """{generation: the attention_efficiency minimising the squared log ratio
  on its FIT_ROWS} (a golden-section search from 0.2 to 1.0)."""
  by_name = {row.name: row for _, row in rows}
  fitted = {}
  for generation, (names, _) in FIT_ROWS.items():
    fit_rows = [by_name[n] for n in names]
    fitted[generation] = scale_validation.golden_section(
        lambda e, fit_rows=fit_rows: scale_validation.squared_log_error(
            fit_rows, attention_efficiency=e), 0.2, 1.0, 14)
  return fitted


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--gpu", default="", help="only the rows of this preset (a100-40gb, "
                      "a100-80gb, h100-sxm)")
  parser.add_argument("--fit", action="store_true",
                      help="refit each GPU generation's attention_efficiency on FIT_ROWS")
  args = parser.parse_args(argv)
  if args.fit:
    for generation, efficiency in fit_attention(sweep_rows()).items():
      print(f"fitted {generation} attention_efficiency {efficiency:.3f} "
            f"({', '.join(FIT_ROWS[generation][1])})")
  ratios = {}
  print(f"{'run':<26} {'mbs':>4} {'accum':>5} {'ckpt':>5} {'published':>10} {'predicted':>10} "
        f"{'ratio':>6}  {'role':<8} tokens/s per GPU")
  for fields, row in sweep_rows(args.gpu or None):
    value, plan = scale_validation.predict(row)
    ratio = value / row.published
    fit = row.name in FIT_NAMES
    if not fit:
      ratios.setdefault(fields[0], []).append(ratio)
    print(f"{row.name:<26} {fields[4]:>4} {fields[5]:>5} {fields[7]:>5} {row.published:>10.0f} "
          f"{value:>10.0f} {ratio:>6.2f}  {'fit' if fit else 'held out':<8}"
          + ("" if plan.fits else " does not fit"), flush=True)
  for hw, values in ratios.items():
    within = sum(abs(r - 1) <= 0.15 for r in values)
    print(f"{hw}: {within} of {len(values)} held-out rows within 15%, median ratio "
          f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
