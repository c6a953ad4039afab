"""Rewrite docs/configuration.md's knob table from the settings' field docs (``make docs``)."""

from pathlib import Path

from router.settings import settings_table

BEGIN, END = "<!-- settings:begin -->\n", "\n<!-- settings:end -->"

readme = Path(__file__).parents[1] / "docs" / "configuration.md"
text = readme.read_text()
head, rest = text.split(BEGIN, 1)
tail = rest.split(END, 1)[1]
readme.write_text(head + BEGIN + settings_table() + END + tail)
