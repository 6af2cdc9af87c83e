"""What ``--profile`` takes, one type from the magic to the ranks (client side).

``%%mpi --profile [python|torch]``, ``cluster.run(code, profile=...)`` and ``%mpi
export --profile`` all take a :data:`ProfileKind`; ``run`` also takes ``True`` (Python
stacks) and ``False``/None (no profile), which :func:`profile_kind` turns into one.

Example::

    from clusterkernel.client.profile._kinds import profile_kind
    profile_kind(True), profile_kind("torch"), profile_kind(None)   # ('python', 'torch', None)
"""

from __future__ import annotations

from typing import Literal, get_args

ProfileKind = Literal["python", "torch"]
"""Python stacks, or those and torch.profiler's CPU ops."""

PROFILE_KINDS: tuple[ProfileKind, ...] = get_args(ProfileKind)


def profile_kind(profile: bool | str | None) -> ProfileKind | None:
    """``profile`` as a :data:`ProfileKind` (True: ``"python"``), None for no profile; a
    ``ValueError`` naming the kinds for anything else."""
    if profile is None or profile is False:
        return None
    if profile is True:
        return "python"
    if profile in PROFILE_KINDS:
        return profile
    raise ValueError(
        f"profile takes {' or '.join(PROFILE_KINDS)} (or True: python), got {profile!r}."
    )
