"""MkDocs hooks: the site's home page is the repository's README (one text, two places), its `docs/` links made
relative to the site; the run-field reference is generated from the contract's declarations into run-fields.md
(one definition: nothing to regenerate by hand when a field is added)."""

from pathlib import Path

from spotrun.contract.spec import with_reference

README = Path(__file__).resolve().parents[1] / "README.md"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "run-fields.md":
        return with_reference(markdown)
    if page.file.src_uri != "index.md":
        return markdown
    text = README.read_text(encoding="utf-8").replace("](docs/", "](")
    return text.replace("The documentation lives in [`docs/`](index.md)",
                        "This site is the documentation, built from `docs/`")
