"""Terminal tables cut names, never figures (render/fit.py)."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table

from torchscope.render.fit import MIN_NAME, fit_names


def _table(names: list[str], launchers: list[str]) -> Table:
    table = Table(box=box.SIMPLE_HEAD)
    for header in ("kernel", "calls", "total", "mean", "launched by"):
        table.add_column(header, no_wrap=True, overflow="ellipsis", justify="left" if header in ("kernel", "launched by") else "right")
    for name, launcher in zip(names, launchers):
        table.add_row(name, "1,234", "775.25 ms", "38.76 ms", launcher)
    return table


def _render(table: Table, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    return out.getvalue().splitlines()


def test_figures_stay_whole_and_the_names_share_what_is_left() -> None:
    long_name = "void split_embedding_backward_codegen_rowwise_adagrad_kernel<float, 256>(...)" * 3
    table = fit_names(_table([long_name], ["fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function"]), 80, {"kernel": 2, "launched by": 1})
    lines = _render(table, 80)
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if "1,234" in line)
    assert "775.25 ms" in row and "38.76 ms" in row  # rich alone cut them to "775.2…" before
    header = next(line for line in lines if "calls" in line)
    assert "launched by" in header and "total" in header
    kernel = table.columns[0].max_width
    launcher = table.columns[4].max_width
    assert kernel is not None and launcher is not None and kernel > launcher >= MIN_NAME  # weights 2:1
    assert "…" in row


def test_a_short_name_column_keeps_its_width_and_leaves_the_rest_to_the_other() -> None:
    table = fit_names(_table(["k" * 200], ["aten::mm"]), 100, {"kernel": 2, "launched by": 1})
    assert table.columns[4].max_width == len("launched by")  # the header is its widest cell
    row = next(line for line in _render(table, 100) if "1,234" in line)
    assert row.rstrip().endswith("aten::mm") and len(row) <= 100


def test_names_that_fit_are_not_cut() -> None:
    table = fit_names(_table(["aten::addmm"], ["aten::linear"]), 100, {"kernel": 2, "launched by": 1})
    row = next(line for line in _render(table, 100) if "1,234" in line)
    assert "aten::addmm" in row and "aten::linear" in row and "…" not in row
