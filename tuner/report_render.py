"""Markdown and self-contained HTML from a report's sections (``tuner.report``).

Text blocks carry a little Markdown (``code``, **bold**, [links](relative/path)); the HTML
renderer escapes everything and turns only those three into tags. Plots are PNGs under
``report/`` for the Markdown and base64 ``data:`` URIs in the HTML, so report.html needs no
other file (its boot-log links are relative to the campaign folder, like the Markdown's).
"""
from __future__ import annotations

import base64
import html as _html
import re

import pandas as pd

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(none)_"
    head = "| " + " | ".join(_cell(c) for c in df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def markdown(report) -> str:
    out = [f"# Morning report: {report.name}", ""]
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
                out.append(f"![{alt}](report/{name}.png)")
            out.append("")
    out.append(f"_Written by `tuner report` from `{report.folder.name}/journal.jsonl`; "
               "`tuner export` gives every arm as CSV, JSON lines or Parquet._")
    return "\n".join(out).rstrip() + "\n"


def inline(text: str) -> str:
    t = _html.escape(str(text), quote=True).replace("\\*", "*").replace("\\|", "|")
    t = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", t)
    t = _BOLD.sub(lambda m: f"<b>{m.group(1)}</b>", t)
    return _LINK.sub(lambda m: f'<a href="{m.group(2)}">{m.group(1)}</a>', t)


_CSS = """body{font:14px/1.45 system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f2f2f2}tr:nth-child(even) td{background:#fafafa}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}code{background:#f2f2f2;padding:0 3px}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em}"""


def html(report) -> str:
    pngs = report.pngs()
    body = [f"<h1>Morning report: {inline(report.name)}</h1>"]
    for sec in report.sections:
        body.append(f"<h2>{inline(sec.title)}</h2>")
        for kind, data in sec.blocks:
            if kind == "p":
                body.append(f"<p>{inline(data)}</p>")
            elif kind == "h3":
                body.append(f"<h3>{inline(data)}</h3>")
            elif kind == "ul":
                body.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in data) + "</ul>")
            elif kind == "table":
                body.append(data.apply(lambda col: col.map(inline)).to_html(index=False, escape=False, border=0)
                            if not data.empty else "<p><i>(none)</i></p>")
            elif kind == "code":
                body.append(f"<pre>{_html.escape(str(data))}</pre>")
            elif kind == "img":
                name, alt = data
                if name in pngs:
                    b64 = base64.b64encode(pngs[name]).decode()
                    body.append(f'<img alt="{_html.escape(alt)}" src="data:image/png;base64,{b64}">')
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>Morning report: {_html.escape(report.name)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
