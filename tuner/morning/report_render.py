"""Markdown and self-contained HTML from a report's sections (``tuner.morning.report``).

Text blocks carry a little Markdown (``code``, **bold**, [links](relative/path)). report.html is
the same Markdown rendered by markdown-it-py (CommonMark + tables) with raw HTML off, so engine
text that reaches the report is escaped, and links with an unsafe scheme (``javascript:``,
``vbscript:``, ``file:``, ``data:`` other than images) stay text. Plots are PNGs under
``report/`` for the Markdown and base64 ``data:`` URIs in the HTML, so report.html needs no
other file (its boot-log links are relative to the campaign folder, like the Markdown's).
"""
from __future__ import annotations

import base64
import html as _html

import pandas as pd
from markdown_it import MarkdownIt

_MD = MarkdownIt("commonmark", {"html": False}).enable("table")


def _cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(none)_"
    head = "| " + " | ".join(_cell(c) for c in df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def title(report) -> str:
    return f"Morning report: {report.name}" + (" — no result" if getattr(report, "no_result", False) else "")


def markdown(report, img_src=None) -> str:
    """REPORT.md; ``img_src(name)`` gives an image's URL (default ``report/NAME.png``)."""
    pngs = report.pngs()
    img_src = img_src or (lambda name: f"report/{name}.png")
    out = [f"# {title(report)}", ""]
    for sec in report.sections:
        out += [f"## {sec.title}", ""]
        for kind, data in sec.blocks:
            if kind == "p":
                out.append(str(data))
            elif kind == "h3":
                out.append(f"### {data}")
            elif kind == "ul":
                out += [f"- {x}" for x in data]
            elif kind == "table":
                out.append(md_table(data))
            elif kind == "code":
                fence = "````" if "```" in str(data) else "```"
                out += [fence, str(data), fence]
            elif kind == "img":
                name, alt = data
                if name in pngs:
                    out.append(f"![{alt}]({img_src(name)})")
                else:
                    out.append(f"_({getattr(report, 'plot_note', None) or 'plot ' + name + ' not drawn'})_")
            out.append("")
    src = f"`{report.folder.name}/journal.jsonl`" if (report.folder / "journal.jsonl").exists() or \
        not (report.folder / "shared.json").exists() else "the shared campaign's database (`shared.json`)"
    out.append(f"_Written by `tuner report` from {src}; "
               "`tuner export` gives every arm as CSV, JSON lines or Parquet._")
    return "\n".join(out).rstrip() + "\n"


_CSS = """body{font:14px/1.45 system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f2f2f2}tr:nth-child(even) td{background:#fafafa}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}code{background:#f2f2f2;padding:0 3px}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em}"""


def html(report) -> str:
    """report.html: the Markdown above rendered by markdown-it-py, plots inline as data: URIs."""
    pngs = report.pngs()
    md = markdown(report, img_src=lambda name: "data:image/png;base64," + base64.b64encode(pngs[name]).decode())
    body = _MD.render(md)
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{_html.escape(title(report))}</title><style>{_CSS}</style></head>\n<body>\n"
            + body + "\n</body></html>\n")
