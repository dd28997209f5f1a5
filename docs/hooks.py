"""MkDocs hook: the site's home page is the repository's README (one text, two places), its `docs/` links made
relative to the site."""

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "index.md":
        return markdown
    text = README.read_text(encoding="utf-8").replace("](docs/", "](")
    return text.replace("The documentation lives in [`docs/`](index.md)",
                        "This site is the documentation, built from `docs/`")
