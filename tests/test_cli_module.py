"""A torch ``nn.Module`` of the user's own, named ``module:attr``: loaded on the meta device,
planned from its traced graph by ``planner plan`` and ``planner.plan``, and every misuse
turned into one line with exit status 2 (3 when nothing fits)."""

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


from inprocess import Result, run_planner  # noqa: E402

from costmodel import Cluster, Job, SpecError  # noqa: E402
from costmodel.trace.blockcosts import costs_from_graph  # noqa: E402
from planner import plan  # noqa: E402
from planner.models import load_model, load_model_or_module  # noqa: E402

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, d=256, heads=4):
            super().__init__()
            self.norm1 = nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.norm2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            h = self.norm1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))


    class TinyLM(nn.Module):
        def __init__(self, vocab=1000, d=256, layers=4):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            for b in self.blocks:
                x = b(x)
            return self.head(x)


    def tiny():
        return TinyLM(layers=2)


    instance = nn.Linear(8, 8)


    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

        def forward(self, x):
            return self.body(x)


    class Doubler(nn.Module):
        def forward(self, x):
            return 2 * x
''')
NODE = ["--gpus", "8", "--gpu", "h100-sxm"]


@pytest.fixture
def models_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "mymodels.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mymodels", None)  # another test's mymodels.py, imported in this process
    yield tmp_path
    sys.modules.pop("mymodels", None)


def cli(cwd: Path, *args: str) -> Result:
    return run_planner("plan", *args, cwd=cwd)


def test_load_model_or_module_builds_on_meta(models_dir: Path) -> None:
    net = load_model_or_module("mymodels:TinyLM")
    assert isinstance(net, torch.nn.Module)
    assert all(p.is_meta for p in net.parameters())  # no weights allocated
    assert len(load_model_or_module("mymodels:tiny").blocks) == 2  # a factory
    assert isinstance(load_model_or_module("mymodels:instance"), torch.nn.Linear)
    assert load_model_or_module("llama-3-8b").name == "llama-3-8b"  # a preset stays a spec
    with pytest.raises(SpecError, match=r"is a torch module .*'planner plan'"):
        load_model("mymodels:TinyLM")


def test_cli_plans_a_module_as_the_api_does(models_dir: Path) -> None:
    """A module of repeated blocks: traced, its blocks costed per TP degree, then the search
    a preset gets; the CLI prints and writes the same plan as ``planner.plan``."""
    r = cli(models_dir, "--model", "mymodels:TinyLM", *NODE, "--global-batch-size", "64",
            "--seq-len", "512", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["model"] is None and d["layer_costs"]["source"] == "graph"
    blocks = d["layer_costs"]["blocks"]
    assert [b["kind"] for b in blocks] == ["embedding", "layer", "head"]
    assert blocks[1]["repeat"] == 4 and blocks[1]["by_tp"]["1"]["kernels"]["gemms"]
    cfg, est = d["config"], d["estimate"]
    assert cfg["dp"] * cfg["tp"] * cfg["pp"] * cfg["cp"] == 8
    assert 0 < est["mfu"] < 1 and est["peak_memory_bytes"] > 0
    assert est["tokens_per_s"] == pytest.approx(64 * 512 / est["step_time_s"])
    assert all(a["step_time_s"] is None or a["step_time_s"] > 0 for a in d["alternatives"])
    # The API, given a function of the micro-batch size, plans the same.
    from mymodels import TinyLM

    with torch.device("meta"):
        net = TinyLM()
    found = plan(net, Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8),
                 Job(global_batch_size=64, seq_len=512),
                 example_inputs=lambda b: torch.zeros(b, 512, dtype=torch.long))
    assert found.config.to_dict() == cfg
    assert found.estimate.step_time_s == pytest.approx(est["step_time_s"], rel=1e-9)

    text = cli(models_dir, "--model", "mymodels:TinyLM", *NODE, "--global-batch-size", "64",
               "--seq-len", "512", "--tp", "2", "--why", "3")
    assert text.returncode == 0, text.stderr
    assert "(traced: 3 blocks, blocks.0 x4" in text.stdout
    assert " tp=2 " in text.stdout.splitlines()[1] and "why not" in text.stdout


@pytest.mark.slow  # traces a module and searches it at every fixed micro-batch: 3 s
def test_micro_batch_search_is_the_best_fixed_size(models_dir: Path) -> None:
    """Brute force over the micro-batch sizes: the search returns the fastest of them."""
    from mymodels import TinyLM

    from planner.space import Constraints

    with torch.device("meta"):
        net = TinyLM()
    cluster = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8)
    job = Job(global_batch_size=32, seq_len=256)
    ids = torch.zeros(1, 256, dtype=torch.long)
    fixed = [plan(net, cluster, job, example_inputs=ids,
                  constraints=Constraints(fixed={"micro_batch_size": b}))
             for b in (1, 2, 4, 8, 16, 32)]
    searched = plan(net, cluster, job, example_inputs=ids)
    assert searched.estimate.step_time_s == pytest.approx(
        min(f.estimate.step_time_s for f in fixed))


def test_cli_module_inputs_by_shape(models_dir: Path) -> None:
    r = cli(models_dir, "--model", "mymodels:ConvNet", *NODE, "--global-batch-size", "256",
            "--input-shape", "32x3x32x32")
    assert r.returncode == 0, r.stderr
    assert "samples/s" in r.stdout and "256 x 1 samples" in r.stdout
    assert "tokens" not in r.stdout.split("why not")[0]
    # Its saved plan is explained in samples too.
    r = cli(models_dir, "--model", "mymodels:ConvNet", *NODE, "--global-batch-size", "256",
            "--input-shape", "32x3x32x32", "-o", "conv.json")
    assert r.returncode == 0, r.stderr
    r = run_planner("explain", "conv.json", cwd=models_dir)
    assert r.returncode == 0, r.stderr
    assert "samples/s" in r.stdout and "tokens/s" not in r.stdout
    r = run_planner("compare", "--plan", "conv.json", "--plan", "conv.json", cwd=models_dir)
    assert r.returncode == 0, r.stderr
    assert "samples/s" in r.stdout and "smp/s/GPU" in r.stdout and "tok" not in r.stdout


def test_cli_module_fed_sequences_of_vectors_counts_their_tokens(models_dir: Path) -> None:
    # [batch, seq, hidden] inputs (a stack of blocks fed embeddings): --seq-len is their seq.
    r = cli(models_dir, "--model", "mymodels:Block", *NODE, "--global-batch-size", "64",
            "--input-shape", "2x16x256", "--seq-len", "16")
    assert r.returncode == 0, r.stderr
    assert "64 x 16 tokens" in r.stdout and "tokens/s" in r.stdout


@pytest.mark.parametrize("args, code, message", [
    (["--model", "mymodels:ConvNet", "--global-batch-size", "64"], 2, "--input-shape"),
    (["--model", "mymodels:ConvNet", "--global-batch-size", "64", "--seq-len", "8"], 2,
     "not an nn.Embedding"),
    (["--model", "mymodels:ConvNet", "--global-batch-size", "64", "--input-shape", "8x3xa"],
     2, "joined by x"),
    (["--model", "mymodels:ConvNet", "--global-batch-size", "64", "--input-shape", "0x3"],
     2, "positive"),
    (["--model", "mymodels:Doubler", "--global-batch-size", "64", "--input-shape", "8x16"],
     2, "has no parameters"),
    # Images are no token sequences: a sequence length would only relabel the throughput.
    (["--model", "mymodels:ConvNet", "--global-batch-size", "64", "--input-shape",
      "8x3x32x32", "--seq-len", "8"], 2, "not sequences of 8 tokens"),
    (["--model", "mymodels:TinyLM", "--global-batch-size", "64", "--seq-len", "8",
      "--inference"], 2, "is a torch module"),
    (["--model", "mymodels:TinyLM", "--gpus", "1", "--gpu", "a100-40gb", "--global-batch-size",
      "8", "--seq-len", "1000000", "--micro-batch-size", "8"], 3, "nothing fits"),
])
def test_cli_module_misuse(models_dir: Path, args: list[str], code: int, message: str) -> None:
    r = cli(models_dir, *args, *([] if "--gpus" in args else NODE))
    assert r.returncode == code, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_module_plan_files(models_dir: Path) -> None:
    """A module's plan file re-estimates and explains like a preset's, records the module
    it came from, and emits a torchtitan job config (the degrees, the stages' module paths,
    the TP plan in its header); the trainers whose files describe their own models refuse
    it by name. A conv net without repeated blocks is planned the same way (each of its
    modules a layer a pipeline stage may hold); a graph plan file of the planner that came
    before is refused by name."""
    out = models_dir / "m.json"
    r = cli(models_dir, "--model", "mymodels:tiny", *NODE, "--global-batch-size", "16",
            "--seq-len", "128", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["layer_costs"]["name"] == "TinyLM"
    e = run_planner("explain", str(out), cwd=models_dir)
    assert e.returncode == 0 and "why each choice" in e.stdout, e.stderr
    assert json.loads(out.read_text())["module"] == {
        "model": "mymodels:tiny", "input_shapes": [[1, 128]], "input_dtype": "int64"}
    pp = models_dir / "pp.json"
    r = cli(models_dir, "--model", "mymodels:tiny", *NODE, "--global-batch-size", "16",
            "--seq-len", "128", "--pp", "2", "--tp", "2", "-o", str(pp))
    assert r.returncode == 0, r.stderr
    e = run_planner("emit", str(pp), "--target", "torchtitan", cwd=models_dir)
    assert e.returncode == 0, e.stderr
    toml = tomllib.loads(e.stdout)
    assert toml["parallelism"]["pipeline_parallel_degree"] == 2
    assert toml["parallelism"]["tensor_parallel_degree"] == 2
    parts = toml["parallelism"]["module_fqns_per_model_part"]
    assert parts[0][:2] == ["embed", "blocks.0"] and parts[-1][-2:] == ["blocks.1", "head"]
    assert "#   blocks.*.mlp.0: colwise" in e.stdout and "#   blocks.*.mlp.2: rowwise" in e.stdout
    assert "#   blocks.*.attn: heads" in e.stdout  # nn.MultiheadAttention split by heads
    e = run_planner("emit", str(out), "--target", "deepspeed", cwd=models_dir)
    assert e.returncode == 2 and "takes the plan of a preset" in e.stderr
    # A Slurm script of a torchtitan plan starts torchtitan on that same job config.
    e = run_planner("emit", str(pp), "--target", "slurm", cwd=models_dir)
    assert e.returncode == 0, e.stderr
    assert "cat > torchtitan.toml" in e.stdout and "-m torchtitan.train" in e.stdout
    assert "pipeline_parallel_degree = 2" in e.stdout and "#SBATCH --nodes=1" in e.stdout
    graph = models_dir / "g.json"
    r = cli(models_dir, "--model", "mymodels:ConvNet", *NODE, "--global-batch-size", "64",
            "--input-shape", "8x3x32x32", "-o", str(graph))
    assert r.returncode == 0, r.stderr
    costs = json.loads(graph.read_text())["layer_costs"]
    assert [b["kind"] for b in costs["blocks"]].count("layer") >= 3
    e = run_planner("explain", str(graph), cwd=models_dir)
    assert e.returncode == 0 and "why each choice" in e.stderr + e.stdout, e.stderr
    old = models_dir / "old.json"
    old.write_text(json.dumps({"kind": "graph", "config": {"pp": 1}}))
    e = run_planner("explain", str(old), cwd=models_dir)
    assert e.returncode == 2 and "plan the module again" in e.stderr
    e = run_planner("estimate", "--model", "mymodels:TinyLM", "--gpus", "8",
                    "--global-batch-size", "16", "--seq-len", "128", cwd=models_dir)
    assert e.returncode == 2 and "'planner plan' plans it" in e.stderr


def test_graph_command_shows_blocks_costs_and_layouts(models_dir: Path) -> None:
    """``planner graph``: the traced layers, then each block's LayerCosts per TP degree
    (what ``costs_from_graph`` computes), and the forward graph with the chosen layouts
    as DOT and GraphML."""
    import networkx as nx

    from costmodel.trace.graph import LayerGraph
    from costmodel.trace.recorder import training_loss
    from planner.models import load_model_or_module

    r = run_planner("graph", "mymodels:TinyLM", "--seq-len", "64", "--tp", "1,2",
                    "--dot", "g.dot", "--graphml", "g.graphml", *NODE)
    assert r.returncode == 0, r.stderr
    # Traced from the loss planner plan costs (training_loss: the logits' cross entropy).
    graph = LayerGraph.from_module(load_model_or_module("mymodels:TinyLM"),
                                   torch.zeros(1, 64, dtype=torch.long), dtype=torch.bfloat16,
                                   loss_fn=training_loss)
    costs = costs_from_graph(graph, Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8),
                                  Job(global_batch_size=1, seq_len=64), tp_degrees=[1, 2])
    for t in (1, 2):
        assert costs.summary(t) in r.stdout
    block = next(b for b in costs.blocks if b.kind == "layer")
    assert block.repeat == 4 and block.at(2).params < block.at(1).params
    dot = (models_dir / "g.dot").read_text()
    assert dot.startswith('digraph "TinyLM"') and "layouts at tp=2" in dot
    assert 'label="blocks.0 x4"' in dot and " -> R,S(" in dot  # a split output at tp=2
    ml = nx.read_graphml(models_dir / "g.graphml")
    forward = [i for i in graph.graph.nodes if not graph.node(i).backward]
    assert ml.number_of_nodes() == len(forward)
    assert {d["layout"] for _, d in ml.nodes(data=True)} >= {"R,R", "R,S(2)"}
    js = run_planner("graph", "mymodels:TinyLM", "--seq-len", "64", "--tp", "2", "--json",
                     *NODE)
    got = json.loads(js.stdout)["layer_costs"]["blocks"]
    assert got[1]["by_tp"]["2"]["params"] == pytest.approx(block.at(2).params)


@pytest.mark.parametrize(("args", "message"), [
    (["--seq-len", "64", "--tp", "3"], "3 does not divide the 8 GPUs"),
    ([], "give --seq-len"),
    (["--seq-len", "64", "--tp", "1,2", "--layouts-tp", "4"], "not among the degrees"),
    (["--seq-len", "64", "--tp", "x"], "separated by commas"),
])
def test_graph_command_misuse(models_dir: Path, args: list[str], message: str) -> None:
    r = run_planner("graph", "mymodels:TinyLM", *args, *NODE)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_planner_run_trains_a_modules_plan(models_dir: Path) -> None:
    """``planner run`` of a module's plan file: the processes build the module the plan
    names (``mymodels:tiny``) and train it through the plan's pipeline on synthetic tokens
    of its traced shape."""
    out = models_dir / "run.json"
    r = cli(models_dir, "--model", "mymodels:tiny", "--gpus", "2", "--gpu", "h100-sxm",
            "--global-batch-size", "4", "--seq-len", "16", "--pp", "2", "--precision",
            "fp32", "-o", str(out))
    assert r.returncode == 0, r.stderr
    proc = subprocess.run([sys.executable, "-m", "planner", "run", str(out), "--",
                           "--steps", "2"], cwd=models_dir, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training TinyLM on 2 processes" in proc.stdout
    assert "step   2  loss" in proc.stdout
