"""A rank's sampled stacks as an icicle graph: plain SVG, no script, works offline.

The outermost frame is the top row and callees hang below it; a box's width is the
seconds its stack was sampled there. Hovering a box shows its function, file:line
and seconds (the SVG ``<title>``, which every browser and JupyterLab show without
JavaScript). Each rank's graph is drawn to one scale, so a slower rank's is wider.

Example::

    tree = flame_tree(profile.ranks[0])
    svg = icicle_svg(tree, scale=tree.seconds)   # '<svg ...>...</svg>'
"""

from __future__ import annotations

import html
import re
import zlib
from dataclasses import dataclass, field

from clusterkernel.protocol.records import UNNUMBERED_CELL

_ROW = 17  # px per stack level
_WIDTH = (
    100.0  # boxes are placed in percent of the output's width (no viewBox: text keeps its size)
)
_MAX_DEPTH = 48
_MIN_WIDTH = 0.05  # percent: narrower boxes are not drawn (their time is in the parent)
_MIN_TEXT = 1.5  # percent: narrower boxes get no label (a nested <svg> clips longer ones)
# a cell's file as ipykernel names it, where the rank did not name it (``cell_file``)
_CELL_FILE = re.compile(r"ipykernel_\d+[/\\]\d+\.py$|^<ipython-input-")
_LIBRARY = re.compile(r"[/\\]lib[/\\]python3[^/\\]*[/\\]|[/\\](site|dist)-packages[/\\]|^<frozen ")
_COLLECTIVE = re.compile(r"[/\\]clusterkernel[/\\]comm[/\\]|[/\\]torch[/\\]distributed[/\\]")


@dataclass
class Node:
    """One frame of the icicle: ``name`` (function), ``file``, ``line``, ``seconds`` of
    the samples through it, ``children`` by (file, line, function).

    Example::

        tree = flame_tree(data)
        [c.name for c in tree.children.values()]   # the outermost frames
    """

    name: str
    file: str = ""
    line: int = 0
    seconds: float = 0.0
    children: dict[tuple[str, int, str], Node] = field(default_factory=dict)

    def child(self, file: str, line: int, name: str) -> Node:
        key = (file, line, name)
        node = self.children.get(key)
        if node is None:
            node = self.children[key] = Node(name, file, line)
        return node


def flame_tree(data: dict, title: str = "all") -> Node:
    """The tree of one rank's samples (``rank._profile`` data): the main thread's
    stacks (the cells') from the top, each other thread's under a box of its own name;
    the main thread's time between cells (an empty stack) is no code and not drawn."""
    root = Node(title)
    for thread, stack, secs in data.get("stacks", []):
        if not stack:
            continue
        node = root
        node.seconds += secs
        if thread != "main":
            node = node.child("", 0, f"thread {thread}")
            node.seconds += secs
        for file, line, func in stack:
            node = node.child(cell_file(file), int(line or 0), func)
            node.seconds += secs
    return root


def icicle_svg(root: Node, scale: float | None = None, label: str = "") -> str:
    """The tree as an SVG icicle; ``scale``: the seconds the full width stands for
    (the slowest rank's, so ranks compare); ``label``: the SVG's accessible name."""
    total = scale or root.seconds or 1.0
    boxes: list[str] = []
    depth = _draw(root, 0.0, 0, _WIDTH / total, root.seconds or 1.0, boxes)
    height = (depth + 1) * _ROW
    name = html.escape(label or root.name, quote=True)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' class='ck-flame' role='img' "
        f"aria-label='{name}' width='100%' height='{height}' "
        f"style='display:block;font:11px monospace'>" + "".join(boxes) + "</svg>"
    )


def _draw(node: Node, x: float, depth: int, per_s: float, whole: float, out: list[str]) -> int:
    """Append ``node``'s box and its children's; the deepest row drawn."""
    width = node.seconds * per_s
    if width < _MIN_WIDTH or depth >= _MAX_DEPTH:
        return depth - 1
    where = _where(node)
    tip = (
        f"{node.name} {where}".strip()
        + f"\n{node.seconds:.3f} s, {100 * node.seconds / whole:.1f}%"
    )
    label = (
        f"<text x='3' y='{_ROW - 5}' fill='#111' pointer-events='none'>"
        f"{html.escape(node.name)}</text>"
    )
    # a nested <svg> is its box's viewport: it clips the label at the box's edge
    out.append(
        f"<svg x='{x:.3f}%' y='{depth * _ROW}' width='{width:.3f}%' height='{_ROW - 1}'>"
        f"<rect width='100%' height='100%' fill='{_color(node)}' stroke='white' "
        f"stroke-width='0.5'><title>{html.escape(tip)}</title></rect>"
        f"{label if width >= _MIN_TEXT else ''}</svg>"
    )
    deepest = depth
    for child in sorted(node.children.values(), key=lambda c: -c.seconds):
        deepest = max(deepest, _draw(child, x, depth + 1, per_s, whole, out))
        x += child.seconds * per_s
    return deepest


def _where(node: Node) -> str:
    return f"({where(node.file, node.line)})" if node.file else ""


def cell_file(file: str) -> str:
    """``file`` as a profile shows it: a cell's file that the rank did not name
    (``/tmp/ipykernel_<pid>/<hash>.py``) is ``%%mpi cell``; others, ``Cell In[7]``
    included, are kept.

    Example::

        cell_file("/tmp/ipykernel_4242/3855724513.py")   # "%%mpi cell"
    """
    return UNNUMBERED_CELL if _CELL_FILE.search(file) else file


def is_cell(file: str) -> bool:
    """Whether ``file`` (as :func:`cell_file` gives it) is a cell's code.

    Example::

        is_cell("Cell In[7]")   # True
    """
    return file == UNNUMBERED_CELL or file.startswith("Cell In[")


def where(file: str, line: int) -> str:
    """Where a line is, as read in a table or a box: ``Cell In[7], line 3`` (as IPython
    names a cell's line), ``torch/nn/modules/module.py:1532`` for a file.

    Example::

        where("Cell In[7]", 3)   # "Cell In[7], line 3"
    """
    file = cell_file(file)
    return f"{file}, line {line}" if is_cell(file) else f"{short_path(file)}:{line}"


def _color(node: Node) -> str:
    """Own code warm, libraries grey-blue, collectives red, threads/roots grey."""
    if not node.file:
        return "#d9d9d9"
    h = zlib.crc32(f"{node.file}:{node.name}".encode()) % 40
    if _COLLECTIVE.search(node.file):
        return f"hsl({350 + h // 4},70%,70%)"
    if _LIBRARY.search(node.file) or "clusterkernel" in node.file:
        return f"hsl({200 + h},35%,78%)"
    return f"hsl({20 + h},85%,66%)"


def short_path(path: str) -> str:
    """A path as read in a table or a box: from the package on for libraries."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    m = re.search(r"[/\\]lib[/\\]python3[^/\\]*[/\\](.*)$", path)
    return m.group(1) if m else path
