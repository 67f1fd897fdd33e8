"""The page's Markdown renderer (static/markdown.js) run in the headless browser over a table of
input and expected HTML: the constructs models write (CommonMark and GFM), and model text that
must stay text."""

from __future__ import annotations

from importlib import resources
from typing import Any

import pytest


def link(href: str, label: str | None = None) -> str:
    return f'<a href="{href}" target="_blank" rel="noopener noreferrer nofollow">{label or href}</a>'


WIKI = "https://en.wikipedia.org/wiki/Foo_(bar)"

CASES = {
    # emphasis, nested either way
    "*italic **bold** italic*": "<p><em>italic <strong>bold</strong> italic</em></p>",
    "**bold *it* bold**": "<p><strong>bold <em>it</em> bold</strong></p>",
    "***both*** _u_ snake_case_name ~~del~~": (
        "<p><strong><em>both</em></strong> <em>u</em> snake_case_name <del>del</del></p>"
    ),
    # links: balanced parentheses in the URL, bare URLs, autolinks, never a link in a link
    f"[w]({WIKI})": f"<p>{link(WIKI, 'w')}</p>",
    f"see {WIKI} now": f"<p>see {link(WIKI)} now</p>",
    "(see https://x.y/a) and https://x.y/z.": f"<p>(see {link('https://x.y/a')}) and {link('https://x.y/z')}.</p>",
    "<https://x.y/a?b=1&c=2>": f"<p>{link('https://x.y/a?b=1&amp;c=2', 'https://x.y/a?b=1&amp;c=2')}</p>",
    "[https://a.b](https://a.b)": f"<p>{link('https://a.b')}</p>",
    "[bad](javascript:alert(1)) [x](data:text/html,x)": "<p>bad x</p>",
    # an ordered list interrupts a paragraph only when it starts at 1
    "In the year\n2020. things happened": "<p>In the year<br>2020. things happened</p>",
    "Steps:\n1. one\n2. two": "<p>Steps:</p><ol><li>one</li><li>two</li></ol>",
    # setext headings
    "Title\n===": "<h1>Title</h1>",
    "Title\n---\ntext": "<h2>Title</h2><p>text</p>",
    # a change of bullet starts a new list
    "- a\n- b\n* c": "<ul><li>a</li><li>b</li></ul><ul><li>c</li></ul>",
    "* a\n\n+ b": "<ul><li>a</li></ul><ul><li>b</li></ul>",
    # table alignment, <br> in cells and text (that tag only)
    "| a | b | c |\n|:--|:-:|--:|\n| x<br>y | z<br/>w | <b>no</b> |": (
        '<div class="table-wrap"><table><thead><tr><th class="align-left">a</th>'
        '<th class="align-center">b</th><th class="align-right">c</th></tr></thead><tbody><tr>'
        '<td class="align-left">x<br>y</td><td class="align-center">z<br>w</td>'
        '<td class="align-right">&lt;b&gt;no&lt;/b&gt;</td></tr></tbody></table></div>'
    ),
    "one<br />two <brx> <script>": "<p>one<br>two &lt;brx&gt; &lt;script&gt;</p>",
    # math stays as written, backslashes and underscores included
    r"\[ x^2 \] and $a_1 * b_2$ and \(y\)": r"<p>\[ x^2 \] and $a_1 * b_2$ and \(y\)</p>",
    "it costs $5, or $10": "<p>it costs $5, or $10</p>",
    # what worked before keeps working
    "1\\. not a list \\*not em\\*": "<p>1. not a list *not em*</p>",
    "1. First\n   - sub\n2. Second": "<ol><li>First<ul><li>sub</li></ul></li><li>Second</li></ol>",
    "# H1\n## H2 ##": "<h1>H1</h1><h2>H2</h2>",
}


@pytest.fixture(scope="module")
def render(browser: Any) -> Any:
    """``render(texts)``: each text as HTML, from markdown.js in a blank page of the browser."""
    source = resources.files("llmp_frontend_webui").joinpath("static", "markdown.js").read_text()
    browser.get("about:blank")
    browser.execute_script(source)
    return lambda texts: browser.execute_script("return arguments[0].map(LlmpMarkdown.render)", texts)


def test_markdown_renders_as_commonmark_and_gfm(render: Any) -> None:
    got = dict(zip(CASES, render(list(CASES)), strict=True))
    wrong = {text: (got[text], want) for text, want in CASES.items() if got[text] != want}
    assert not wrong, "\n\n".join(f"{text!r}\n  got:  {g}\n  want: {w}" for text, (g, w) in wrong.items())


def test_table_alignments_are_all_styled() -> None:
    css = resources.files("llmp_frontend_webui").joinpath("static", "style.css").read_text()
    for align in ("left", "center", "right"):
        assert f".markdown .align-{align} {{ text-align: {align}; }}" in css
