"""Models whose layers are of several kinds go through the one planner (issue 33): a traced
T5-style encoder-decoder (``planner.examples.EncoderDecoder``: encoder blocks, a norm,
decoder blocks with cross-attention) and a conv net without repeated blocks are costed by
the tables, searched, partitioned and round-tripped as a preset is. The oracles: a stage's
memory is the sum over its layers of their blocks' figures; the search and the stage DP
equal brute force; the blocks' FLOPs are the PaLM count of their matmuls (Chowdhery et al.
2022, App. B), the backward twice the forward."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from brute import search_equals_brute_force

torch = pytest.importorskip("torch")

from costmodel import Cluster, Job, ParallelConfig  # noqa: E402
from costmodel.errors import SpecError  # noqa: E402
from costmodel.formulas.arrays import ConfigArrays  # noqa: E402
from costmodel.formulas.checks import validate  # noqa: E402
from costmodel.formulas.layercosts import LayerCosts  # noqa: E402
from costmodel.formulas.memory import memory_table  # noqa: E402
from costmodel.trace.blockcosts import costs_from_graph  # noqa: E402
from costmodel.trace.graph import LayerGraph  # noqa: E402

ENC, DEC, D, SEQ, VOCAB = 3, 2, 128, 128, 512
NODE = Cluster(gpu="h100-sxm", num_nodes=1, gpus_per_node=8)


def _encoder_decoder(framework: str = "megatron") -> tuple[LayerCosts, Job]:
    from planner.examples import EncoderDecoder

    model = EncoderDecoder(vocab=VOCAB, dim=D, heads=4, encoder_layers=ENC, decoder_layers=DEC)
    graph = LayerGraph.from_module(model, torch.zeros(1, SEQ, dtype=torch.long),
                                   dtype=torch.bfloat16)
    job = Job(global_batch_size=16, seq_len=SEQ, framework=framework)
    return costs_from_graph(graph, NODE, job, tp_degrees=(1, 2)), job


@pytest.mark.slow  # traces an encoder-decoder: 3 s
def test_an_encoder_decoder_has_three_kinds_of_layer_with_their_flops() -> None:
    """Encoder blocks, the encoder's final norm and decoder blocks are the layers, in order;
    each block's FLOPs are its matmuls' (encoder: QKV, output and a 4d MLP, 12 d^2 per token,
    and the attention over s keys 4 s d; decoder: 16 d^2 with the cross-attention's
    projections, and two attentions), its backward twice that: the encoder's backward is
    its own, not the decoder's that reads its output."""
    costs, _ = _encoder_decoder()
    assert costs.layer_kinds == (0,) * ENC + (1,) + (2,) * DEC
    assert costs.num_layers == ENC + 1 + DEC and costs.kinds == 3
    enc, norm, dec = costs.layer_blocks()
    tokens = SEQ
    want = {enc.name: 2 * tokens * 12 * D * D + 4 * tokens * SEQ * D,
            dec.name: 2 * tokens * 16 * D * D + 2 * 4 * tokens * SEQ * D}
    for b in (enc, dec):
        c = b.at(1)
        assert c.forward_flops == pytest.approx(want[b.name], rel=0.01)
        assert c.backward_flops == pytest.approx(2 * c.forward_flops, rel=0.01)
    # At tp=2 the encoder's matmuls are all split; the decoder's cross-attention projects
    # the encoder's output with a slice of a packed weight (nn.MultiheadAttention), which
    # the ILP computes whole on each rank (those 4 s d^2 FLOPs of the 34 s d^2 or so are
    # not halved).
    assert enc.at(2).forward_flops == pytest.approx(enc.at(1).forward_flops / 2, rel=0.01)
    assert dec.at(2).forward_flops < 0.56 * dec.at(1).forward_flops
    assert norm.at(1).params == 2 * D and norm.at(1).forward_flops == 0


def test_a_stage_holds_the_sum_of_its_layers() -> None:
    """Memory table of a two-stage split at every cut: each stage's layer parameters and
    its layers of each kind are the sums over the layers it holds."""
    costs, job = _encoder_decoder()
    per_block = [b.at(1).params for b in costs.layer_blocks()]
    L = costs.num_layers
    configs = [ParallelConfig(dp=4, pp=2, stage_layers=(k, L - k)) for k in range(1, L)]
    a = ConfigArrays.from_configs(costs, configs)
    mem = memory_table(costs, NODE, job, a)
    kinds = costs.layer_kinds
    for row, k in enumerate(range(1, L)):
        for stage, held in enumerate((kinds[:k], kinds[k:])):
            assert mem.layer_params[stage, row] == pytest.approx(
                sum(per_block[x] for x in held), rel=1e-9)
            assert [int(mem.kind_layers[x, stage, row]) for x in range(3)] == \
                [held.count(x) for x in range(3)]


def test_uniform_stage_classes_are_exact_only_for_one_kind_after_the_first_chunk() -> None:
    """Four representative stage columns stand for every stage when the layers after the
    first stage's first chunk are all of one kind (a MoE model's leading dense layers
    inside it), not otherwise (an encoder-decoder)."""
    @dataclasses.dataclass
    class Model:
        layer_kinds: tuple[int, ...]

        @property
        def num_layers(self) -> int:
            return len(self.layer_kinds)

    moe = Model((0, 0) + (1,) * 14)  # two dense layers, then MoE
    assert ConfigArrays.classes_exact(moe, np.array([8]), np.array([1]))  # chunk of 2
    assert not ConfigArrays.classes_exact(moe, np.array([8]), np.array([2]))  # chunk of 1
    assert ConfigArrays.classes_exact(Model((0,) * 16), np.array([16]), np.array([1]))
    assert not ConfigArrays.classes_exact(Model((0,) * 8 + (1,) * 8), np.array([4]),
                                          np.array([1]))


@pytest.mark.slow  # brute force over an encoder-decoder's layouts: 4 s
def test_search_and_stage_dp_of_an_encoder_decoder_equal_brute_force() -> None:
    """The combined search over the encoder-decoder's LayerCosts is the fastest of
    ``estimate()`` over every valid row that fits; the stage DP of a pipelined row is the
    best split over every composition of its layers (where a stage starts matters)."""
    from planner.partition import brute_force, partition, stage_costs
    from planner.space import COLUMNS, Constraints

    costs, job = _encoder_decoder()
    cons = Constraints(max={"micro_batch_size": 2}, allowed={"recompute": ["none", "full"]},
                       fixed={"offload": "none"})
    space = search_equals_brute_force(costs, NODE, job, cons)
    # The decoder embeds the tokens after the encoder (and its norm): the first stage holds
    # those 4 layers, so 2 stages split [4, 2] and 4 would leave a stage without a layer.
    assert costs.first_stage_layers == ENC + 1
    assert 20 < space.rows < 3000 and set(space.table[:, COLUMNS.index("pp")]) == {1, 2}
    assert "pp_inputs" in space.rejected
    for cfg in (ParallelConfig(dp=4, pp=2), ParallelConfig(dp=4, pp=2, recompute="full")):
        sc = stage_costs(costs, NODE, job, cfg)
        assert sc.starts_matter
        cap = float(np.quantile(sc.memory[np.isfinite(sc.memory)], 0.8))
        per_stage = cfg.recompute == "full"
        found = partition(sc, costs.num_layers, cap, per_stage=per_stage)
        want = brute_force(sc, costs.num_layers, cap, per_stage=per_stage)
        assert found is not None and found.slowest == pytest.approx(want)


def test_an_encoder_decoder_plan_round_trips_and_explains() -> None:
    """``planner.plan`` of the module: a ``Plan`` with ZeRO, recompute and pipeline choices
    weighed in its why-not table, its JSON read back to the same estimate; a pipeline stage
    may cut between the encoder and the decoder."""
    import planner
    from planner.examples import EncoderDecoder

    model = EncoderDecoder(vocab=VOCAB, dim=D, heads=4, encoder_layers=ENC,
                           decoder_layers=DEC)
    job = Job(global_batch_size=16, seq_len=SEQ)
    p = planner.plan(model, NODE, job, example_inputs=torch.zeros(1, SEQ, dtype=torch.long),
                     constraints={"fixed": {"pp": 2}})
    assert isinstance(p, planner.Plan) and p.config.pp == 2
    assert sum(s.num_layers for s in p.estimate.stages) == ENC + 1 + DEC
    # The second stage starts at the decoder: a cut inside the encoder would leave the
    # decoder's embedding of the tokens, which torch's pipelining gives only the first
    # stage, to a later one (planner.runtime refuses such a cut), and validate says so.
    assert p.config.stage_layers == (ENC + 1, DEC)
    with pytest.raises(SpecError, match="first pipeline stage holds 3 layers"):
        validate(p.model, NODE, job, dataclasses.replace(p.config, stage_layers=(3, 3)))
    back = planner.Plan.from_json(p.to_json())
    assert back.model == p.model and back.config == p.config
    assert back.estimate.step_time_s == pytest.approx(p.estimate.step_time_s, rel=1e-12)
    assert planner.explain(p).choices


def test_a_conv_net_without_repeated_blocks_is_planned_layer_by_layer() -> None:
    """A plain ``nn.Sequential`` conv net: each of its modules with work is a layer of its
    own kind, and the search weighs pipelining them as it does a transformer's layers."""
    from torch import nn

    import planner
    from planner.space import COLUMNS, Constraints, build_space

    net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
                        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    job = Job(global_batch_size=256, seq_len=1)
    p = planner.plan(net, NODE, job, example_inputs=torch.zeros(8, 3, 32, 32))
    costs = p.model
    assert isinstance(costs, LayerCosts) and costs.kinds == costs.num_layers >= 4
    assert len(set(costs.layer_kinds)) == costs.kinds
    assert (build_space(costs, NODE, job, Constraints()).table[:, COLUMNS.index("pp")]
            > 1).any()
    two = planner.estimate(costs, NODE, job, ParallelConfig(dp=4, pp=2))
    assert [s.num_layers for s in two.stages] == [costs.num_layers // 2,
                                                 costs.num_layers - costs.num_layers // 2]
    assert sum(s.layer_params for s in two.stages) == pytest.approx(
        sum(b.at(1).params for b in costs.layer_blocks()))
