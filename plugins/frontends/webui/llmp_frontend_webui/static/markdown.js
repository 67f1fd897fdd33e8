// A small Markdown renderer and code highlighter for model replies (no dependencies).
// Every piece of the model's text goes through escapeHtml before it reaches the page, and
// links keep only http(s) and mailto targets: a reply can format, never inject markup (the one
// tag read as HTML is <br>, as a line break). Math ($...$, \[...\]) stays text as written.
// Unclosed constructs (a code fence still streaming) render as if closed at the end.
"use strict";

(function () {
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
  }

  // -- code highlighting --------------------------------------------------------

  const C_LIKE = {
    line: ["//"],
    block: [["/*", "*/"]],
    strings: ['"', "'"],
    literals: "true false null nullptr NULL nil",
  };
  const LANGUAGES = {
    js: {
      ...C_LIKE,
      strings: ['"', "'", "`"],
      keywords:
        "async await break case catch class const continue debugger default delete do else export extends " +
        "finally for from function if import in instanceof let new of return static super switch this throw " +
        "try typeof var void while with yield interface type enum implements private public protected readonly",
      literals: "true false null undefined NaN Infinity",
    },
    python: {
      line: ["#"],
      block: [],
      strings: ['"""', "'''", '"', "'"],
      keywords:
        "and as assert async await break class continue def del elif else except finally for from global if " +
        "import in is lambda match case nonlocal not or pass raise return try while with yield self",
      literals: "True False None",
    },
    shell: {
      line: ["#"],
      block: [],
      strings: ['"', "'"],
      keywords:
        "if then else elif fi for while until do done case esac function in return exit export local " +
        "source echo cd set unset sudo",
      literals: "",
    },
    c: {
      ...C_LIKE,
      keywords:
        "auto break case catch char class const constexpr continue default delete do double else enum extern " +
        "float for friend goto if inline int long namespace new operator private protected public register " +
        "return short signed sizeof static struct switch template this throw try typedef typename union " +
        "unsigned using virtual void volatile while include define bool",
    },
    java: {
      ...C_LIKE,
      keywords:
        "abstract boolean break byte case catch char class const continue default do double else enum extends " +
        "final finally float for if implements import instanceof int interface long new package private " +
        "protected public return short static super switch this throw throws try var void while val fun " +
        "override object when is as string namespace using",
    },
    go: {
      ...C_LIKE,
      strings: ['"', "'", "`"],
      keywords:
        "break case chan const continue default defer else fallthrough for func go goto if import interface " +
        "map package range return select struct switch type var",
    },
    rust: {
      ...C_LIKE,
      keywords:
        "as async await break const continue crate dyn else enum extern fn for if impl in let loop match mod " +
        "move mut pub ref return self Self static struct super trait type unsafe use where while",
      literals: "true false None Some Ok Err",
    },
    sql: {
      line: ["--"],
      block: [["/*", "*/"]],
      strings: ["'", '"'],
      keywords:
        "select from where and or not insert into values update set delete create table drop alter add " +
        "index primary key foreign references join left right inner outer on group by order having limit " +
        "offset as distinct union all case when then else end is in like between exists",
      literals: "null true false",
      caseless: true,
    },
    json: { line: [], block: [], strings: ['"'], keywords: "", literals: "true false null" },
    yaml: { line: ["#"], block: [], strings: ['"', "'"], keywords: "", literals: "true false null yes no" },
  };
  const ALIASES = {
    javascript: "js", jsx: "js", ts: "js", typescript: "js", tsx: "js", mjs: "js",
    py: "python", python3: "python",
    sh: "shell", bash: "shell", zsh: "shell", console: "shell", shellsession: "shell",
    cpp: "c", "c++": "c", h: "c", hpp: "c", cc: "c", cs: "java", csharp: "java", kotlin: "java", kt: "java",
    scala: "java", swift: "java", rs: "rust", golang: "go", yml: "yaml", toml: "yaml", ini: "yaml",
  };
  for (const spec of Object.values(LANGUAGES)) {
    const words = (list) => new Set(list.split(/\s+/).filter(Boolean).map((w) => (spec.caseless ? w.toLowerCase() : w)));
    spec.keywordSet = words(spec.keywords);
    spec.literalSet = words(spec.literals);
  }

  const IDENTIFIER = /[A-Za-z_$][\w$]*/y;
  const NUMBER = /(?:0[xX][\da-fA-F_]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?)/y;

  function span(kind, text) {
    return `<span class="tk-${kind}">${escapeHtml(text)}</span>`;
  }

  function languageOf(name) {
    const key = String(name || "").toLowerCase();
    return LANGUAGES[key] ? key : ALIASES[key] || null;
  }

  // code as HTML with spans for comments, strings, numbers, keywords, literals and calls
  function highlight(code, language) {
    const spec = LANGUAGES[languageOf(language)];
    if (!spec) return escapeHtml(code);
    let out = "";
    let plain = "";
    let i = 0;
    const flush = () => {
      out += escapeHtml(plain);
      plain = "";
    };
    const emit = (kind, text) => {
      flush();
      out += span(kind, text);
      i += text.length;
    };
    scan: while (i < code.length) {
      for (const marker of spec.line) {
        if (code.startsWith(marker, i) && (marker !== "#" || i === 0 || /[\s;]/.test(code[i - 1]))) {
          const end = code.indexOf("\n", i);
          emit("c", code.slice(i, end < 0 ? code.length : end));
          continue scan;
        }
      }
      for (const [open, close] of spec.block) {
        if (code.startsWith(open, i)) {
          const end = code.indexOf(close, i + open.length);
          emit("c", code.slice(i, end < 0 ? code.length : end + close.length));
          continue scan;
        }
      }
      for (const quote of spec.strings) {
        if (code.startsWith(quote, i)) {
          const multiline = quote.length === 3 || quote === "`";
          let j = i + quote.length;
          while (j < code.length && !code.startsWith(quote, j)) {
            if (code[j] === "\\") j++;
            else if (code[j] === "\n" && !multiline) break;
            j++;
          }
          emit("s", code.slice(i, Math.min(code.length, code.startsWith(quote, j) ? j + quote.length : j)));
          continue scan;
        }
      }
      const before = i > 0 ? code[i - 1] : " ";
      if (!/[\w$]/.test(before)) {
        NUMBER.lastIndex = i;
        const number = NUMBER.exec(code);
        if (number) {
          emit("n", number[0]);
          continue;
        }
        IDENTIFIER.lastIndex = i;
        const word = IDENTIFIER.exec(code);
        if (word) {
          const text = word[0];
          const key = spec.caseless ? text.toLowerCase() : text;
          if (spec.keywordSet.has(key)) emit("k", text);
          else if (spec.literalSet.has(key)) emit("l", text);
          else if (code[i + text.length] === "(") emit("f", text);
          else {
            plain += text;
            i += text.length;
          }
          continue;
        }
      }
      plain += code[i];
      i++;
    }
    flush();
    return out;
  }

  // -- inline Markdown --------------------------------------------------------------

  const SAFE_URL = /^(?:https?:\/\/|mailto:)/i;
  const ESCAPABLE = /[\\`*_{}[\]()#+\-.!|~<>$]/;
  const BARE_URL = /https?:\/\/[^\s<>"'`]+/y;
  const ANGLE_AUTOLINK = /<((?:https?:\/\/|mailto:)[^\s<>]*)>/y;
  const ANGLE_EMAIL = /<([\w.+-]+@[\w-]+(?:\.[\w-]+)+)>/y;
  const LINE_BREAK_TAG = /<br\s*\/?>/iy; // the one HTML tag models use in tables: a line break, nothing else
  const MATH = [["$$", "$$"], ["\\[", "\\]"], ["\\(", "\\)"], ["$", "$"]];
  const EMPHASIS_REACH = 2000; // how far a closing * or _ is looked for: long unmatched runs stay linear-ish

  function link(href, labelHtml) {
    return `<a href="${escapeHtml(href)}" target="_blank" rel="noopener noreferrer nofollow">${labelHtml}</a>`;
  }

  // the length of a run of `char` at `at`
  function runLength(text, at, char) {
    let n = 0;
    while (text[at + n] === char) n++;
    return n;
  }

  // where the run closing one of `size` opened at `from` starts: a run of exactly that size, not
  // after a space (runs of another size are nested emphasis: *a **b** c*), or -1
  function closingRun(text, char, size, from) {
    const limit = Math.min(text.length, from + EMPHASIS_REACH);
    let j = from;
    while (j < limit) {
      j = text.indexOf(char, j);
      if (j < 0 || j >= limit) return -1;
      const n = runLength(text, j, char);
      const after = text[j + n];
      if (n === size && !/\s/.test(text[j - 1]) && (char !== "_" || !after || !/\w/.test(after))) return j;
      j += n;
    }
    return -1;
  }

  // a bare URL's end: trailing punctuation is the sentence's, a ")" only when unbalanced (GFM)
  function trimUrl(url) {
    for (;;) {
      const last = url[url.length - 1];
      if (/[.,;:!?*_~'"\]]/.test(last)) url = url.slice(0, -1);
      else if (last === ")" && url.split(")").length > url.split("(").length) url = url.slice(0, -1);
      else return url;
    }
  }

  // `[label](destination "title")` at `at`: [label, destination, length] or null; the
  // destination may hold balanced parentheses (https://en.wikipedia.org/wiki/Foo_(bar))
  function inlineLink(text, at) {
    let depth = 0;
    let i = at + 1;
    for (; i < text.length && i < at + 1024; i++) {
      const c = text[i];
      if (c === "\\") i++;
      else if (c === "[") depth++;
      else if (c === "]" && depth-- === 0) break;
      else if (c === "\n" && text[i + 1] === "\n") return null;
    }
    if (text[i] !== "]" || text[i + 1] !== "(") return null;
    const label = text.slice(at + 1, i);
    i += 2;
    while (text[i] === " ") i++;
    let destination = "";
    if (text[i] === "<") {
      const end = text.indexOf(">", i);
      if (end < 0 || /[\n<]/.test(text.slice(i + 1, end))) return null;
      destination = text.slice(i + 1, end);
      i = end + 1;
    } else {
      let parens = 0;
      const start = i;
      for (; i < text.length && !/[\s\x00-\x1f]/.test(text[i]); i++) {
        if (text[i] === "\\") i++;
        else if (text[i] === "(") parens++;
        else if (text[i] === ")" && parens-- === 0) break;
      }
      destination = text.slice(start, i);
    }
    const rest = /^(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)/.exec(text.slice(i, i + 512));
    if (!rest) return null;
    return [label, destination, i + rest[0].length - at];
  }

  // math stays text as written: its backslashes, underscores and stars are not Markdown
  function mathSpan(text, at) {
    for (const [open, close] of MATH) {
      if (!text.startsWith(open, at)) continue;
      const from = at + open.length;
      if (open === "$" && (/\s|\d/.test(text[from] || " ") || text[at + 1] === "$")) return 0;
      const end = text.indexOf(close, from + 1);
      if (end < 0 || (open === "$" && (/\s/.test(text[end - 1]) || /\d/.test(text[end + 1] || "")))) return 0;
      return end + close.length - at;
    }
    return 0;
  }

  // inline Markdown as HTML; inside a link's label (`inLink`) no further links are made
  function inline(text, inLink = false) {
    let out = "";
    let i = 0;
    while (i < text.length) {
      const c = text[i];
      if (c === "$" || (c === "\\" && (text[i + 1] === "[" || text[i + 1] === "("))) {
        const length = mathSpan(text, i);
        if (length) {
          out += escapeHtml(text.slice(i, i + length)).replace(/\n/g, "<br>");
          i += length;
          continue;
        }
      }
      if (c === "\\" && ESCAPABLE.test(text[i + 1] || "")) {
        out += escapeHtml(text[i + 1]);
        i += 2;
        continue;
      }
      if (c === "\n") {
        out += "<br>";
        i++;
        continue;
      }
      if (c === "`") {
        const n = runLength(text, i, "`");
        const fence = "`".repeat(n);
        const end = text.indexOf(fence, i + n);
        if (end > 0) {
          let body = text.slice(i + n, end).replace(/\n/g, " ");
          if (/^ .*[^ ].* $/.test(body)) body = body.slice(1, -1);
          out += `<code>${escapeHtml(body)}</code>`;
          i = end + n;
        } else {
          out += fence;
          i += n;
        }
        continue;
      }
      if (c === "<") {
        LINE_BREAK_TAG.lastIndex = i;
        const br = LINE_BREAK_TAG.exec(text);
        if (br) {
          out += "<br>";
          i += br[0].length;
          continue;
        }
        ANGLE_AUTOLINK.lastIndex = ANGLE_EMAIL.lastIndex = i;
        const url = ANGLE_AUTOLINK.exec(text);
        const email = !url && ANGLE_EMAIL.exec(text);
        if (url || email) {
          const target = url ? url[1] : email[1];
          out += inLink ? escapeHtml(target) : link(url ? target : `mailto:${target}`, escapeHtml(target));
          i += (url || email)[0].length;
          continue;
        }
      }
      if (!inLink && (c === "[" || (c === "!" && text[i + 1] === "["))) {
        const start = c === "!" ? i + 1 : i;
        const match = inlineLink(text, start);
        if (match) {
          const [label, href] = match;
          const labelHtml = inline(label || href, true);
          out += SAFE_URL.test(href) ? link(href, labelHtml) : labelHtml;
          i = start + match[2];
          continue;
        }
      }
      if (!inLink && (c === "h" || c === "H") && !/\w/.test(text[i - 1] || "")) {
        BARE_URL.lastIndex = i;
        const found = BARE_URL.exec(text);
        const url = found && trimUrl(found[0]);
        if (url && /^https?:\/\/[^/]/i.test(url)) {
          out += link(url, escapeHtml(url));
          i += url.length;
          continue;
        }
      }
      if (c === "*" || c === "_" || c === "~") {
        const n = runLength(text, i, c);
        const opens = text[i + n] && !/\s/.test(text[i + n]) && (c !== "_" || !/\w/.test(text[i - 1] || ""));
        const size = c === "~" ? (n === 2 ? 2 : 0) : Math.min(n, 3);
        if (opens && size > 0 && size === n) {
          const end = closingRun(text, c, size, i + size + 1);
          if (end > 0) {
            let body = inline(text.slice(i + size, end), inLink);
            if (c === "~") body = `<del>${body}</del>`;
            else if (size === 1) body = `<em>${body}</em>`;
            else if (size === 2) body = `<strong>${body}</strong>`;
            else body = `<strong><em>${body}</em></strong>`;
            out += body;
            i = end + size;
            continue;
          }
        }
        out += escapeHtml(c.repeat(n));
        i += n;
        continue;
      }
      out += escapeHtml(c);
      i++;
    }
    return out;
  }

  // -- blocks -------------------------------------------------------------------------

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
  const HEADING = /^ {0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$/;
  const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}> ?/;
  const ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:\s+(.*))?$/;
  const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$/;
  const SETEXT = /^ {0,3}(=+|-+)\s*$/;

  // a table starts at `line` when `next` is its delimiter row, with as many columns as the header
  function startsTable(line, next) {
    return (
      line.includes("|") && next !== undefined && next.includes("-") && TABLE_RULE.test(next) &&
      cells(line).length === cells(next).length
    );
  }

  // whether `line` ends a paragraph: a list interrupts one only with a non-empty item, and an
  // ordered one only when it starts at 1 ("In the year\n2020. things happened" is one paragraph)
  function startsBlock(line, next) {
    const item = ITEM.exec(line);
    return (
      FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || startsTable(line, next) ||
      (item !== null && Boolean(item[3]) && (!/\d/.test(item[2]) || parseInt(item[2], 10) === 1))
    );
  }

  function cells(line) {
    let row = line.trim();
    if (row.startsWith("|")) row = row.slice(1);
    if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
    return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
  }

  function codeBlock(code, language) {
    const name = String(language || "").slice(0, 40);
    const known = languageOf(name);
    const label = name ? `<span class="code-lang">${escapeHtml(name)}</span>` : "<span></span>";
    const cls = known ? ` class="language-${escapeHtml(known)}"` : "";
    return (
      `<div class="code">` +
      `<div class="code-head">${label}<button type="button" class="copy-code">Copy</button></div>` +
      `<pre><code${cls}>${highlight(code, name)}</code></pre></div>`
    );
  }

  function blocks(lines) {
    let out = "";
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) {
        i++;
        continue;
      }
      let m = FENCE.exec(line);
      if (m) {
        const fence = m[1];
        const indent = line.length - line.trimStart().length;
        const body = [];
        i++;
        while (i < lines.length) {
          const close = /^ {0,3}(`{3,}|~{3,})\s*$/.exec(lines[i]);
          if (close && close[1][0] === fence[0] && close[1].length >= fence.length) break;
          body.push(lines[i].slice(Math.min(indent, lines[i].length - lines[i].trimStart().length)));
          i++;
        }
        i++;
        out += codeBlock(body.join("\n"), m[2]);
        continue;
      }
      m = HEADING.exec(line);
      if (m) {
        const level = m[1].length;
        out += `<h${level}>${inline(m[2] || "")}</h${level}>`;
        i++;
        continue;
      }
      if (RULE.test(line)) {
        out += "<hr>";
        i++;
        continue;
      }
      if (QUOTE.test(line)) {
        const body = [];
        while (i < lines.length && lines[i].trim() && (QUOTE.test(lines[i]) || !startsBlock(lines[i], lines[i + 1]))) {
          body.push(lines[i].replace(QUOTE, ""));
          i++;
        }
        out += `<blockquote>${blocks(body)}</blockquote>`;
        continue;
      }
      m = ITEM.exec(line);
      if (m) {
        const ordered = /\d/.test(m[2]);
        const indent = m[1].length;
        const start = ordered ? parseInt(m[2], 10) : 1;
        // a list's items share a marker: "-", "*", "+", or an ordered one's "." or ")"
        const marker = m[2].slice(-1);
        const sameList = (item) => item && item[1].length <= indent + 1 && item[2].slice(-1) === marker;
        const items = [];
        let loose = false;
        while (i < lines.length) {
          const item = ITEM.exec(lines[i]);
          if (!sameList(item)) break;
          const contentIndent = item[1].length + item[2].length + 1;
          const body = [item[3] || ""];
          i++;
          while (i < lines.length) {
            const next = lines[i];
            const nextIndent = next.length - next.trimStart().length;
            if (!next.trim()) {
              // a blank line continues the item only when indented content follows
              const after = lines[i + 1];
              if (after !== undefined && after.trim() && after.length - after.trimStart().length >= contentIndent) {
                body.push("");
                loose = true;
                i++;
                continue;
              }
              break;
            }
            if (nextIndent < contentIndent && (ITEM.test(next) || startsBlock(next, lines[i + 1]))) break;
            body.push(next.slice(Math.min(nextIndent, contentIndent)));
            i++;
          }
          items.push(body);
          if (i < lines.length && !lines[i].trim()) {
            const after = lines[i + 1];
            if (after !== undefined && sameList(ITEM.exec(after))) {
              loose = true;
              i++;
            }
          }
        }
        const tag = ordered ? "ol" : "ul";
        const startAttr = ordered && start !== 1 ? ` start="${start}"` : "";
        out += `<${tag}${startAttr}>`;
        for (const body of items) {
          const html = blocks(body);
          const tight = !loose && /^<p>[\s\S]*?<\/p>/.exec(html);
          out += `<li>${tight ? html.replace(/^<p>([\s\S]*?)<\/p>/, "$1") : html}</li>`;
        }
        out += `</${tag}>`;
        continue;
      }
      if (startsTable(line, lines[i + 1])) {
        const head = cells(line);
        const align = cells(lines[i + 1]).map((c) =>
          c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : ""
        );
        const cell = (tag, text, k) =>
          `<${tag}${align[k] ? ` class="align-${align[k]}"` : ""}>${inline(text || "")}</${tag}>`;
        out += `<div class="table-wrap"><table><thead><tr>${head.map((c, k) => cell("th", c, k)).join("")}</tr></thead><tbody>`;
        i += 2;
        while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
          const row = cells(lines[i]);
          out += `<tr>${head.map((_, k) => cell("td", row[k], k)).join("")}</tr>`;
          i++;
        }
        out += "</tbody></table></div>";
        continue;
      }
      const para = [];
      let setext = null;
      while (i < lines.length && lines[i].trim()) {
        if (para.length && (setext = SETEXT.exec(lines[i]))) break; // "Title\n===" or "Title\n---"
        if (para.length && startsBlock(lines[i], lines[i + 1])) break;
        para.push(lines[i].trim());
        i++;
      }
      if (setext) {
        const level = setext[1][0] === "=" ? 1 : 2;
        out += `<h${level}>${inline(para.join("\n"))}</h${level}>`;
        i++;
      } else out += `<p>${inline(para.join("\n"))}</p>`;
    }
    return out;
  }

  // Markdown text as HTML: every character of `text` escaped or formatted, nothing passed through
  function render(text) {
    return blocks(String(text).replace(/\r\n?/g, "\n").split("\n"));
  }

  window.LlmpMarkdown = { render, highlight, escapeHtml };
})();
