"""report.html: one self-contained page (no network), its data escaped and read back, and the page of a real
4-checkpoint sweep rendered in headless Chromium: no script errors, the curves, the sample browser with
the true and predicted boxes of a box row. A screenshot is kept as a test artifact."""

import html
import json
import os
import re
import shutil
import urllib.parse

import pytest

from conftest import read_jsonl
from vlmfast.report.html import render

HOSTILE = "q</script><script>alert(1)</script>"
BROWSER_HOSTILE = "50% <img src=x onerror=alert(1)></script>&amp;"  # a manifest id as the browser test gets it


def _page(**over):
    checkpoints = [{"step": s, "label": "base" if s == 0 else "hf-trainer", "accuracy": a, "ci_low": a - 0.1,
                    "ci_high": a + 0.1, "format_rate": 0.5, "new_tokens_p50": 20, "new_tokens_p90": 30,
                    "truncation_rate": 0.0, "repetition_rate": 0.0, "tokens_per_s": 100.0}
                   for s, a in ((0, 0.2), (100, 0.5))]
    page = {"run_dir": "runs/<x>", "best": {"step": 100, "path": "p", "accuracy": 0.5},
            "flags": [{"code": "truncation", "step": 100, "figure": 0.1, "threshold": 0.05, "message": "step 100: <b>"}],
            "notes": [], "checkpoints": checkpoints,
            "samples": [{"id": HOSTILE, "prompt": "Where is the <cat>?", "truth": "[1, 2, 30, 40]", "image_path": None,
                         "size": [100, 80], "truth_box": [1, 2, 30, 40]}],
            "answers": {0: [["[0, 0, 10, 10]", 0, 0.0, [0, 0, 10, 10]]], 100: [["[1, 2, 30, 41]", 1, 0.97, [1, 2, 30, 41]]]},
            "flips": {100: {"wrong_to_right": [0], "right_to_wrong": []}}}
    return {**page, **over}


def _data(text: str) -> dict:
    payload = re.search(r"<script type='application/json' id='vlmfast-data'>(.*?)</script>", text, re.S).group(1)
    return json.loads(payload)


def test_the_page_is_self_contained_and_its_data_reads_back():
    text = render(_page())
    assert not re.search(r"""(src|href)=['"]?(https?:)?//""", text)  # nothing from the network
    assert HOSTILE not in text and "alert(1)</script>" not in text  # no way out of the data block
    outside = text.replace(re.search(r"id='vlmfast-data'>.*?</script>", text, re.S).group(0), "")
    assert "<cat>" not in outside and "runs/&lt;x&gt;" in text and "step 100: &lt;b&gt;" in text
    data = _data(text)
    assert data["samples"][0]["id"] == HOSTILE and data["samples"][0]["truth_box"] == [1, 2, 30, 40]
    assert [s["answers"][0][3] for s in data["steps"]] == [[0, 0, 10, 10], [1, 2, 30, 41]]
    assert data["flipped_any"] == [0] and data["best_index"] == 1
    assert text.count("<svg class='curve'") == 4  # accuracy, format, length, truncation (no pass@k without --n)


def test_pass_at_k_gets_its_curve_with_several_answers():
    page = _page()
    for c in page["checkpoints"]:
        c["samples"] = {"pass_at_k": {"1": 0.3, "4": 0.6}}
    assert render(page).count("<svg class='curve'") == 5


def test_sampled_figures_as_a_sweep_with_n_answers_carries_them():
    """pass@k per k and one maj@K (the majority of K answers), from the samples' own summary."""
    from vlmfast.evaluation.samples import summarize_samples

    page = _page()
    rows = [{"id": i, "sample": j, "correct": ok, "score": float(ok), "text": "<answer>1</answer>" if ok else "x"}
            for i, oks in enumerate([(1, 1, 0, 1), (0, 0, 0, 1)]) for j, ok in enumerate(oks)]
    page["checkpoints"][1]["samples"] = summarize_samples(rows)
    more = render(page).split("more figures per checkpoint")[1].split("</details>")[0]
    heads = re.findall(r"<th[^>]*>(.*?)</th>", more)
    assert heads == ["checkpoint", "pass@1", "pass@2", "pass@4", "maj@4", "all same reward"]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", more)
    assert cells[6:] == ["step 100", "50.0%", "75.0%", "100.0%", "50.0%", "0.0%"]


def test_more_figures_show_what_checkpoints_carry_and_nothing_else():
    page = _page()
    assert "more figures per checkpoint" not in render(page)
    step = page["checkpoints"][1]
    step.update(vs_best=None, new_tokens_max=64, reward_means={"acc<r>": 0.25},
                vs_base={"n": 10, "difference": 0.3, "ci_low": 0.1, "ci_high": 0.5, "p_value": 0.0312,
                         "right_to_wrong": 1, "wrong_to_right": 4})
    more = render(page).split("more figures per checkpoint")[1].split("</details>")[0]
    heads = re.findall(r"<th[^>]*>(.*?)</th>", more)
    assert heads == ["checkpoint", "vs base [95 % CI] p", "length max", "reward acc&lt;r&gt;"]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", more)
    assert cells == ["base", "–", "–", "–", "step 100", "+30.0 pp [+10.0, +50.0] p=0.0312 (4↑ 1↓)", "64", "0.250"]


def test_a_report_without_health_flags_or_manifest_still_renders(tmp_path):
    """A report of the schema's first keys only (no health figures, no flags, no manifest, a results file gone)."""
    from vlmfast.run.sweep_page import write_sweep_html

    report = {"run_dir": "r", "out_dir": "o", "best": {"step": 10, "path": "p", "accuracy": 0.5}, "notes": ["n<1>"],
              "checkpoints": [{"step": 10, "label": "hf-trainer", "path": "p", "results": str(tmp_path / "gone.jsonl"),
                               "rows": 2, "accuracy": 0.5, "ci_low": 0.1, "ci_high": 0.9, "format_rate": 1.0}]}
    text = write_sweep_html(report, tmp_path / "report.html").read_text()
    assert text.count("<svg class='curve'") == 2 and text.count("no figures") == 2  # length and truncation
    assert "n&lt;1&gt;" in text and "more figures per checkpoint" not in text and "best: step 10 (accuracy 50.0%)" in text
    assert "no base in this sweep" in text and _data(text)["samples"] == []


def test_rows_and_truths_given_in_place_of_files_long_texts_cut_and_boxes_mapped(tmp_path):
    """write_sweep_html with rows and truths handed in: nothing read from disk; texts past their limit cut
    with a marker; a box answered in the model's resized pixels drawn in the original image's."""
    from vlmfast.run.sweep_page import ANSWER_CHARS, PROMPT_CHARS, write_sweep_html

    report = {"run_dir": "r", "manifest": str(tmp_path / "absent.jsonl"), "best": None, "flags": [], "notes": [],
              "checkpoints": [{"step": 0, "label": "base", "results": str(tmp_path / "none.jsonl")},
                              {"step": 5, "label": "hf-trainer", "results": str(tmp_path / "none.jsonl")}]}
    common = {"images": [], "image_sizes": [[200, 100]], "model_image_sizes": [[100, 50]], "scorer": "bbox"}
    rows = {0: [{**common, "id": 7, "prompt": "p" * (PROMPT_CHARS + 3), "answer": "[0, 0, 10, 10]", "correct": False,
                 "iou": 0.1, "bbox_space": "resized"}],
            5: [{**common, "id": 7, "prompt": "p", "answer": "a" * (ANSWER_CHARS + 9), "correct": True, "iou": 0.9}]}
    path = write_sweep_html(report, tmp_path / "report.html", rows_by_step=rows, truths={7: [2, 2, 20, 20]})
    data = _data(path.read_text())
    sample = data["samples"][0]
    assert sample["prompt"] == "p" * PROMPT_CHARS + " … [3 more characters in the manifest]"
    assert sample["truth"] == "[2, 2, 20, 20]" and sample["truth_box"] == [2, 2, 20, 20]
    assert data["steps"][0]["answers"] == [["[0, 0, 10, 10]", 0, 0.1, [0.0, 0.0, 20.0, 20.0]]]
    assert data["steps"][1]["answers"] == [["a" * ANSWER_CHARS + " … [9 more characters in the results file]", 1, 0.9, None]]
    assert data["flipped_any"] == [0]


def test_past_the_thumbnail_budget_images_are_linked_and_the_page_says_so(tmp_path, images, monkeypatch):
    import vlmfast.report.html as page_module

    samples = [{"id": f"s{i}", "prompt": "", "truth": "", "image_path": str(p), "size": None, "truth_box": None}
               for i, p in enumerate(images[:3])]
    data = _data(render(_page(samples=samples, answers={}, flips={})))
    assert [uri[:23] for uri in data["images"]] == ["data:image/jpeg;base64,"] * 3
    monkeypatch.setattr(page_module, "THUMBNAIL_BUDGET_BYTES", 1)
    text = render(_page(samples=samples, answers={}, flips={}))
    assert _data(text)["images"][1:] == [p.resolve().as_uri() for p in images[1:3]]
    assert "1 image(s) embedded as thumbnails (up to 0 MiB); the other 2 are linked by their path" in text


@pytest.fixture(scope="module")
def swept(tmp_path_factory, images):
    """A 4-checkpoint sweep (base + 3 steps) whose manifest has a box row; step 200's answer to it is made a box."""
    from vlmfast.checkpoints.tiny import build_checkpoint
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions, sweep
    from vlmfast.run.sweep_page import write_sweep_dir

    root = tmp_path_factory.mktemp("html")
    for step, seed in ((100, 1), (200, 2), (300, 3)):
        build_checkpoint(root / "run" / f"checkpoint-{step}", preset="tiny", like="grpo", seed=seed)
    base = build_checkpoint(root / "base", preset="tiny", like="base", seed=0)
    lines = [{"id": f"q{i}", "image": str(p), "prompt": "Count.", "solution": str(i)} for i, p in enumerate(images[:3])]
    lines.append({"id": "box", "image": str(images[3]), "prompt": "Where is the square?", "solution": [4, 6, 30, 34],
                  "scorer": "bbox"})
    lines.append({"id": BROWSER_HOSTILE, "image": str(images[4]), "prompt": "<b>bold?</b> <script>alert(2)</script>",
                  "solution": "1"})
    manifest = root / "m.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    infer = InferOptions(ckpt=str(root / "run"), manifest=str(manifest), device="cpu",
                         generation=GenerationSettings(max_new_tokens=8))
    out = root / "out"
    report = sweep(SweepOptions(run_dir=str(root / "run"), out_dir=str(out), infer=infer, base=str(base)))
    rows = read_jsonl(out / "step-200.jsonl")
    for row in rows:
        if row["id"] == "box":
            row.update(text="<think>t</think><answer>[5, 6, 28, 30]</answer>", answer="[5, 6, 28, 30]", bbox_space="original")
    (out / "step-200.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_sweep_dir(report, out)
    return out


def test_a_real_sweeps_page_renders_in_chromium_with_its_curves_and_boxes(swept, tmp_path):
    from browser import dump_dom, screenshot

    page = swept / "report.html"
    url = page.as_uri() + "#sample=" + urllib.parse.quote("box")
    dom = dump_dom(url, tmp_path / "profile")
    assert 'data-ready="1"' in dom and 'data-errors="[]"' in dom
    assert dom.count('<svg class="curve"') == 4 and 'id="list"' in dom
    detail = dom[dom.index('id="detail"'):dom.index("</table>", dom.index('id="detail"'))]
    assert 'data-sample="box"' in detail
    boxes = detail[detail.index('class="boxes"'):detail.index("</svg>", detail.index('class="boxes"'))]
    assert boxes.count("<rect") == 2  # the true box and step 200's prediction
    assert detail.count("<tr>") == 5  # a header and the answers of base and three steps
    assert "✗ box</option>" in dom  # wrong at base, and base is the best step (every step scores 0)
    artifacts = os.environ.get("VLMFAST_TEST_ARTIFACTS")
    where = (tmp_path if not artifacts else __import__("pathlib").Path(artifacts))
    where.mkdir(parents=True, exist_ok=True)
    shot = screenshot(url, where / "report.png", tmp_path / "profile-shot", size="1280,2000")
    print(f"screenshot of the rendered report: {shot}")
    assert shot.stat().st_size > 10_000


def test_a_hostile_id_and_prompt_stay_text_in_chromium(swept, tmp_path):
    """An id and a prompt full of markup, picked by its URL-encoded #sample=: shown as text, nothing injected,
    no script error; a bare % in a hand-typed address falls back to the first sample without an error."""
    from browser import dump_dom

    page = swept / "report.html"
    dom = dump_dom(page.as_uri() + "#sample=" + urllib.parse.quote(BROWSER_HOSTILE, safe=""), tmp_path / "p1")
    assert 'data-ready="1"' in dom and 'data-errors="[]"' in dom
    detail = dom[dom.index('<div id="detail"'):]
    picked = re.match(r'<div id="detail" data-sample="([^"]*)"><h3>', detail).group(1)
    assert html.unescape(picked) == BROWSER_HOSTILE  # (serializers differ on escaping < > in attributes)
    assert "<h3>50% &lt;img src=x onerror=alert(1)&gt;&lt;/script&gt;&amp;amp;</h3>" in detail
    assert "&lt;b&gt;bold?&lt;/b&gt; &lt;script&gt;alert(2)&lt;/script&gt;" in detail
    markup = re.sub(r'<script type="application/json" id="vlmfast-data">.*?</script>', "", dom, flags=re.S)
    assert markup != dom and "<img src=x" not in markup and '<img src="x"' not in markup and "<b>bold?" not in markup
    dom = dump_dom(page.as_uri() + "#sample=50%", tmp_path / "p2")
    assert 'data-ready="1"' in dom and 'data-errors="[]"' in dom and '<div id="detail" data-sample="q0">' in dom


def test_the_page_is_written_beside_report_json(swept):
    text = (swept / "report.html").read_text()
    assert _data(text)["samples"][3]["truth_box"] == [4, 6, 30, 34]
    assert shutil.disk_usage(swept).free > 0 and (swept / "report.json").is_file()


def test_the_page_shows_each_reward_sub_scores_mean():
    page = _page()
    page["checkpoints"][1].update(reward_means={"math": 0.5}, reward_score_means={"format": 0.0, "accuracy": 0.55})
    more = render(page).split("more figures per checkpoint")[1].split("</details>")[0]
    assert re.findall(r"<th[^>]*>(.*?)</th>", more)[-2:] == ["sub-score format", "sub-score accuracy"]
    assert re.findall(r"<td[^>]*>(.*?)</td>", more)[-2:] == ["0.000", "0.550"]


def _x_labels(page_text: str) -> list[tuple[float, float, str]]:
    """The x axis's labels of the first chart: (left, right, text), at ~6 px a character."""
    chart = page_text.split("<svg class='curve'")[1].split("</svg>")[0]
    found = re.findall(r"<text x='([\d.]+)' y='164' font-size='10' text-anchor='(\w+)'>([^<]*)</text>", chart)
    spans = {"start": (0, 1), "middle": (0.5, 0.5), "end": (1, 0)}  # the label's share left and right of x
    return [(float(x) - 6 * len(label) * spans[a][0], float(x) + 6 * len(label) * spans[a][1], label) for x, a, label in found]


def test_the_x_axis_labels_every_step_that_fits_and_never_skips_one_it_has_room_for():
    page = _page()
    base = page["checkpoints"][0]
    page["checkpoints"] = [{**base, "step": s, "label": "base" if s == 0 else "hf-trainer"} for s in (0, 100, 200, 300)]
    assert [label for _, _, label in _x_labels(render(page))] == ["0", "100", "200", "300"]
    page["checkpoints"] = [{**base, "step": s, "label": "hf-trainer"} for s in range(100, 5001, 100)]  # 50 steps
    labels = _x_labels(render(page))
    assert labels[0][2] == "100" and labels[-1][2] == "5000" and 4 < len(labels) < 50
    assert all(a[1] < b[0] for a, b in zip(labels, labels[1:]))  # no two labels overlap


# An HTML answer cut short inside a comment, and a prompt that holds a <script> tag: "<!--" then "<script" inside
# the data block put the HTML parser in its "double-escaped" state, where the block's own </script> no longer
# ends it: the page's script is swallowed and the sample browser stays empty.
COMMENT_THEN_SCRIPT = "<html><head><!-- navigation bar, then the <script> loader"


def test_an_open_comment_then_a_script_tag_in_the_data_cannot_swallow_the_pages_script():
    page = _page(samples=[dict(_page()["samples"][0], prompt="Write the page. <script>init()</script>")],
                 answers={0: [[COMMENT_THEN_SCRIPT, 0, 0.0, None]], 100: [["<!--", 0, 0.0, None]]})
    text = render(page)
    payload = re.search(r"id='vlmfast-data'>(.*?)</script>", text, re.S).group(1)
    assert "<" not in payload  # no tag, comment or end tag can start inside the data block
    data = _data(text)
    assert data["steps"][0]["answers"][0][0] == COMMENT_THEN_SCRIPT
    assert data["samples"][0]["prompt"] == "Write the page. <script>init()</script>"


def test_an_open_comment_then_a_script_tag_renders_in_chromium(tmp_path):
    from browser import dump_dom

    page = _page(samples=[dict(_page()["samples"][0], prompt="Write the page. <script>init()</script>")],
                 answers={0: [[COMMENT_THEN_SCRIPT, 0, 0.0, None]], 100: [["ok", 1, 1.0, None]]})
    path = tmp_path / "report.html"
    path.write_text(render(page), encoding="utf-8")
    dom = dump_dom(path.as_uri(), tmp_path / "profile")
    assert 'data-ready="1"' in dom and 'data-errors="[]"' in dom
    assert "&lt;!-- navigation bar, then the &lt;script&gt; loader" in dom  # the answer, shown as text


def test_a_page_written_from_another_directory_still_finds_the_images_beside_the_manifest(tmp_path, monkeypatch):
    """Rows keep an image path as the run that wrote them resolved it (relative to its working directory, the
    manifest's folder here); a sweep resumed from elsewhere writes the page there: the thumbnails are still found."""
    from PIL import Image

    from vlmfast.run.sweep_page import page_data
    from vlmfast.report.html import _thumbnails

    data = tmp_path / "data"
    (data / "imgs").mkdir(parents=True)
    Image.new("RGB", (40, 30), "red").save(data / "imgs" / "a.png")
    (data / "m.jsonl").write_text(json.dumps({"id": "a", "image": "imgs/a.png", "prompt": "p", "solution": "1"}) + "\n")
    row = {"id": "a", "images": ["imgs/a.png"], "image_sizes": [[40, 30]], "prompt": "p", "text": "1", "answer": "1",
           "score": 1.0, "correct": True}
    report = {"run_dir": "run", "manifest": str(data / "m.jsonl"), "settings": {}, "flags": [], "notes": [],
              "checkpoints": [{"step": 100, "label": "hf-trainer", "results": str(tmp_path / "none.jsonl")}]}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    page = page_data(report, rows_by_step={100: [row]})
    images, _ = _thumbnails(page["samples"])
    assert images[0].startswith("data:image/jpeg;base64,")


def test_the_vs_base_cell_has_its_unit_and_p_best_is_worded_as_what_it_is():
    page = _page(best={"step": 100, "path": "p", "accuracy": 0.5, "p_best": 0.36, "indistinguishable": [0, 100],
                       "alpha": 0.05})
    page["checkpoints"][1]["vs_base"] = {"n": 10, "difference": 0.2, "ci_low": -0.1, "ci_high": 0.5, "p_value": 0.2,
                                         "wrong_to_right": 3, "right_to_wrong": 1}
    text = render(page)
    table = text.split("<table class='steps'>")[1].split("</table>")[0]
    assert "<td class=''>+20.0 pp (3↑ 1↓)</td>" in table  # as the terminal writes it: "+20.0 pp"
    assert "how often it is highest when the requests are resampled, not the chance it is truly best" in text


def test_the_pages_flips_count_failed_and_raised_answers_as_wrong_as_report_json_does():
    """Base right on q0–q3. Step 100 failed on q1 (an error row) and its reward raised on q2: report.json's
    vs_base counts both as right → wrong (flags.judged_tables, as the sweep judges them), so the page does too."""
    from vlmfast.run.sweep_page import page_data

    def row(rid, correct, **kw):
        return {"id": rid, "prompt": "p", "text": "<answer>1</answer>", "error": None, "score": None if correct is None else float(correct),
                "correct": correct, "format_ok": True, **kw}

    base = [row(f"q{i}", True) for i in range(4)] + [row("q4", False)]
    step = [row("q0", True), {"id": "q1", "prompt": "p", "error": "CUDA out of memory"},
            row("q2", None, score=None, reward_error="ValueError"), row("q3", False), row("q4", True)]
    report = {"run_dir": "r", "best": None, "checkpoints": [{"step": 0, "label": "base", "results": "none.jsonl"},
                                                            {"step": 100, "label": "hf-trainer", "results": "none.jsonl"}]}
    flips = page_data(report, {0: base, 100: step}, truths={})["flips"][100]
    assert (len(flips["wrong_to_right"]), len(flips["right_to_wrong"])) == (1, 3)  # q4 up; q1, q2, q3 down
