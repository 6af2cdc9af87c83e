"""The pieces of the asynchronous modes that need no second rank: shards, the
flat view of a model, gradient compression, the server's update rule."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from clusterkernel.train.ps._codec import GradientCodec
from clusterkernel.train.ps._flat import FlatParams, shard_ranges
from clusterkernel.train.ps._shard import make_rule


@settings(deadline=None)
@given(st.integers(1, 10_000), st.integers(1, 16))
def test_shards_cover_everything_in_order_and_differ_by_at_most_one(numel, shards):
    if numel < shards:
        with pytest.raises(ValueError, match="at most"):
            shard_ranges(numel, shards)
        return
    ranges = shard_ranges(numel, shards)
    assert ranges[0][0] == 0 and ranges[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 2))


def test_flat_read_write_roundtrip_and_pieces_across_layers():
    net = _net()
    flat = FlatParams(net)
    assert flat.numel == 5 * 3 + 3 + 3 * 2 + 2
    v = flat.read()
    assert torch.equal(v, torch.cat([p.detach().reshape(-1) for p in net.parameters()]))
    flat.write(torch.arange(4.0), start=14)  # last weight of layer 1, first 3 biases
    w = flat.read()
    assert torch.equal(w[14:18], torch.arange(4.0))
    assert torch.equal(w[:14], v[:14]) and torch.equal(w[18:], v[18:])
    assert net[0].weight[2, 4] == 0.0 and torch.equal(net[0].bias, torch.tensor([1.0, 2, 3]))


def test_flat_gradients_are_zero_where_a_parameter_has_none():
    net = _net()
    net[2](torch.ones(1, 3)).sum().backward()  # only the last layer gets gradients
    g = FlatParams(net).read_grads()
    assert torch.count_nonzero(g[:18]) == 0 and torch.count_nonzero(g[18:]) > 0


def test_flat_needs_one_floating_dtype():
    net = _net()
    net[2].double()
    with pytest.raises(ValueError, match="one dtype"):
        FlatParams(net)


@pytest.mark.parametrize("kind, tol", [(None, 0.0), ("fp16", 1e-3)])
def test_dense_codecs_roundtrip(kind, tol):
    codec = GradientCodec(kind, 1000, torch.float32)
    g = torch.randn(1000)
    buf = np.empty(codec.max_bytes, np.uint8)
    n = codec.encode(g, buf)
    assert n == (4000 if kind is None else 2000)
    out = codec.decode(buf[:n], torch.empty(1000))
    assert torch.allclose(out, g, atol=tol, rtol=tol)


def test_topk_sends_the_largest_and_feeds_the_error_back():
    codec = GradientCodec("topk", 100, torch.float32, ratio=0.1)
    buf = np.empty(codec.max_bytes, np.uint8)
    g = torch.randn(100)
    n = codec.encode(g, buf)
    sent = codec.decode(buf[:n], torch.empty(100))
    assert torch.count_nonzero(sent) == 10
    kept = g.abs().topk(10).indices
    assert torch.equal(sent[kept], g[kept])
    # error feedback: what was left out is added to the next gradient, so over
    # many steps what arrives plus what is still held equals what was pushed
    total_in, total_out = g.clone(), sent.clone()
    for _ in range(50):
        g = torch.randn(100)
        total_in += g
        total_out += codec.decode(buf[: codec.encode(g, buf)], torch.empty(100))
    assert torch.allclose(total_out + codec.residual, total_in, atol=1e-4)


def test_a_message_of_the_wrong_size_is_refused():
    codec = GradientCodec(None, 10, torch.float32)
    with pytest.raises(ValueError, match="disagree on the model"):
        codec.decode(np.zeros(36, np.uint8), torch.empty(10))


@settings(max_examples=20, deadline=None)  # building the first optimizer is slow
@given(st.floats(1e-4, 1.0), st.floats(0.0, 0.99))
def test_server_rule_copies_the_workers_optimizer(lr, momentum):
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, nesterov=False)
    rule = make_rule(opt, None, None)(nn.Parameter(torch.zeros(3)))
    assert type(rule) is torch.optim.SGD
    group = rule.param_groups[0]
    assert group["lr"] == lr and group["momentum"] == momentum


def test_server_rule_adam_takes_the_workers_lr_unless_given():
    opt = torch.optim.SGD(_net().parameters(), lr=0.3)
    assert make_rule(opt, "adam", None)(nn.Parameter(torch.zeros(1))).param_groups[0]["lr"] == 0.3
    rule = make_rule(opt, "adam", {"lr": 0.01})(nn.Parameter(torch.zeros(1)))
    assert type(rule) is torch.optim.Adam and rule.param_groups[0]["lr"] == 0.01


def test_server_rule_refuses_groups_with_different_settings():
    net = _net()
    opt = torch.optim.SGD(
        [{"params": net[0].parameters(), "lr": 0.1}, {"params": net[2].parameters(), "lr": 0.2}]
    )
    with pytest.raises(ValueError, match="different settings"):
        make_rule(opt, None, None)
    with pytest.raises(ValueError, match="cannot build"):
        make_rule(opt, "sgd", {"lr": 0.1, "bogus": 1})
