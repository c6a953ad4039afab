"""docs/configuration.md's knob table is generated from the settings; this keeps it in
step, and the page names every settings group."""

from pathlib import Path

from router.settings import settings_table

README = Path(__file__).parents[2] / "docs" / "configuration.md"


def test_readme_carries_the_current_settings_table():
    text = README.read_text()
    section = text.split("<!-- settings:begin -->\n", 1)[1].split("\n<!-- settings:end -->", 1)[0]
    assert section.strip() == settings_table().strip(), "regenerate it: make docs"


def test_the_page_names_every_settings_group():
    from router.settings import RouterSettings

    intro = README.read_text().split("<!-- settings:begin -->", 1)[0]
    assert [g for g in RouterSettings.model_fields if f"`{g}`" not in intro] == []
