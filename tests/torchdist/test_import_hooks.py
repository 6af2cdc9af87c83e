"""Taking an import hook out while another thread imports: with ``_import_hooks`` that
thread's import still finds its module; taking it out of ``sys.meta_path`` in place (as
the hooks once did) makes it skip the ``PathFinder`` and fail, which is what a rank's
cell met when it imported the user's module while the engine's thread imported torch.
Real imports, real threads: the other thread is held between two finders until the
hook is out."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import secrets
import sys
import threading

from clusterkernel.torchdist import _import_hooks


class _Finds(importlib.abc.MetaPathFinder):
    """A hook of ours: finds nothing here (torch's modules, in the real ones)."""

    def find_spec(self, name, path, target=None):
        return None


class _Gate(importlib.abc.MetaPathFinder):
    """The finder just before the PathFinder: holds the import there until told to go."""

    def __init__(self, name: str) -> None:
        self.name, self.here, self.go = name, threading.Event(), threading.Event()

    def find_spec(self, name, path, target=None):
        if name == self.name:
            self.here.set()
            self.go.wait(10)
        return None


def _import_while_taken_out(tmp_path, monkeypatch, take_out) -> BaseException | None:
    name = f"ck_hooked_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the suite's own, after
    hook, gate = _Finds(), _Gate(name)
    where = next(i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder)
    sys.meta_path.insert(where, gate)
    _import_hooks.add(hook)
    failed: list[BaseException | None] = [None]

    def importing() -> None:
        try:
            assert importlib.import_module(name).X == 1
        except BaseException as e:  # noqa: BLE001 - what the other thread met is the result
            failed[0] = e

    thread = threading.Thread(target=importing)
    thread.start()
    assert gate.here.wait(10), "the import never reached the finder before the PathFinder"
    take_out(hook)
    gate.go.set()
    thread.join(10)
    assert not thread.is_alive()
    return failed[0]


def test_a_hook_taken_out_while_another_thread_imports_skips_no_finder(tmp_path, monkeypatch):
    assert _import_while_taken_out(tmp_path, monkeypatch, _import_hooks.remove) is None
    assert not any(isinstance(f, _Finds) for f in sys.meta_path)


def test_taken_out_in_place_the_other_thread_skips_the_path_finder(tmp_path, monkeypatch):
    # what CPython does with the list changed under its walk: why _import_hooks exists
    failed = _import_while_taken_out(tmp_path, monkeypatch, lambda h: sys.meta_path.remove(h))
    assert isinstance(failed, ModuleNotFoundError), failed
