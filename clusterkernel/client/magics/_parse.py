"""How the magics read their options: one short error per mistake, with "did you mean".

:func:`parse` runs a magic's parser (``start_args``, ...) and turns argparse's errors
into one :class:`UsageError` line naming the magic: an unknown option with the
nearest known one, a bad choice with the nearest choice, a bad number with what to
write (:func:`number_type` makes the numeric options' types). :func:`unknown_subcommand`
is the same for ``%mpi NAME``.

Example::

    parse(start_args, "-n 4").n              # 4
    parse(start_args, "--fault-tolerent")    # UsageError: %mpi start: unknown option
                                             # --fault-tolerent. Did you mean --fault-tolerant?
"""

from __future__ import annotations

import argparse
import difflib
import math
from collections.abc import Callable, Iterable
from typing import Any, cast

from IPython.core.error import UsageError
from IPython.core.magic_arguments import arg_split


def number_type(
    kind: type,
    flag: str,
    what: str,
    example: str,
    least: float,
    above: bool = False,
    hint: str = "",
) -> Callable[[str], float]:
    """An argparse ``type`` for ``flag``: a finite ``kind`` of at least ``least`` (more
    than it when ``above``); anything else is refused saying what to write.

    Example::

        ranks = number_type(int, "-n", "a number of ranks, 1 or more", "4", 1)
        ranks("0")   # ArgumentTypeError: -n takes a number of ranks, 1 or more, e.g. -n 4; got 0
    """

    def check(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < least or above and value == least:
            raise argparse.ArgumentTypeError(
                f"{flag} takes {what}, e.g. {flag} {example}{hint}; got {text}"
            )
        return value

    check.__name__ = kind.__name__
    return check


def duration_type(text: str) -> str:
    """``--every``: a duration ``parse_every`` reads (60s, 5m, 1h), kept as typed."""
    from clusterkernel.client.profile import parse_every

    try:
        parse_every(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def without_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a word outside quotes: a magic's line reads
    like a line of Python (``%mpi start -n 4  # four ranks``), where IPython hands the
    comment to the magic.

    Example: ``without_comment("-n 4  # four ranks")`` is ``"-n 4"``.
    """
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def parse(func: Callable, line: str) -> argparse.Namespace:
    """The options of ``line`` by the parser of magic ``func`` (``start_args``, ...).

    A mistake is one short :class:`UsageError` naming the magic: an unknown option with
    the nearest one (``Did you mean --fault-tolerant?``), a bad choice with the nearest
    choice, a bad number with what to write. A value that starts with ``-`` is a value
    (``--every -5s`` is read as ``--every=-5s``, and refused as that).
    """
    parser: argparse.ArgumentParser = cast(Any, func).parser  # made by @magic_arguments
    parser.exit_on_error = False  # argparse's own errors come here, with the option named
    try:
        argv = arg_split(line, strict=True)
        args, extra = parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        retry = _joined(argv, e) if "expected one argument" in e.message else None
        if retry is not None:
            return parse(func, retry)
        raise UsageError(f"{parser.prog}: {_explain(parser, e)}") from None
    except (UsageError, ValueError) as e:  # required arguments missing; unclosed quotes
        raise UsageError(f"{parser.prog}: {e}. {_usage(parser)}") from None
    if extra:
        raise UsageError(f"{parser.prog}: {_unknown(parser, extra)}")
    return args


def _joined(argv: list[str], e: argparse.ArgumentError) -> str | None:
    """``argv`` as a line with the option's next word as its value (``--every=-5s``), when
    that word starts with ``-`` and is no option; else None."""
    flags = (e.argument_name or "").split("/")
    for i, word in enumerate(argv[:-1]):
        if word in flags and argv[i + 1].startswith("-") and "=" not in word:
            return " ".join([*argv[:i], f"{word}={argv[i + 1]}", *argv[i + 2 :]])
    return None


def _explain(parser: argparse.ArgumentParser, e: argparse.ArgumentError) -> str:
    """argparse's message for one option, short: our own types' messages name the option."""
    name, message = e.argument_name or "", e.message
    if message.startswith(name.split("/")[-1] + " "):
        return message
    action = next((a for a in parser._actions if name in _names(a)), None)
    if action is not None and action.choices and "invalid choice" in message:
        given = message.split("'")[1]
        near = _nearest(given, action.choices)
        choices = ", ".join(map(str, action.choices))
        return f"{name} {given!r} is not one of {choices}." + (
            f" Did you mean {near!r}?" if near else ""
        )
    if action is not None and "expected" in message:
        return f"{name} needs a value: {(action.help or '').replace('%%', '%')}"
    return f"{name}: {message}"


def _names(action: argparse.Action) -> tuple[str, ...]:
    return ("/".join(action.option_strings), str(action.metavar), action.dest)


def _unknown(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """What is wrong with the words the parser did not take: each unknown option with the
    nearest known one (the word after it is taken for its value), other words named."""
    options = [o for a in parser._actions for o in a.option_strings]
    said, guessed, after_option = [], True, False
    for word in extra:
        if word.startswith("-"):
            near = _nearest(word.partition("=")[0], options)
            guessed = guessed and near is not None
            said.append(f"unknown option {word}." + (f" Did you mean {near}?" if near else ""))
            after_option = "=" not in word
        elif not after_option:
            said.append(f"unexpected {word!r}.")
            guessed = False
        else:
            after_option = False
    return " ".join(said) + ("" if guessed else f" {_usage(parser)}")


def _nearest(given: str, known: Iterable[str]) -> str | None:
    """The known word nearest ``given`` (a typo of it), or None."""
    near = difflib.get_close_matches(given, [str(k) for k in known], n=1, cutoff=0.6)
    return near[0] if near else None


def _usage(parser: argparse.ArgumentParser) -> str:
    """The parser's usage on one line where it is short, else where to read it."""
    usage = " ".join(parser.format_usage().split())
    if len(usage) <= 80:
        return f"Usage: {usage}"
    return f"%mpi help {parser.prog.split()[-1]} lists its options."


def unknown_subcommand(given: str, known: Iterable[str]) -> str:
    """The message for ``%mpi strat``: the nearest subcommand, or them all on one line.

    Example::

        unknown_subcommand("strat", ["start", "stop"])
        # "Unknown subcommand 'strat'. Did you mean 'start'? (%mpi help lists them)"
    """
    known = sorted(known)
    near = _nearest(given, known)
    if near:
        return f"Unknown subcommand {given!r}. Did you mean {near!r}? (%mpi help lists them)"
    return f"Unknown subcommand {given!r}; %mpi takes {', '.join(known)} (%mpi help lists them)."
