"""The README's knob table is generated from the settings; this keeps it in step."""

from pathlib import Path

from router.settings import settings_table

README = Path(__file__).parents[2] / "README.md"


def test_readme_carries_the_current_settings_table():
    text = README.read_text()
    section = text.split("<!-- settings:begin -->\n", 1)[1].split("\n<!-- settings:end -->", 1)[0]
    assert section.strip() == settings_table().strip(), "regenerate it: make docs"
