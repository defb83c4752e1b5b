"""Hardware presets, clusters and the topology-aware pricing of collectives."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh_tensorflow.analysis.cost_model import hardware, params, topology


def test_presets_have_sources_and_published_figures():
  a100 = hardware.preset("a100-80gb")
  assert a100.peak_flops_per_s == 312e12 and a100.devices_per_host == 8
  assert a100.hbm_bytes_per_s == 2039e9 and a100.network_bytes_per_s == 25e9
  assert hardware.preset("a100-40gb").hbm_bytes == 40e9
  assert hardware.preset("tpu-v2").peak_flops_per_s * 512 == pytest.approx(11.52e15)
  # Cloud TPU's tables: v5p 95 GiB and 50 Gb/s of data-center network per
  # chip; v5e 2 x 100 Gb/s per host of 8 chips; v4's network is assumed.
  v5p, v5e, v4 = (hardware.preset(n) for n in ("tpu-v5p", "tpu-v5e", "tpu-v4"))
  assert v5p.hbm_bytes == 95 * 2 ** 30 and v5p.network_bytes_per_s == 50e9 / 8
  assert v5e.network_bytes_per_s * v5e.devices_per_host == 200e9 / 8
  assert v4.sources["network_bytes_per_s"].startswith("assumed")
  # Trillium: 918 TFLOP/s, 1,638 GB/s; 800 GB/s of ICI both ways over 4
  # ports is 100 GB/s per link and direction; 8 chips per host, 256 a pod.
  v6e = hardware.preset("trillium")
  assert (v6e.name, v6e.peak_flops_per_s, v6e.hbm_bytes_per_s) == ("tpu-v6e", 918e12, 1638e9)
  assert (v6e.ici_link_bytes_per_s, v6e.torus_dims, v6e.devices_per_host) == (100e9, 2, 8)
  assert v6e.max_slice_devices == 256 and v6e.hbm_bytes == 32 * 2 ** 30
  for name, h in hardware.PRESETS.items():
    for field in ("peak_flops_per_s", "hbm_bytes", "hbm_bytes_per_s", "devices_per_host"):
      assert field in h.sources, (name, field)
  # The former "gpu"/"tpu" device parameters are the presets; cpu is unchanged.
  # Their memory speed is the bandwidth memory-bound kernels reach (fitted).
  assert params.DeviceParams.default("gpu").memory_bytes_per_s == pytest.approx(
      2039e9 * a100.hbm_efficiency)
  assert params.DeviceParams.default("tpu").memory_bytes_per_s == pytest.approx(
      450e9 * hardware.preset("tpu-v3").hbm_efficiency)
  assert 0 < a100.hbm_efficiency < 1 and "hbm_efficiency" in a100.sources
  assert params.DeviceParams.default("cpu").shares_memory
  # FlashAttention's share of peak: fitted per GPU generation (the H200 is
  # the H100's chip), below a large product's; none (0: the products' rate)
  # where nothing was fitted.
  h100 = hardware.preset("h100-sxm")
  for h in (a100, hardware.preset("a100-40gb"), h100, hardware.preset("h200")):
    assert 0 < h.attention_efficiency < h.matmul_efficiency, h.name
    assert "mosaic_sweep.py --fit" in h.sources["attention_efficiency"], h.name
  assert hardware.preset("a100-40gb").attention_efficiency == a100.attention_efficiency
  assert hardware.preset("h200").attention_efficiency == h100.attention_efficiency
  assert h100.attention_efficiency < a100.attention_efficiency
  for name in ("v100-32gb", "tpu-v4", "tpu-v5p"):
    assert hardware.preset(name).attention_efficiency == 0


def test_every_preset_name_is_resolved_one_way():
  """Names, aliases and any case reach the same preset from every entry
  point: the --hardware flag, DeviceParams (report --params) and the
  report's product rate."""
  for spec in ("h100", " H100-SXM ", "h100-sxm"):
    assert hardware.find_preset(spec) is hardware.PRESETS["h100-sxm"]
    assert hardware.parse_cluster(f"{spec}:8").hardware is hardware.PRESETS["h100-sxm"]
    assert params.as_device_params(spec).hardware == "h100-sxm"
  assert hardware.find_preset("fpga") is None
  # "gpu" and "tpu" stay the kinds' default parameters (named after the kind).
  assert params.as_device_params(" GPU ").name == "gpu"
  assert params.as_device_params("tpu").hardware == "tpu-v3"


def test_parse_cluster_presets_json_and_errors(tmp_path):
  c = hardware.parse_cluster("a100-80gb:1024")
  assert (c.count, c.num_hosts) == (1024, 128)
  assert hardware.parse_cluster("gpu:8").hardware.name == "a100-80gb"
  path = tmp_path / "m.json"
  data = json.loads(hardware.preset("h100-sxm").to_json())
  data.update(name="mine", count=16)
  path.write_text(json.dumps(data))
  assert hardware.parse_cluster(str(path)).count == 16
  assert hardware.parse_cluster(f"{path}:32").count == 32
  # A file that leaves the efficiencies out gets the presets' fitted ones.
  del data["matmul_efficiency"], data["hbm_efficiency"]
  path.write_text(json.dumps(data))
  for field in ("matmul_efficiency", "hbm_efficiency"):
    assert (getattr(hardware.parse_cluster(str(path)).hardware, field)
            == getattr(hardware.preset("h100-sxm"), field))
  data.update(kind="tpu", torus_dims=2, ici_link_bytes_per_s=1e11, max_slice_devices=256)
  path.write_text(json.dumps(data))
  for field in ("matmul_efficiency", "hbm_efficiency"):
    assert (getattr(hardware.parse_cluster(str(path)).hardware, field)
            == getattr(hardware.preset("tpu-v4"), field))
  data["hbm_efficiency"] = 1.5
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match="hbm_efficiency must be in"):
    hardware.parse_cluster(str(path))
  del data["hbm_efficiency"]
  # attention_efficiency left out: 0, the products' rate (nothing fitted for
  # an unknown machine); given, it must be a share of peak.
  del data["attention_efficiency"]
  path.write_text(json.dumps(data))
  assert hardware.parse_cluster(str(path)).hardware.attention_efficiency == 0
  data["attention_efficiency"] = -0.2
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match=r"'mine': attention_efficiency must be in \[0, 1\]"):
    hardware.parse_cluster(str(path))
  del data["attention_efficiency"]
  with pytest.raises(ValueError, match="unknown hardware 'fpga'"):
    hardware.parse_cluster("fpga:8")
  with pytest.raises(ValueError, match="say how many devices"):
    hardware.parse_cluster("h200")
  path.write_text(json.dumps({"name": "x", "speed": 1}))
  with pytest.raises(ValueError, match=r"unknown fields \['speed'\]"):
    hardware.parse_cluster(str(path))
  missing = tmp_path / "no_such_machine.json"
  with pytest.raises(ValueError, match="'.*no_such_machine.json' does not exist: give a preset "
                     "name .*a100-80gb"):
    hardware.parse_cluster(f"{missing}:8")
  # The cost model's device parameters: the same for a missing or broken file.
  from mesh_tensorflow.analysis import cost_model  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="no_such_machine.json' does not exist: give cpu"):
    cost_model.DeviceParams.from_json(str(missing))
  missing.write_text("{not json")
  with pytest.raises(ValueError, match="no_such_machine.json' are not valid JSON"):
    cost_model.DeviceParams.from_json(str(missing))
  # Valid JSON that is not a DeviceParams object: one line each, no TypeError.
  missing.write_text("5")
  with pytest.raises(ValueError, match="expected a JSON object of DeviceParams fields"):
    cost_model.DeviceParams.from_json(str(missing))
  calibrated = json.loads(cost_model.DeviceParams.default("cpu").to_json())
  missing.write_text(json.dumps({k: v for k, v in calibrated.items() if k != "flops_per_s"}))
  with pytest.raises(ValueError, match=r"missing fields \['flops_per_s'\]"):
    cost_model.DeviceParams.from_json(str(missing))
  for bad in ("fast", 0, True):
    missing.write_text(json.dumps(dict(calibrated, memory_bytes_per_s=bad)))
    with pytest.raises(ValueError, match=r"\['memory_bytes_per_s'\] must be numbers"):
      cost_model.DeviceParams.from_json(str(missing))
  missing.write_text(json.dumps(dict(calibrated, op_overhead_s=0)))
  assert cost_model.DeviceParams.from_json(str(missing)).op_overhead_s == 0


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3),
       dph=st.sampled_from([1, 2, 4, 8]), data=st.data())
def test_mesh_to_host_mapping_is_row_major_and_consecutive(sizes, dph, data):
  n = 1
  for s in sizes:
    n *= s
  p = data.draw(st.integers(0, n - 1))
  coords = topology.processor_coordinates(sizes, p)
  assert topology.processor_number(sizes, coords) == p
  assert topology.host_of(p, dph) == p // dph
  axes = data.draw(st.lists(st.integers(0, len(sizes) - 1), unique=True))
  members = topology.group_members(sizes, axes, p)
  expected = 1
  for a in axes:
    expected *= sizes[a]
  assert len(members) == expected and p in members
  local, hosts = topology.hosts_of_group(sizes, axes, dph)
  assert local * hosts >= expected and local <= dph


def test_gpu_groups_inside_a_host_use_nvlink_across_hosts_hierarchical():
  cluster = hardware.parse_cluster("a100-80gb:128")
  sizes = [16, 8]
  inside = topology.group_levels(sizes, [1], cluster)
  across = topology.group_levels(sizes, [0], cluster)
  both = topology.group_levels(sizes, [0, 1], cluster)
  assert [(lv.link, lv.factor) for lv in inside] == [("nvlink", 8)]
  assert [(lv.link, lv.factor) for lv in across] == [("network", 16)]
  assert [(lv.link, lv.factor) for lv in both] == [("nvlink", 8), ("network", 16)]
  nbytes = 1e9
  t_in = topology.collective_time("allreduce", nbytes, inside)
  assert t_in == pytest.approx(2 * 7 / 8 * nbytes / 300e9 + 14 * 3e-6)
  # Hierarchical: reduce-scatter in the host, allreduce of 1/8 across, gather.
  t_both = topology.collective_time("allreduce", nbytes, both)
  expected = t_in + 2 * 15 / 128 * nbytes / 25e9 + 30 * 8e-6
  assert t_both == pytest.approx(expected)
  assert t_both < topology.collective_time("allreduce", nbytes, across)


def test_tpu_collectives_ride_the_torus():
  cluster = hardware.parse_cluster("tpu-v4:64")  # a 4x4x4 torus
  assert hardware.torus_shape(64, cluster.hardware) == (4, 4, 4)
  levels = topology.group_levels([4, 16], [1], cluster)
  assert [lv.link for lv in levels] == ["ici", "ici"]
  assert all(lv.bytes_per_s == 2 * 50e9 for lv in levels)  # wrap-around rings
  v2 = hardware.parse_cluster("tpu-v2:512")
  links = [lv.link for lv in topology.group_levels([16, 32], [1], v2)]
  assert links == ["chip", "ici"]


def test_tpu_slices_are_written_s_x_n_and_joined_by_the_data_center_network():
  """tpu-v5p:2x64: two slices of 64 chips (MaxText's "2x v5p-128"). A
  collective over the first mesh dimension crosses the data-center network
  once the slices are smaller than a pod; one inside a slice rides only its
  torus; the spec round-trips through str."""
  two = hardware.parse_cluster("tpu-v5p:2x64")
  assert (two.count, two.slices, str(two)) == (128, 2, "tpu-v5p:2x64")
  assert two.hardware.max_slice_devices == 64
  assert hardware.torus_shape(two.count, two.hardware) == (4, 4, 4)
  assert "2 slices over the data-center network" in hardware.describe(two)
  across = topology.group_levels([128], [0], two)
  assert [lv.link for lv in across] == ["ici", "ici", "ici", "dcn"]
  assert across[-1].factor == 2 and across[-1].bytes_per_s == 6.25e9  # 50 Gb/s per chip
  inside = topology.group_levels([2, 64], [1], two)
  assert [lv.link for lv in inside] == ["ici", "ici", "ici"]
  # The same 128 chips as one slice (the pod holds 8,960): no network.
  one = hardware.parse_cluster("tpu-v5p:128")
  assert one.slices == 0 and str(one) == "tpu-v5p:128"
  assert "dcn" not in [lv.link for lv in topology.group_levels([128], [0], one)]
  # Hierarchical: reduced inside each slice first, so 1/128 of the bytes
  # cross the network (each way), after the three torus rings.
  on_torus = topology.collective_time("allreduce", 2**30, across[:3])
  dcn = across[-1]
  assert topology.collective_time("allreduce", 2**30, across) == pytest.approx(
      on_torus + 2 * (2**30 / 128 / dcn.bytes_per_s + dcn.latency_s))
  assert hardware.parse_cluster(" tpu-v4 : 2 x 3072 ").count == 6144
  for spec, message in (("a100-80gb:2x8", "a100-80gb is a GPU: write a100-80gb:16"),
                        ("tpu-v4:2x8192", "larger than tpu-v4's largest \\(4096\\)"),
                        ("tpu-v3:2x3", "whole chips of 2 devices"),
                        ("tpu-v5p:0x64", "number of slices must be positive"),
                        ("tpu-v5p:2y64", "tpu-v5p:2x64")):
    with pytest.raises(ValueError, match=message):
      hardware.parse_cluster(spec)


def test_product_rates_follow_the_activation_dtype():
  a100, v100, tpu = (hardware.preset(n) for n in ("a100-80gb", "v100-32gb", "tpu-v4"))
  # A100: TF32 tensor cores for float32 (TensorFlow's default), half the 16-bit rate.
  assert a100.matrix_flops_per_s("float32") == 156e12
  assert a100.matrix_flops_per_s("bfloat16") == a100.matrix_flops_per_s("float16") == 312e12
  assert hardware.preset("h100-sxm").matrix_flops_per_s("float32") == 494.5e12
  # V100: float16 tensor cores only; bfloat16 and float32 run on its FP32 units.
  assert v100.matrix_flops_per_s("float16") == 125e12
  assert v100.matrix_flops_per_s("bfloat16") == v100.matrix_flops_per_s("float32") == 15.7e12
  assert hardware.preset("v100").name == "v100-32gb"
  assert hardware.preset("v100-16gb").hbm_bytes == 16e9
  assert "fp16" in hardware.describe(hardware.parse_cluster("v100-16gb:16"))
  # A TPU multiplies float32 operands in bfloat16 passes (XLA's default precision).
  assert tpu.matrix_flops_per_s("float32") == tpu.peak_flops_per_s
  assert tpu.for_products("float32") is tpu
  assert a100.for_products("float32").peak_flops_per_s == 156e12
  assert a100.slower_products_note("bfloat16") is None
  note = v100.slower_products_note("bfloat16")
  assert "15.7 TFLOP/s" in note and "no bfloat16" in note and "'float16'" in note
  assert "'bfloat16'" in a100.slower_products_note("float32")
  for name, h in hardware.PRESETS.items():
    assert "float32_flops_per_s" in h.sources, name


def test_json_hardware_product_rate_fields(tmp_path):
  data = json.loads(hardware.preset("a100-80gb").to_json())
  del data["float32_flops_per_s"], data["bfloat16"]
  path = tmp_path / "m.json"
  path.write_text(json.dumps(data))
  h = hardware.parse_cluster(f"{path}:8").hardware
  # Left out: float32 products at the peak, bfloat16 supported.
  assert h.matrix_flops_per_s("float32") == h.matrix_flops_per_s("bfloat16") == 312e12
  data.update(float32_flops_per_s=400e12)
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match="float32_flops_per_s must be between 0"):
    hardware.parse_cluster(f"{path}:8")
  data.update(float32_flops_per_s=19.5e12, bfloat16="no")
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match="bfloat16 must be true or false"):
    hardware.parse_cluster(f"{path}:8")
