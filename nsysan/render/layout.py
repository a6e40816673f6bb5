"""Tables and labelled lines laid out for the terminal's width, whatever it is.

A `Sheet` is a table that fits itself to the width it is printed at: numbers and units are never
cut, names (sites, NVTX ranges, kernels) are cut with `…` where a word or a `::` ends, columns
that still do not fit are left out (the note under the table says which), and below that the
table is stacked as `name: value` lines. `Lines` are labelled sentences (the answers, the
diagnostics) wrapped at words, a number never parted from its unit. Renderers build these and
print them; rich only draws what was decided here.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Union

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

NUMBER, WORD, NAME = "number", "word", "name"
# Names are first cut to this many cells before a column is left out; below it a name says too little.
COMFORTABLE_NAME = 24
# A name's first word longer than this is cut inside the word rather than widen its column further.
LONGEST_WORD = 30
ELLIPSIS = "…"


@dataclass(frozen=True)
class Column:
    """`kind`: NUMBER (right-aligned, never cut), WORD (left-aligned, never cut: a memory kind, an
    error name) or NAME (cut at a word boundary with `…`). `drop`: 0 for a column always shown,
    else the order in which columns are left out when the width is short (1 goes first)."""

    header: str
    kind: str = NUMBER
    drop: int = 0


Cell = Union[str, Text]


class Sheet:
    """A table fitted to the width it is printed at (see the module's docstring): a title, its
    columns, rows of cells (str or rich Text; a name's second line is shown dim), a caption."""

    def __init__(self, title: str, *columns: Column, caption: str = "") -> None:
        self.title, self.columns, self.caption = title, list(columns), caption
        self.rows: list[list[Cell]] = []

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def without(self, headers: Iterable[str]) -> "Sheet":
        """The sheet without these columns (a quick analysis has no values for them)."""
        gone = set(headers)
        keep = [i for i, c in enumerate(self.columns) if c.header not in gone]
        sheet = Sheet(self.title, *(self.columns[i] for i in keep), caption=self.caption)
        sheet.rows = [[row[i] for i in keep] for row in self.rows]
        return sheet

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        yield Lines.prose(self.title, style="bold")
        plan = plan_columns(self, width)
        notes = [self.caption] if self.caption else []
        if plan is None:
            yield from _stacked(self, width)
        else:
            keep, widths = plan
            yield _table(self, keep, widths)
            left_out = [c.header for i, c in enumerate(self.columns) if i not in keep]
            if left_out:
                notes.append(f"left out at {width} columns: {', '.join(left_out)} (a wider terminal or "
                             "--format json has them)")
        for note in notes:
            yield Lines.prose(note, indent=1, style="dim")


def plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _overhead(columns: int) -> int:
    """Cells a table of this many columns adds to its columns' widths: one blank at each edge and
    two between columns (the box and padding of `_table`)."""
    return 2 * columns


def plan_columns(sheet: Sheet, width: int) -> Optional[tuple[list[int], list[int]]]:
    """The columns kept and their widths, or None when even the columns always shown do not fit
    (the sheet is stacked then). Steps: every column at its widest; headers wrapped and names cut to
    COMFORTABLE_NAME cells; then columns left out in their `drop` order; then names cut to their
    first word."""
    cols = sheet.columns
    natural, floor, comfortable = [], [], []
    for i, col in enumerate(cols):
        cells = [line for row in sheet.rows for line in plain(row[i]).split("\n")]
        widest = max((cell_len(c) for c in cells), default=0)
        # A header may wrap at its spaces: its longest word is the narrowest it gets.
        header = max((cell_len(word) for word in col.header.split()), default=0)
        natural.append(max(widest, cell_len(col.header)))
        if col.kind == NAME:
            hard = max([_first_word_width(c) for c in cells] + [header, 1])
            floor.append(min(hard, max(widest, header)))
            comfortable.append(max(floor[-1], min(widest, COMFORTABLE_NAME), header))
        else:
            floor.append(max(widest, header))
            comfortable.append(floor[-1])
    if sum(natural) + _overhead(len(cols)) <= width:
        return list(range(len(cols))), natural
    droppable = sorted((c.drop, i) for i, c in enumerate(cols) if c.drop)
    for lowest in (comfortable, floor):
        keep = list(range(len(cols)))
        for _, gone in [(0, None)] + droppable:
            if gone is not None:
                keep.remove(gone)
            widths = _squeeze(natural, lowest, keep, cols, width)
            if widths is not None:
                return keep, widths
    return None


def _squeeze(natural: list[int], lowest: list[int], keep: list[int], cols: list[Column],
             width: int) -> Optional[list[int]]:
    """Widths for the kept columns within `width`: headers wrapped, then the widest name narrowed
    first, never below `lowest`; None if that is not enough."""
    widths = {i: (natural[i] if cols[i].kind == NAME else lowest[i]) for i in keep}
    room = width - _overhead(len(keep)) - sum(w for i, w in widths.items() if cols[i].kind != NAME)
    names = [i for i in keep if cols[i].kind == NAME]
    excess = sum(widths[i] for i in names) - room
    while excess > 0:
        narrowable = [i for i in names if widths[i] > lowest[i]]
        if not narrowable:
            return None
        widest = max(narrowable, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return [widths[i] for i in keep]


def fitted(sheet: Sheet, keep: list[int], widths: list[int]) -> tuple[list[str], list[list[Text]]]:
    """The headers (wrapped at their spaces) and cells of the kept columns as they are drawn:
    names cut to their column's width, numbers and words whole."""
    headers = []
    for i, w in zip(keep, widths):
        header = sheet.columns[i].header
        headers.append("\n".join(textwrap.wrap(header, w)) if cell_len(header) > w else header)
    rows = [[_fit_cell(row[i], w, sheet.columns[i].kind) for i, w in zip(keep, widths)] for row in sheet.rows]
    return headers, rows


def _table(sheet: Sheet, keep: list[int], widths: list[int]) -> Table:
    # Collapsed padding: two blanks between columns, one at each edge (_overhead counts them).
    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_header=True)
    headers, rows = fitted(sheet, keep, widths)
    for i, w, header in zip(keep, widths, headers):
        table.add_column(header, justify="right" if sheet.columns[i].kind == NUMBER else "left",  # type: ignore[arg-type]
                         no_wrap=True, width=w)
    for row in rows:
        table.add_row(*row)
    return table


def _fit_cell(cell: Cell, width: int, kind: str) -> Text:
    """The cell as text of at most `width` cells: a name cut at a word, continuation lines dim."""
    text = cell.copy() if isinstance(cell, Text) else Text(str(cell))
    if kind != NAME or "\n" not in text.plain and cell_len(text.plain) <= width:
        return text
    out = Text()
    for n, line in enumerate(text.plain.split("\n")):
        if n:
            out.append("\n")
        out.append(cut_name(line, width), style="dim" if n else (text.style or ""))
    return out


_WORD_CHAR = re.compile(r"\w")
# Characters left at the end of a cut name read as unfinished: "step 0 >", "f(", "a::".
_TRAILING = " >,;:([{<-/.=|"


def _inside_word(text: str, i: int) -> bool:
    return bool(_WORD_CHAR.match(text[i - 1]) and _WORD_CHAR.match(text[i]))


def cut_name(name: str, width: int) -> str:
    """`name` in at most `width` cells: whole, or cut where a word or a `::` ends, then `…`.
    A first word wider than the column is cut inside it (the column could not be wider)."""
    if cell_len(name) <= width:
        return name
    best = ""
    for i in range(1, len(name)):
        if _inside_word(name, i):
            continue
        prefix = name[:i].rstrip(_TRAILING)
        if prefix and cell_len(prefix) + 1 <= width:
            best = prefix
        elif cell_len(name[:i]) > width:
            break
    if best:
        return best + ELLIPSIS
    # No boundary early enough: cut the first word itself (a mangled symbol wider than LONGEST_WORD).
    return _head(name, width - 1) + ELLIPSIS


def _head(text: str, width: int) -> str:
    """The longest start of `text` that fits in `width` cells."""
    head = ""
    for ch in text:
        if cell_len(head + ch) > width:
            break
        head += ch
    return head


def _first_word_width(name: str) -> int:
    """The narrowest a name's column can be with the name cut at a word: its first word and `…`."""
    for i in range(1, len(name)):
        if not _inside_word(name, i):
            prefix = name[:i].rstrip(_TRAILING)
            if prefix:
                return min(cell_len(prefix) + 1, cell_len(name), LONGEST_WORD)
    return min(cell_len(name), LONGEST_WORD)


def _stacked(sheet: Sheet, width: int) -> Iterator["Parts"]:
    """Each row as its first cell, then `header: value` for the others, wrapped under it."""
    first, rest = sheet.columns[0], list(enumerate(sheet.columns))[1:]
    for row in sheet.rows:
        head = plain(row[0]).split("\n")[0]
        parts = [cut_name(head, width - 2) if first.kind == NAME else head]
        for i, col in rest:
            value = plain(row[i]).split("\n")[0]
            if not value:
                continue
            if col.kind == NAME:
                value = cut_name(value, max(width - 4 - cell_len(col.header) - 2, 8))
            parts.append(f"{col.header}: {value}")
        yield Parts(parts, indent=1, hanging=3, separator="  ")


# A unit a number is never parted from when a sentence wraps ("2.8 GiB", "10.125 s", "(84 MiB),").
_UNIT = re.compile(r"^(B|KiB|MiB|GiB|TiB|PiB|ns|µs|us|ms|s|%)(/step)?[^\w]*$")
_NUMBER_END = re.compile(r"[0-9]$")


def words(text: str) -> list[str]:
    """`text` split at its spaces, a number kept with the unit after it."""
    out: list[str] = []
    for token in text.split(" "):
        if out and _NUMBER_END.search(out[-1]) and _UNIT.match(token):
            out[-1] += " " + token
        else:
            out.append(token)
    return out


def wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` cells, broken at spaces only, a number kept with its unit;
    a word wider than a line (a long name) is cut into pieces."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in words(paragraph):
            while cell_len(word) > width:  # wider than a line: no space to break at
                if line:
                    lines.append(line)
                    line = ""
                piece = _head(word, width)
                lines.append(piece)
                word = word[len(piece):]
            if not line:
                line = word
            elif cell_len(line) + 1 + cell_len(word) <= width:
                line += " " + word
            else:
                lines.append(line)
                line = word
        lines.append(line)
    return lines


class Lines:
    """Labelled sentences in two columns: the label, then the text wrapped at words in its own
    column ("peak     5.3 GiB on GPU 0 ..."). The width is the one printed at."""

    def __init__(self, rows: Iterable[tuple[Cell, str]] = (), indent: int = 1, gap: int = 1,
                 style: str = "", label_width: Optional[int] = None, hanging: int = 0) -> None:
        """`hanging`: how much further in a sentence's following lines start, where there is no label."""
        self.rows = list(rows)
        self.indent, self.gap, self.style, self.label_width, self.hanging = indent, gap, style, label_width, hanging

    def add(self, label: Cell, text: str) -> None:
        self.rows.append((label, text))

    @classmethod
    def prose(cls, text: str, indent: int = 0, style: str = "") -> "Lines":
        """One paragraph, no label (a title, a note)."""
        return cls([("", text)], indent=indent, gap=0, style=style, label_width=0)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        labels = [lab if isinstance(lab, Text) else Text(str(lab)) for lab, _ in self.rows]
        label_width = self.label_width if self.label_width is not None else \
            max((cell_len(lab.plain) for lab in labels), default=0)
        text_at = self.indent + label_width + (self.gap if label_width else self.hanging)
        room = max(width - text_at, 12)
        out = Text(style=self.style)
        for label, (_, text) in zip(labels, self.rows):
            for n, line in enumerate(wrap(text, room)):
                out.append(" " * self.indent)
                if label_width:
                    if n == 0:
                        out.append(label)
                        out.append(" " * (label_width - cell_len(label.plain) + self.gap))
                    else:
                        out.append(" " * (label_width + self.gap))
                elif n:
                    out.append(" " * self.hanging)
                out.append(line + "\n")
        out.rstrip()
        yield out


def print_headline(console: Console, text: str, style: str = "") -> None:
    """A verdict line: wrapped at words on a terminal; one line elsewhere (a CI log, a file), for grep."""
    if console.is_terminal:
        console.print(Lines.prose(text, style=style))
    else:
        console.print(Text(text, style=style), soft_wrap=True)


class Parts:
    """Phrases ("duration 877.42 ms", "NVTX: yes") joined by a separator and wrapped between
    them, never inside one unless it is wider than the line."""

    def __init__(self, parts: list[str], indent: int = 0, hanging: int = 2, separator: str = " · ",
                 style: str = "") -> None:
        self.parts, self.indent, self.hanging, self.separator, self.style = parts, indent, hanging, separator, style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = join_parts(self.parts, options.max_width, self.indent, self.hanging, self.separator)
        yield Text("\n".join(lines), style=self.style)


def join_parts(parts: list[str], width: int, indent: int = 0, hanging: int = 2, separator: str = " · ") -> list[str]:
    """The parts on as few lines as fit `width`, each line starting with `indent` blanks, the
    following ones with `indent + hanging`; a part wider than a line is wrapped at its words."""
    lines: list[str] = []
    line = ""
    for part in parts:
        lead = " " * (indent if not lines and not line else indent + hanging)
        if line and cell_len(line) + len(separator) + cell_len(part) <= width:
            line += separator + part
            continue
        if line:
            lines.append(line)
            lead = " " * (indent + hanging)
        pieces = wrap(part, max(width - len(lead), 12))
        lines += [lead + p for p in pieces[:-1]]
        line = lead + pieces[-1]
    if line:
        lines.append(line)
    return lines
