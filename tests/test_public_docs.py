"""Public names document themselves where users look: ``help()`` and their examples."""

from __future__ import annotations

import inspect

import clusterkernel
from clusterkernel import torchdist
from clusterkernel.partition import _sampler


def test_public_classes_document_themselves():
    for name in ("Cluster", "DataParallel", "PipelineParallel", "Trainer", "Dashboard"):
        assert "Example" in (getattr(clusterkernel, name).__doc__ or ""), name
    # help(X.__init__) of an nn.Module must not show nn.Module's own text
    for name in ("DataParallel", "PipelineParallel"):
        doc = inspect.getdoc(getattr(clusterkernel, name).__init__) or ""
        assert "Initialize internal Module state" not in doc and "Example" in doc, name


def test_the_loader_example_uses_the_call_that_works():
    doc = inspect.getdoc(_sampler.distributed_loader)
    assert "set_epoch(loader, epoch)" in doc and "loader.sampler.set_epoch" not in doc


def test_rank_side_torch_names_have_examples():
    for name in torchdist.__all__:
        obj = getattr(torchdist, name)
        if callable(obj) and not isinstance(obj, type):
            assert inspect.getdoc(obj), name
    assert "Example" in torchdist.__doc__
