"""Hardware profiles: every shipped file loads, carries a source, and typos get clear errors."""

import pytest

import hardware_profiles
from planner import GPU, Cluster, Link, SpecError

REQUIRED_GPUS = ["v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200",
                 "l40s", "mi300x"]
REQUIRED_LINKS = ["nvlink3", "nvlink4", "nvlink5", "pcie4", "pcie5", "ib-hdr", "ib-ndr",
                  "roce-400g", "eth-100g"]


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpu_profiles_load_with_source(name: str) -> None:
    data = hardware_profiles.load("gpus", name)
    assert data["source"]["document"] and data["source"]["url"].startswith("http")
    gpu = GPU.preset(name)
    assert gpu.memory_bytes > 16 * 1024**3
    assert gpu.memory_bandwidth_bytes_per_s > 5e11
    assert gpu.peak_flops("fp16") > gpu.peak_flops("fp32")
    Link.preset(gpu.intra_node_link)  # its default link exists


@pytest.mark.parametrize("name", REQUIRED_LINKS)
def test_required_links_load_with_source(name: str) -> None:
    data = hardware_profiles.load("links", name)
    assert data["source"]["document"]
    link = Link.preset(name)
    assert link.bandwidth_bytes_per_s > 1e9 and link.latency_s > 0


def test_capacity_is_what_cuda_gives_a_process() -> None:
    # torch.cuda.get_device_properties().total_memory of an H100 80GB HBM3, measured by
    # planner profile on 2026-11-22 (hardware_profiles/measured/h100-sxm-2026-11-22.toml):
    # 85,017,493,504 bytes, 79.18 GiB of the datasheet's 80; the driver keeps the rest.
    h100 = GPU.preset("h100-sxm")
    assert h100.memory_bytes == pytest.approx(85_017_493_504, rel=1e-5)
    assert hardware_profiles.load("gpus", "h100-sxm")["memory_gib"] == 80.0
    data = hardware_profiles.load("gpus", "h100-sxm")
    for bad in (81.0, 0, "79", True):
        with pytest.raises(SpecError, match="usable_memory_gib"):
            GPU.from_profile({**data, "usable_memory_gib": bad})
    assert GPU.from_profile({k: v for k, v in data.items() if k != "usable_memory_gib"}
                            ).memory_bytes == 80 * 1024**3


def test_published_figures_of_key_gpus() -> None:
    # NVIDIA H100 datasheet: 80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOP/s with sparsity (989.4
    # dense, H100 whitepaper). NVIDIA A100 datasheet: 80 GB, 2,039 GB/s, BF16 312 TFLOP/s.
    h100, a100 = GPU.preset("h100-sxm"), GPU.preset("a100-80gb")
    assert h100.peak_flops("bf16") == pytest.approx(989.4e12)
    assert h100.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert a100.peak_flops("bf16") == pytest.approx(312e12)
    assert a100.memory_bandwidth_bytes_per_s == pytest.approx(2.039e12)
    # NVLink 4 is 900 GB/s bidirectional per GPU: 450 GB/s one way; NDR is 400 Gb/s = 50 GB/s.
    assert Link.preset("nvlink4").bandwidth_bytes_per_s == pytest.approx(450e9)
    assert Link.preset("ib-ndr").bandwidth_bytes_per_s == pytest.approx(50e9)


def test_chips_without_a_format_say_so() -> None:
    with pytest.raises(SpecError, match="'v100-32gb' has no bf16"):
        GPU.preset("v100-32gb").peak_flops("bf16")
    assert not GPU.preset("a100-80gb").supports("fp8")


def test_every_shipped_profile_parses() -> None:
    for kind in hardware_profiles.KINDS:
        for name in hardware_profiles.names(kind):
            assert hardware_profiles.load(kind, name)["name"] == name


def test_cluster_presets() -> None:
    selene = Cluster.preset("selene", num_nodes=8)
    assert selene.num_gpus == 64 and selene.gpu.name == "a100-80gb"
    assert selene.intra_node_link.name == "nvlink3" and selene.inter_node_link.name == "ib-hdr"
    assert Cluster.preset("dgx-h100", num_nodes=2).num_gpus == 16
    generic = Cluster.preset("generic-ib", num_nodes=4, gpu="b200")
    assert generic.gpu.name == "b200" and generic.num_gpus == 32
    assert generic.intra_node_link.name == "nvlink5"  # the overriding GPU's own link
    custom = Cluster(gpu="a100-80gb", num_nodes=2, gpus_per_node=8)
    assert custom.intra_node_link.name == "nvlink3"  # the GPU's own link by default
    assert custom.inter_node_link.name == "ib-ndr"


@pytest.mark.parametrize(
    ("kind", "typo", "suggestion"),
    [("gpus", "h100sxm", "h100-sxm"), ("links", "nvlink-4", "nvlink4"),
     ("clusters", "selen", "selene")],
)
def test_typo_lists_known_names(kind: str, typo: str, suggestion: str) -> None:
    with pytest.raises(SpecError, match=f"Did you mean '{suggestion}'") as info:
        hardware_profiles.load(kind, typo)
    for name in hardware_profiles.names(kind):
        assert name in str(info.value)


def test_bad_cluster_shape() -> None:
    with pytest.raises(SpecError, match="num_nodes"):
        Cluster(gpu="h100-sxm", num_nodes=0)
    with pytest.raises(SpecError, match="unknown gpu 'h100'"):
        Cluster(gpu="h100", num_nodes=1)


def test_profile_file_errors(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed")
    with pytest.raises(SpecError, match="not valid TOML"):
        hardware_profiles.load_file(bad)
    with pytest.raises(SpecError, match="does not exist"):
        hardware_profiles.load_file(tmp_path / "missing.toml")


def test_a_profile_read_again_sees_a_fit_written_changed_or_removed_in_between(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hardware_profiles.load`` is memoized on the files it reads; a user's fit written,
    rewritten or removed between two reads (``planner calibrate``, ``--reset``) is seen by
    the next one, and a caller's edits to what it got do not reach the next caller."""
    monkeypatch.setenv("PLANNER_CONFIG_DIR", str(tmp_path))
    shipped = hardware_profiles.load("gpus", "a100-80gb")["efficiency"]["gemm"]
    fit = hardware_profiles.user_calibrated_path("a100-80gb")
    fit.parent.mkdir(parents=True)
    for gemm in (0.5, 0.25):
        fit.write_text(f'provenance = "test"\n[efficiency]\ngemm = {gemm}\n')
        got = hardware_profiles.load("gpus", "a100-80gb")
        assert got["efficiency"]["gemm"] == gemm
        got["efficiency"]["gemm"] = 0.9  # the next caller gets its own copy
    assert hardware_profiles.load("gpus", "a100-80gb")["efficiency"]["gemm"] == 0.25
    fit.unlink()
    assert hardware_profiles.load("gpus", "a100-80gb")["efficiency"]["gemm"] == shipped
