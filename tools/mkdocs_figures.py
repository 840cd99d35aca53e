"""mkdocs hook: figures in the manual come from files the benchmark scripts write, never typed by hand.

A line of a page that is exactly ``--8<-- "figures/NAME"`` (the include syntax of pymdownx snippets, so
the pages read the same with that extension) is replaced by the file ``docs/figures/NAME``, which a
script in ``benchmarks/`` wrote (``--figures docs/figures/NAME``; ``benchmarks/figures.py`` lists them
and checks that each names its script and is shown by a page). A missing file fails the build.
Registered in ``mkdocs.yml`` under ``hooks:``.
"""
from __future__ import annotations

import os
import re
from typing import Any

from mkdocs.exceptions import PluginError

INCLUDE = re.compile(r'^--8<-- "(figures/[A-Za-z0-9_.-]+)"\s*$', re.MULTILINE)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = config["docs_dir"]

    def figure(match: re.Match[str]) -> str:
        path = os.path.join(docs_dir, match.group(1))
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read().rstrip("\n")
        except OSError as exc:
            raise PluginError(f"{page.file.src_path}: figure {match.group(1)} is missing ({exc.strerror}); run the "
                              f"benchmark script its page names with --figures") from None

    return INCLUDE.sub(figure, markdown)
