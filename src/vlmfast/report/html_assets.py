"""The style and script of ``report.html``, inlined into the page (no network, no framework).

The script reads the data embedded once as JSON and renders the sample browser on demand: a list of
samples filtered as asked (all, flipped against base, wrong at the best step, by text), and for the one
picked its thumbnail with the true box and each checkpoint's predicted box drawn over it, its prompt,
its ground truth and every checkpoint's answer with its score. ``#sample=ID`` in the address picks one on
load. Errors are collected into ``data-errors`` and the page says it is ready in ``data-ready`` (and when,
in ``data-ready-ms`` from navigation start), so a headless browser can check both.
"""

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 24px 48px;color:#1d2433}
h1{font-size:20px;margin:18px 0 4px}h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #dde}
.muted{color:#667}.flag{color:#b3261e;font-weight:600}.charts{display:flex;flex-wrap:wrap;gap:14px}
.chart{border:1px solid #e3e6ee;border-radius:6px;padding:6px 8px}.chart h3{font-size:13px;margin:0 0 2px}
table.steps{border-collapse:collapse;font-variant-numeric:tabular-nums}
table.steps td,table.steps th{padding:3px 9px;border-bottom:1px solid #eceef4;text-align:right;white-space:nowrap}
table.steps th{background:#f5f6fa}table.steps td.l,table.steps th.l{text-align:left}
tr.best td{background:#eef8ee}.browser{display:flex;gap:18px;align-items:flex-start}
#list{width:280px;height:480px;font:12px monospace}#detail{flex:1;min-width:0}
#detail table{border-collapse:collapse;width:100%}#detail td,#detail th{border-bottom:1px solid #eceef4;padding:3px 6px;
vertical-align:top;text-align:left}.ok{color:#1a7f37}.bad{color:#b3261e}.thumb{position:relative;display:inline-block}
.thumb img{display:block;max-width:360px;min-height:20px;border:1px solid #ccd}.thumb svg{position:absolute;left:0;top:0}
pre{white-space:pre-wrap;word-break:break-word;margin:2px 0;font-size:12px}.controls{margin:6px 0;display:flex;gap:8px}
table.steps td.flag,table.steps th{white-space:normal}details{margin:4px 0}a{color:#0b57d0}.wide{overflow:auto;max-width:100%;max-height:640px}.scroll{max-height:360px;overflow:auto}
table.steps th{position:sticky;top:0;z-index:1}details.more{margin-top:8px}
"""

JS = r"""
(function () {
  var errors = [];
  window.addEventListener("error", function (e) { errors.push(String(e.message)); mark(); });
  function mark() { document.body.setAttribute("data-errors", JSON.stringify(errors)); }
  var data = JSON.parse(document.getElementById("vlmfast-data").textContent);
  var steps = data.steps, samples = data.samples, colors = data.colors, flippedAny = {};
  data.flipped_any.forEach(function (i) { flippedAny[i] = true; });
  var list = document.getElementById("list"), detail = document.getElementById("detail");
  var filter = document.getElementById("filter"), search = document.getElementById("search");
  function esc(s) { return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) {
    return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]; }); }
  function wanted(i) {
    var f = filter.value, q = search.value.toLowerCase(), s = samples[i];
    if (q && (s.id + " " + s.prompt + " " + s.truth).toLowerCase().indexOf(q) < 0) return false;
    if (f === "flipped") return flippedAny[i] === true;
    if (f === "wrong_best") return data.best_index != null && steps[data.best_index].answers[i] &&
      steps[data.best_index].answers[i][1] === 0;
    return true;
  }
  function fill() {
    var html = [], shown = 0;
    for (var i = 0; i < samples.length; i++) {
      if (!wanted(i)) continue;
      shown++;
      html.push('<option value="' + i + '">' + mark_of(i) + " " + esc(samples[i].id) + '</option>');
    }
    list.innerHTML = html.join("");
    document.getElementById("count").textContent = shown + " of " + samples.length + " samples";
  }
  // right/wrong at base and at the best step, so flips show in the list itself
  var base = steps.length && steps[0].name === "base" ? steps[0] : null, best = steps[data.best_index];
  function mark_of(i) {
    function one(st) { var a = st && st.answers[i]; return !a || a[1] == null ? "·" : a[1] ? "✓" : "✗"; }
    return (base ? one(base) : "") + (best && best !== base ? one(best) : "");
  }
  function box(b, w, h, scale, color, label) {
    if (!b) return "";
    var x = b[0] * scale, y = b[1] * scale, bw = (b[2] - b[0]) * scale, bh = (b[3] - b[1]) * scale;
    return '<rect x="' + x + '" y="' + y + '" width="' + bw + '" height="' + bh + '" fill="none" stroke="' + color +
      '" stroke-width="2"><title>' + esc(label) + '</title></rect>';
  }
  function show(i) {
    var s = samples[i], html = [];
    html.push("<h3>" + esc(s.id) + "</h3>");
    if (s.image != null) {
      var src = data.images[s.image], w = s.size ? s.size[0] : 0, h = s.size ? s.size[1] : 0;
      var scale = w && h ? 320 / Math.max(w, h) : 1, overlay = "";  // small images drawn larger: boxes stay legible
      if (w && h && (s.truth_box || steps.some(function (st) { return st.answers[i] && st.answers[i][3]; }))) {
        overlay = '<svg class="boxes" width="' + w * scale + '" height="' + h * scale + '">' +
          box(s.truth_box, w, h, scale, "#1a7f37", "ground truth");
        steps.forEach(function (st, k) {
          var a = st.answers[i]; if (a && a[3]) overlay += box(a[3], w, h, scale, colors[k % colors.length], st.name);
        });
        overlay += "</svg>";
      }
      // an image of unknown size keeps its own (no boxes can be placed on it)
      html.push('<div class="thumb"><img alt="' + esc(src.indexOf("data:") === 0 ? "thumbnail" : "not embedded: " + src) + '" src="' + esc(src) + '"' +
        (w ? ' width="' + Math.round(w * scale) + '"' : "") + ">" + overlay + "</div>");
    }
    html.push("<p><b>prompt</b></p><pre>" + esc(s.prompt) + "</pre><p><b>ground truth</b></p><pre>" + esc(s.truth) +
      "</pre><table><tr><th>checkpoint</th><th>answer</th><th>score</th></tr>");
    steps.forEach(function (st, k) {
      var a = st.answers[i];
      if (!a) { html.push("<tr><td>" + esc(st.name) + '</td><td class="muted">no row</td><td></td></tr>'); return; }
      var cls = a[1] === 1 ? "ok" : a[1] === 0 ? "bad" : "muted";
      var swatch = a[3] ? '<span style="color:' + colors[k % colors.length] + '">■</span> ' : "";
      html.push("<tr><td>" + swatch + esc(st.name) + "</td><td><pre>" + esc(a[0]) + '</pre></td><td class="' + cls + '">' +
        (a[2] == null ? "–" : esc(a[2])) + "</td></tr>");
    });
    html.push("</table>");
    detail.innerHTML = html.join("");
    detail.setAttribute("data-sample", s.id);
  }
  list.addEventListener("change", function () { show(+list.value); });
  filter.addEventListener("change", fill); search.addEventListener("input", fill);
  function pick(i) { list.value = String(i); show(i); }
  document.querySelectorAll("a[data-sample]").forEach(function (a) {
    a.addEventListener("click", function () { pick(+a.getAttribute("data-index")); });
  });
  function fromHash() {  // #sample=ID (URL-encoded) picks a sample; -1 when none is named or found
    var got = (location.hash.match(/sample=([^&]+)/) || [])[1];
    if (!got) return -1;
    try { got = decodeURIComponent(got); } catch (e) { /* a bare % in a hand-typed address: take it as it is */ }
    return samples.findIndex(function (s) { return s.id === got; });
  }
  window.addEventListener("hashchange", function () { var i = fromHash(); if (i >= 0) pick(i); });
  fill();
  var first = location.hash ? fromHash() : -1;
  if (first < 0 && samples.length) first = 0;
  if (first >= 0) pick(first);
  mark();
  document.body.setAttribute("data-ready-ms", String(Math.round(performance.now())));
  document.body.setAttribute("data-ready", "1");
})();
"""
