"""``report.html``: one self-contained page of a sweep, opened from disk — no network, no CDN, no fonts.

What is on it: curves against step drawn as inline SVG (accuracy with its 95 % interval, format rate,
response length p50/p90, truncation, pass@k with several answers per request), flagged steps marked in
red; the table of checkpoints with their flags; the flags and notes; per checkpoint, the requests that
flipped against base; and a sample browser (:mod:`vlmfast.report.html_assets`): pick a sample and see its
thumbnail — true box and each checkpoint's predicted box drawn over it — its prompt, ground truth and
every checkpoint's answer with its score.

Size: the data is embedded once as JSON; answers are cut at a few hundred characters; thumbnails are
small JPEGs embedded up to ``THUMBNAIL_BUDGET_BYTES`` in all, later images linked by their path (they
open from the same disk). The input is :func:`vlmfast.run.sweep_page.page_data`'s dict.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from urllib.parse import quote

from vlmfast.report.html_assets import CSS, JS

THUMBNAIL_PX = 160  # longest side of an embedded thumbnail
THUMBNAIL_BUDGET_BYTES = 8 * 2**20  # embedded thumbnails in all; past it, images are linked by path
COLORS = ("#0b57d0", "#e8710a", "#9334e6", "#c5221f", "#188038", "#a142f4", "#f29900", "#12b5cb")
CHART_W, CHART_H, PAD = 330, 170, 34


def write_html_report(page: dict, path) -> Path:
    """Write the page of ``page`` (:func:`vlmfast.run.sweep_page.page_data`) to ``path``; returns the path."""
    from vlmfast.files import atomic_write

    path = Path(path)
    atomic_write(path, render(page).encode("utf-8"))
    return path


def write_bench_html(markdown: str, path, plot=None) -> Path:
    """``bench --report``'s page: its tables as written in report.md, and the plot embedded when there is one."""
    from vlmfast.files import atomic_write

    image = ""
    if plot is not None and Path(plot).is_file():
        image = f"<img alt='bench plot' src='data:image/png;base64,{base64.b64encode(Path(plot).read_bytes()).decode()}'>"
    text = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>vlmfast bench</title><style>{CSS}"
            f"</style></head><body><h1>vlmfast bench</h1><pre>{_e(markdown)}</pre>{image}</body></html>")
    atomic_write(Path(path), text.encode("utf-8"))
    return Path(path)


def render(page: dict) -> str:
    """The whole page as text."""
    checkpoints = page["checkpoints"]
    flagged = {}
    for f in page.get("flags", []):
        flagged.setdefault(f["step"], []).append(f["code"])
    images, samples = _thumbnails(page["samples"])
    names = [_name(c) for c in checkpoints]
    best_step = (page.get("best") or {}).get("step")
    data = {
        "steps": [{"name": n, "step": c["step"], "answers": page["answers"].get(c["step"], [])}
                  for n, c in zip(names, checkpoints)],
        "samples": samples, "images": images, "colors": COLORS,
        "best_index": next((i for i, c in enumerate(checkpoints) if c["step"] == best_step), None),
        "flipped_any": sorted({i for f in page.get("flips", {}).values() for ids in f.values() for i in ids}),
    }
    body = [
        f"<h1>vlmfast sweep: {_e(page['run_dir'])}</h1>",
        f"<p class='muted'>{len(checkpoints)} checkpoints · {len(samples)} samples · best: "
        f"{_e(_best(page.get('best'), dict(zip([c['step'] for c in checkpoints], names))))}</p>",
        "<h2>Curves</h2><div class='charts'>" + "".join(_charts(checkpoints, flagged)) + "</div>",
        "<h2>Checkpoints</h2>" + _table(checkpoints, names, flagged, best_step) + _details(checkpoints, names),
        _flags_and_notes(page),
        "<h2>Flipped against base</h2><div class='scroll'>" + _flips(page, names, samples) + "</div>",
        "<h2>Samples</h2><div class='controls'><select id='filter'><option value='all'>all samples</option>"
        "<option value='flipped'>flipped against base</option><option value='wrong_best'>wrong at the best step"
        "</option></select><input id='search' placeholder='search id, prompt, truth'><span id='count' "
        "class='muted'></span><span class='muted'>· marks before an id: ✓ right, ✗ wrong, · unscored — at base, "
        "then at the best step</span></div>" + _linked_note(images) + "<div class='browser'><select id='list' size='24'></select>"
        "<div id='detail'></div></div>",
    ]
    # every "<" as its JSON escape: inside a <script> element "</script", and "<!--" followed later by "<script"
    # (an HTML answer cut short, a code prompt) would end the element early or make it swallow the page's own
    # script; JSON.parse reads \u003c back as "<"
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>vlmfast sweep: "
            f"{_e(page['run_dir'])}</title><style>{CSS}</style></head><body>" + "\n".join(body) +
            f"<script type='application/json' id='vlmfast-data'>{payload}</script><script>{JS}</script></body></html>")


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _name(c: dict) -> str:
    return "base" if c["label"] == "base" else f"step {c['step']}"


def _best(best, name_of: dict) -> str:
    if not best:
        return "none"
    text = f"{name_of.get(best['step'], 'step ' + str(best['step']))} (accuracy {_pct(best.get('accuracy'))}"
    if best.get("p_best") is None:
        return text + ")"
    others = [name_of.get(s, f"step {s}") for s in best.get("indistinguishable", []) if s != best["step"]]
    return (text + f", P(best) {best['p_best']:.0%}: how often it is highest when the requests are resampled, not "
            f"the chance it is truly best, and it overstates the observed best) · ≈ no paired test shows it below "
            f"another step (Holm over every two steps, alpha {best['alpha']}): {', '.join(others) or 'none'}")


def _pct(value) -> str:
    return "–" if value is None else f"{value:.1%}"


# -- curves ----------------------------------------------------------------------------------------
def _charts(checkpoints: list[dict], flagged: dict) -> list[str]:
    steps = [c["step"] for c in checkpoints]
    series = [("accuracy (95 % interval)", [("accuracy", [c.get("accuracy") for c in checkpoints])],
               [(c.get("ci_low"), c.get("ci_high")) for c in checkpoints], True),
              ("format rate", [("format", [c.get("format_rate") for c in checkpoints])], None, True),
              ("response length (tokens)", [("p50", [c.get("new_tokens_p50") for c in checkpoints]),
                                            ("p90", [c.get("new_tokens_p90") for c in checkpoints])], None, False),
              ("truncation rate", [("truncated", [c.get("truncation_rate") for c in checkpoints])], None, True)]
    ks = sorted({k for c in checkpoints for k in ((c.get("samples") or {}).get("pass_at_k") or {})}, key=int)
    if ks:
        series.append(("pass@k", [(f"pass@{k}", [((c.get("samples") or {}).get("pass_at_k") or {}).get(k)
                                                 for c in checkpoints]) for k in ks], None, True))
    return [_chart(title, steps, lines, band, unit, flagged) for title, lines, band, unit in series]


def _chart(title: str, steps: list[int], lines, band, unit_range: bool, flagged: dict) -> str:
    values = [v for _, ys in lines for v in ys if v is not None] + [v for pair in band or [] for v in pair if v is not None]
    if not values or not steps:
        return f"<div class='chart'><h3>{_e(title)}</h3><p class='muted'>no figures</p></div>"
    lo, hi = (0.0, 1.0) if unit_range else (0.0, max(values) * 1.1 or 1.0)
    x0, x1 = min(steps), max(steps)

    def x(step):
        return PAD + (CHART_W - PAD - 10) * ((step - x0) / (x1 - x0) if x1 > x0 else 0.5)

    def y(value):
        return CHART_H - 22 - (CHART_H - 34) * (value - lo) / ((hi - lo) or 1)

    parts = [f"<line x1='{PAD}' y1='{y(lo):.1f}' x2='{CHART_W - 10}' y2='{y(lo):.1f}' stroke='#99a'/>",
             f"<text x='2' y='{y(hi) + 4:.1f}' font-size='10'>{_tick(hi, unit_range)}</text>",
             f"<text x='2' y='{y(lo):.1f}' font-size='10'>{_tick(lo, unit_range)}</text>"]
    for step in _ticks(steps, x):  # the end ticks anchored inside the chart so long step numbers are not clipped
        anchor = "start" if step == x0 and x1 > x0 else "end" if step == x1 and x1 > x0 else "middle"
        parts.append(f"<text x='{x(step):.1f}' y='{CHART_H - 6}' font-size='10' text-anchor='{anchor}'>{step}</text>")
    for step in flagged:
        if x0 <= step <= x1:
            parts.append(f"<line class='flagged' x1='{x(step):.1f}' y1='12' x2='{x(step):.1f}' y2='{y(lo):.1f}' "
                         f"stroke='#d93025' stroke-dasharray='3,3'><title>flagged: {_e(', '.join(flagged[step]))}</title></line>")
    if band:
        pts = [(x(s), y(b[1])) for s, b in zip(steps, band) if None not in b] + \
              [(x(s), y(b[0])) for s, b in reversed(list(zip(steps, band))) if None not in b]
        if pts:
            parts.append("<polygon fill='#0b57d0' fill-opacity='0.12' points='" +
                         " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + "'/>")
    for k, (label, ys) in enumerate(lines):
        pts = [(x(s), y(v), s, v) for s, v in zip(steps, ys) if v is not None]
        color = COLORS[k % len(COLORS)]
        parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='2' points='" +
                     " ".join(f"{a:.1f},{b:.1f}" for a, b, _, _ in pts) + "'/>")
        for a, b, s, v in pts:
            fill = "#d93025" if s in flagged else color
            parts.append(f"<circle cx='{a:.1f}' cy='{b:.1f}' r='3' fill='{fill}'><title>{_e(label)} at step {s}: "
                         f"{_tick(v, unit_range)}</title></circle>")
        parts.append(f"<text x='{PAD + 4 + 60 * k}' y='11' font-size='10' fill='{color}'>{_e(label)}</text>")
    return (f"<div class='chart'><h3>{_e(title)}</h3><svg class='curve' width='{CHART_W}' height='{CHART_H}' "
            f"role='img' aria-label='{_e(title)}'>" + "".join(parts) + "</svg></div>")


def _ticks(steps: list[int], x) -> list[int]:
    """The steps labelled on the x axis: every evaluated one where the labels fit side by side (10 px type,
    ~6 px a digit; the end labels anchored inside the chart), else as many as fit from the first on, the last
    always; never a step that was not evaluated."""
    ordered = sorted(set(steps))
    first, last = ordered[0], ordered[-1]

    def extent(step: int) -> tuple[float, float]:  # the label's span, with a gap
        room, at = 6 * len(str(step)) + 8, x(step)
        if first != last and step == first:
            return at, at + room
        if first != last and step == last:
            return at - room, at
        return at - room / 2, at + room / 2

    kept: list[int] = []
    for step in ordered:
        if not kept or extent(step)[0] >= extent(kept[-1])[1]:
            kept.append(step)
    if kept[-1] != last:  # the last step is always labelled, in place of neighbours too close to it
        while len(kept) > 1 and extent(last)[0] < extent(kept[-1])[1]:
            kept.pop()
        kept.append(last)
    return kept


def _tick(value: float, unit_range: bool) -> str:
    return f"{value:.0%}" if unit_range else f"{value:,.0f}"


# -- table, flags, flips ---------------------------------------------------------------------------
def _table(checkpoints: list[dict], names: list[str], flagged: dict, best_step) -> str:
    head = ("checkpoint", "accuracy (95 % CI)", "P(best) · ≈ best", "vs base (↑ ↓)", "format", "length p50 / p90", "truncated", "repeating",
            "empty / several answers", "tokens/s", "flags")
    rows = ["<div class='wide'><table class='steps'><tr>" + "".join(f"<th class='{'l' if h in ('checkpoint', 'flags') else ''}'>{_e(h)}</th>"
                                                   for h in head) + "</tr>"]
    for c, name in zip(checkpoints, names):
        vs = c.get("vs_base") or {}
        versus = (f"{vs['difference'] * 100:+.1f} pp ({vs['wrong_to_right']}↑ {vs['right_to_wrong']}↓)"
                  if vs.get("difference") is not None else "–")
        ci = f" ({_pct(c.get('ci_low'))}–{_pct(c.get('ci_high'))})" if c.get("ci_low") is not None else ""
        held = "–" if c.get("p_best") is None else f"{c['p_best']:.0%}" + (" ≈" if c.get("near_best") else "")
        cells = [name, _pct(c.get("accuracy")) + ci, held, versus, _pct(c.get("format_rate")),
                 f"{_num(c.get('new_tokens_p50'))} / {_num(c.get('new_tokens_p90'))}", _pct(c.get("truncation_rate")),
                 _pct(c.get("repetition_rate")), f"{_pct(c.get('empty_answer_rate'))} / {_pct(c.get('multi_answer_rate'))}",
                 _num(c.get("tokens_per_s")), ", ".join(flagged.get(c["step"], []))]
        rows.append(f"<tr class='{'best' if c['step'] == best_step else ''}'>" + "".join(
            f"<td class='{'l' if i in (0, 10) else ''}{' flag' if i == 10 and cell else ''}'>{_e(cell)}</td>"
            for i, cell in enumerate(cells)) + "</tr>")
    return "".join(rows) + "</table></div>"


def _details(checkpoints: list[dict], names: list[str]) -> str:
    """The other figures a checkpoint carries, one column each where at least one checkpoint has it."""
    def paired(key):
        def cell(c):
            vs = c.get(key) or {}
            if vs.get("difference") is None:
                return None
            return (f"{vs['difference'] * 100:+.1f} pp [{vs['ci_low'] * 100:+.1f}, {vs['ci_high'] * 100:+.1f}] "
                    f"p={vs['p_value']:.3g} ({vs['wrong_to_right']}↑ {vs['right_to_wrong']}↓)")
        return cell

    def sampled(kind, k):
        return lambda c: _opt(((c.get("samples") or {}).get(kind) or {}).get(k), _pct)

    ks = sorted({k for c in checkpoints for k in ((c.get("samples") or {}).get("pass_at_k") or {})}, key=int)
    # maj@k is one figure per checkpoint (the majority of its k answers), k its samples per request
    majority = sorted({s["samples_per_request"] for c in checkpoints if (s := c.get("samples") or {}).get("maj_at_k")
                       is not None})
    rewards = sorted({f for c in checkpoints for f in (c.get("reward_means") or {})})
    columns = [("vs base [95 % CI] p", paired("vs_base")), ("vs best [95 % CI] p", paired("vs_best")),
               ("below another step: p, Holm over every two steps", lambda c: _opt(c.get("holm_p"), lambda v: f"{v:.3g}")),
               ("mean length", lambda c: _opt(c.get("mean_new_tokens"), _num)),
               ("length max", lambda c: _opt(c.get("new_tokens_max"), _num)),
               ("think chars", lambda c: _opt(c.get("mean_think_chars"), _num)),
               ("answer chars", lambda c: _opt(c.get("mean_answer_chars"), _num)),
               ("no answer", lambda c: _opt(c.get("no_answer_rate"), _pct))]
    columns += [(f"pass@{k}", sampled("pass_at_k", k)) for k in ks]
    columns += [(f"maj@{'/'.join(map(str, majority))}", lambda c: _opt((c.get("samples") or {}).get("maj_at_k"), _pct))
                ] if majority else []
    columns += [("all same reward", lambda c: _opt((c.get("samples") or {}).get("all_same_rate"), _pct))]
    columns += [(f"reward {f}", lambda c, f=f: _opt((c.get("reward_means") or {}).get(f), lambda v: f"{v:.3f}"))
                for f in rewards]
    subscores = list(dict.fromkeys(k for c in checkpoints for k in (c.get("reward_score_means") or {})))
    columns += [(f"sub-score {k}", lambda c, k=k: _opt((c.get("reward_score_means") or {}).get(k), lambda v: f"{v:.3f}"))
                for k in subscores]
    columns += [("load / swap s", lambda c: _opt(next((c[k] for k in ("load_s", "swap_s", "reload_s")
                                                       if c.get(k) is not None), None), lambda v: f"{v:.1f}")),
                ("errors", lambda c: _opt((c.get("errors") or 0) + (c.get("reward_errors") or 0) or None, str))]
    cells = [[get(c) for c in checkpoints] for _, get in columns]
    kept = [(head, col) for (head, _), col in zip(columns, cells) if any(v is not None for v in col)]
    if not kept:
        return ""
    rows = "".join("<tr><td class='l'>" + _e(name) + "</td>" + "".join(f"<td>{_e(col[i] or '–')}</td>" for _, col in kept)
                   + "</tr>" for i, name in enumerate(names))
    return ("<details class='more'><summary>more figures per checkpoint</summary><div class='wide'><table class='steps'>"
            "<tr><th class='l'>checkpoint</th>" + "".join(f"<th>{_e(h)}</th>" for h, _ in kept) + "</tr>" + rows +
            "</table></div></details>")


def _opt(value, fmt):
    return None if value is None else fmt(value)


def _linked_note(images: list[str]) -> str:
    linked = sum(not uri.startswith("data:") for uri in images)
    if not linked:
        return ""
    return (f"<p class='muted'>{len(images) - linked} image(s) embedded as thumbnails (up to "
            f"{THUMBNAIL_BUDGET_BYTES // 2**20} MiB); the other {linked} are linked by their path and show only where "
            "that file is.</p>")


def _num(value) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _flags_and_notes(page: dict) -> str:
    items = [f"<li class='flag'>{_e(f['code'])}: {_e(f['message'])}</li>" for f in page.get("flags", [])]
    items += [f"<li class='muted'>{_e(n)}</li>" for n in page.get("notes", [])]
    return "<h2>Flags and notes</h2>" + (f"<ul>{''.join(items)}</ul>" if items else "<p class='muted'>none</p>")


def _flips(page: dict, names: list[str], samples: list[dict]) -> str:
    if not page.get("flips"):
        return "<p class='muted'>no base in this sweep (give --base to compare every checkpoint with it)</p>"
    out = []
    for c, name in zip(page["checkpoints"], names):
        got = page["flips"].get(c["step"])
        if got is None:
            continue
        parts = []
        for key, label in (("wrong_to_right", "wrong → right"), ("right_to_wrong", "right → wrong")):
            links = " ".join(f"<a href='#sample={_e(quote(samples[i]['id'], safe=''))}' data-sample='{_e(samples[i]['id'])}' "
                             f"data-index='{i}'>{_e(samples[i]['id'])}</a>" for i in got[key][:200])
            more = f" … and {len(got[key]) - 200} more" if len(got[key]) > 200 else ""
            parts.append(f"<p><b>{label}</b> ({len(got[key])}): {links}{more}</p>")
        out.append(f"<details><summary>{_e(name)}: {len(got['wrong_to_right'])} ↑ {len(got['right_to_wrong'])} ↓"
                   f"</summary>{''.join(parts)}</details>")
    return "".join(out)


# -- thumbnails ------------------------------------------------------------------------------------
def _thumbnails(samples: list[dict]) -> tuple[list[str], list[dict]]:
    """Each sample's image as an embedded JPEG thumbnail while the budget lasts, then as a link to its file;
    the samples as the page's script reads them (``image``: an index into the returned list)."""
    images, out, used, seen = [], [], 0, {}
    for s in samples:
        path, at = s.get("image_path"), None
        if path:
            if path not in seen:
                uri = _thumbnail(path) if used < THUMBNAIL_BUDGET_BYTES else None
                used += len(uri or "")
                seen[path] = len(images)
                images.append(uri or (Path(path).resolve().as_uri() if Path(path).exists() else path))
            at = seen[path]
        out.append({"id": s["id"], "prompt": s["prompt"], "truth": s["truth"], "image": at,
                    "size": s.get("size"), "truth_box": s.get("truth_box")})
    return images, out


def _thumbnail(path: str) -> str | None:
    try:
        from PIL import Image

        with Image.open(path) as image:
            image.draft("RGB", (THUMBNAIL_PX, THUMBNAIL_PX))  # a JPEG decoded at 1/2-1/8 scale: 1600x1200, 66 -> 27 ms
            image = image.convert("RGB")
            image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=70)
    except Exception:  # noqa: BLE001 - an image that cannot be read: the page links its path instead
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
