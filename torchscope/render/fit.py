"""Terminal tables that cut names, never figures.

When a table is wider than the terminal, rich shrinks every no-wrap column alike, so figures came out as
`15.41 …` and headers as `ca…`. `fit_names` gives the figures their full width and lets the name
columns (operators, kernels, files) share what is left, cut with an ellipsis: the JSON has them whole.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

MIN_NAME = 12  # below this a name says nothing; the figures are then squeezed by rich as before


def _cell_width(cell: object) -> int:
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return max((cell_len(line) for line in text.splitlines()), default=0)


def fit_names(table: Table, width: int, names: dict[str, int]) -> Table:
    """Set `max_width` of the columns headed as the keys of `names` (after the rows are added) so that the
    table fits in `width` with every other column at its natural width. The name columns share the room by
    their weights (`names`' values); one that needs less than its share keeps its natural width and leaves
    the rest to the others. None is cut below MIN_NAME."""
    _, right, _, left = table.padding
    natural = {c.header: max([_cell_width(c.header), *map(_cell_width, c.cells)]) for c in table.columns}
    borders = (2 if table.box and table.show_edge else 0) + (len(table.columns) - 1 if table.box else 0)
    fixed = sum(w for header, w in natural.items() if header not in names)
    room = width - borders - (left + right) * len(table.columns) - fixed
    widths = _share(room, {h: natural[h] for h in names if h in natural}, names)
    for column in table.columns:
        if column.header in widths:
            header = str(column.header)
            column.max_width = max(min(MIN_NAME, natural[header]), widths[header])
    return table


def _share(room: int, wanted: dict[str, int], weights: dict[str, int]) -> dict[str, int]:
    """Weighted water-filling: columns that fit in their share are settled at their natural width first."""
    widths: dict[str, int] = {}
    open_ = dict(wanted)
    while open_:
        total = sum(weights[h] for h in open_)
        fits = {h: w for h, w in open_.items() if w <= room * weights[h] // total}
        if not fits:
            widths.update({h: room * weights[h] // total for h in open_})
            break
        widths.update(fits)
        room -= sum(fits.values())
        open_ = {h: w for h, w in open_.items() if h not in fits}
    return widths
