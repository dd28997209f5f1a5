"""MkDocs hooks: the site's home page is the repository's README (one text, two places), its `docs/` links made
relative to the site; the run-field reference is generated from the contract's declarations into run-fields.md
(one definition: nothing to regenerate by hand when a field is added)."""

from pathlib import Path

from spotrun.contract.spec import field_reference

README = Path(__file__).resolve().parents[1] / "README.md"
# The line of run-fields.md that the contract's field table replaces.
RUN_FIELDS_MARK = ("<!-- run-fields: the table is generated here when the site is built (docs/hooks.py, from "
                   "spotrun/contract/spec.py) -->")



def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "run-fields.md":
        if RUN_FIELDS_MARK not in markdown:
            raise ValueError(f"run-fields.md lost its mark {RUN_FIELDS_MARK!r}")
        return markdown.replace(RUN_FIELDS_MARK, field_reference())
    if page.file.src_uri != "index.md":
        return markdown
    text = README.read_text(encoding="utf-8").replace("](docs/", "](")
    return text.replace("The documentation lives in [`docs/`](index.md)",
                        "This site is the documentation, built from `docs/`")
