import json
import shutil
import os

import pytest

from vlmfast.errors import InputError, UsageError
from vlmfast.inputs.requests import R1_INSTRUCTION, check_images, collect, expand_images, raise_for_problems


def test_directory_and_glob_expand_sorted(images):
    d = str(images[0].parent)
    paths, problems = expand_images([d])
    assert paths == [os.path.join(d, f"img_{i:03d}.png") for i in range(6)]
    assert problems == []
    globbed, _ = expand_images([os.path.join(d, "img_00[12].png")])
    assert globbed == [os.path.join(d, "img_001.png"), os.path.join(d, "img_002.png")]


def test_ids_default_to_path_as_given_and_prompt_applies_to_all(images):
    c = collect(images=[str(images[1]), str(images[0])], prompt="Count.")
    assert [r.id for r in c.requests] == [str(images[1]), str(images[0])]
    assert all(r.prompt == "Count." and r.images == (r.id,) for r in c.requests)
    assert c.image_sizes[str(images[1])] == (112, 84)


def test_r1_template_appends_instruction(images):
    c = collect(images=[str(images[0])], prompt="How many boxes?", template="r1")
    assert c.requests[0].prompt == "How many boxes? " + R1_INSTRUCTION
    rec = collect(images=[str(images[0])], prompt="the red box", template="rec")  # VLM-R1's REC question template
    assert rec.requests[0].prompt == ("the red box First output the thinking process in <think> </think> tags and then "
                                      "output the final answer in <answer> </answer> tags. Output the final answer in "
                                      "JSON format.")


def test_prompt_file_and_system(images, tmp_path):
    pf = tmp_path / "p.txt"
    pf.write_text("Describe it.\n")
    c = collect(images=[str(images[0])], prompt_file=str(pf), system="Be brief.")
    assert (c.requests[0].prompt, c.requests[0].system) == ("Describe it.", "Be brief.")


def test_manifest_ours_and_ms_swift(images, tmp_path):
    d = images[0].parent
    m = tmp_path / "m.jsonl"
    rows = [
        {"id": "a", "image": str(images[0]), "prompt": "one"},
        {"id": 7, "images": [str(images[1]), str(images[2])], "prompt": "two", "system": "sys"},
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "<image>What is this?"},
                      {"role": "assistant", "content": "ignored"}], "images": [str(images[3])]},
        {"image": os.path.relpath(images[4], tmp_path), "prompt": "relative to the manifest"},
    ]
    m.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    c = collect(manifest=str(m))
    assert [r.id for r in c.requests] == ["a", "7", str(images[3]), os.path.relpath(images[4], tmp_path)]  # as written
    assert c.requests[1].images == (str(images[1]), str(images[2])) and c.requests[1].system == "sys"
    assert (c.requests[2].prompt, c.requests[2].system) == ("What is this?", "S")
    assert c.bad == [] and d.exists()


def test_every_bad_input_is_listed_at_once(images, tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    fake = tmp_path / "fake.jpg"
    fake.write_text("this is not a jpeg")
    truncated = tmp_path / "trunc.png"
    truncated.write_bytes(images[0].read_bytes()[:40])
    m = tmp_path / "m.jsonl"
    m.write_bytes(b'{"id": "x", "image": "' + str(images[0]).encode() + b'", "prompt": "ok"}\n{not json\n\xff\xfe\n'
                  b'{"id": "noimg", "prompt": "p"}\n[1, 2]\n')
    c = collect(images=[str(tmp_path / "missing.png"), str(empty), str(fake), str(truncated), str(images[0])],
                prompt="p", manifest=str(m))
    assert [r.id for r in c.requests] == [str(images[0]), "x"]
    whats = {b.id: b.error for b in c.bad}
    assert "file not found" in whats[str(tmp_path / "missing.png")]
    assert "empty file" in whats[str(empty)]
    assert "not a readable image" in whats[str(fake)]
    assert " object at 0x" not in whats[str(fake)]  # PIL's message names an in-memory object: nothing to act on
    assert "not a readable image" in whats[str(truncated)]
    assert "invalid JSON" in whats[f"{m.name}:2"]
    assert "not valid UTF-8" in whats[f"{m.name}:3"]
    assert "no image" in whats["noimg"]
    assert "not a JSON object" in whats[f"{m.name}:5"]
    with pytest.raises(InputError) as err:
        raise_for_problems(c)
    assert len(err.value.problems) == 8 and err.value.exit_code == 2
    assert "--skip-bad" in err.value.hint


def test_duplicate_ids_and_missing_prompt_and_nothing_found(images, tmp_path):
    # an image --images names twice (a folder and a glob of it) runs once, said; a manifest's repeated id is an error
    twice = collect(images=[str(images[0]), str(images[0]), str(images[1])], prompt="p")
    assert [r.id for r in twice.requests] == [str(images[0]), str(images[1])]
    assert twice.warnings == ["--images named 1 image(s) more than once (e.g. by a folder and a glob of it): each runs once"]
    folder = images[0].parent  # a folder and a glob of it spelled differently: still one file each
    spelled = collect(images=[str(folder / "." / ""), str(folder / ".." / folder.name / "*.png")], prompt="p")
    assert len(spelled.requests) == len(list(folder.glob("*.png"))) and spelled.warnings[0].startswith(
        f"--images named {len(spelled.requests)} image(s) more than once")
    m = tmp_path / "dup.jsonl"
    m.write_text(2 * (json.dumps({"id": "a", "image": str(images[0]), "prompt": "p"}) + "\n"))
    with pytest.raises(InputError, match=f"duplicate id \\(2 records: {m}:1, {m}:2\\)"):  # the lines named
        raise_for_problems(collect(manifest=str(m)))
    with pytest.raises(UsageError, match="no prompt"):
        collect(images=[str(images[0])])
    with pytest.raises(UsageError, match="no inputs"):
        collect(prompt="p")
    c = collect(images=[str(tmp_path)], prompt="p")  # an empty directory is a listed problem
    assert c.requests == [] and "no image files" in c.bad[0].error
    m = tmp_path / "empty.jsonl"
    m.write_text("\n")
    with pytest.raises(InputError, match="holds no records"):
        collect(manifest=str(m))


def test_the_hint_offers_skip_bad_only_where_it_helps(images, tmp_path):
    m = tmp_path / "dup.jsonl"
    m.write_text(2 * (json.dumps({"id": "a", "image": str(images[0]), "prompt": "p"}) + "\n"))
    with pytest.raises(InputError) as dup:  # duplicates only: --skip-bad cannot stand for two records
        raise_for_problems(collect(manifest=str(m)))
    assert "--skip-bad" not in dup.value.hint and 'give each record its own "id"' in dup.value.hint
    with pytest.raises(InputError) as empty:  # nothing else to run
        raise_for_problems(collect(images=[str(tmp_path)], prompt="p"))
    assert "--skip-bad" not in empty.value.hint and "no other input to run" in empty.value.hint
    with pytest.raises(InputError) as only_bad:  # --skip-bad with nothing else to run: no model loads for error rows alone
        raise_for_problems(collect(images=[str(tmp_path)], prompt="p"), skip_bad=True)
    assert "no other input to run" in only_bad.value.hint and "no model was loaded" in only_bad.value.hint
    with pytest.raises(InputError) as some:  # a good image beside the bad one: --skip-bad runs it
        raise_for_problems(collect(images=[str(images[0]), str(tmp_path / "gone.png")], prompt="p"))
    assert "--skip-bad" in some.value.hint
    with pytest.raises(InputError) as bench:  # a command without --skip-bad (bench) does not offer it
        raise_for_problems(collect(images=[str(images[0]), str(tmp_path / "gone.png")], prompt="p"), offers_skip_bad=False)
    assert bench.value.hint == "fix or remove them"


def test_unknown_manifest_fields_warn(images, tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"id": "a", "image": str(images[0]), "prompt": "p", "label": 3}) + "\n")
    c = collect(manifest=str(m))
    assert c.warnings == [f"{m}: ignored unknown manifest fields: label"]


def test_a_bad_record_and_a_good_one_cannot_share_an_id(images, tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"id": "q1", "prompt": "no image"}) + "\n"
                 + json.dumps({"id": "q1", "image": str(images[0]), "prompt": "p"}) + "\n")
    with pytest.raises(InputError, match="q1: duplicate id"):
        raise_for_problems(collect(manifest=str(m)), skip_bad=True)  # no error row can stand for both


def test_every_problem_of_a_manifest_in_one_error(images, tmp_path):
    """A duplicate id, a line of bad JSON and a missing image: all three in one error, not the first alone."""
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"id": "a", "image": str(images[0]), "prompt": "p"}) + "\n"
                 + json.dumps({"id": "a", "image": str(images[1]), "prompt": "p"}) + "\n"
                 + "{not json\n"
                 + json.dumps({"id": "c", "image": str(tmp_path / "gone.png"), "prompt": "p"}) + "\n")
    with pytest.raises(InputError) as err:
        raise_for_problems(collect(manifest=str(m)))
    text = err.value.message
    assert "3 bad input(s)" in text and f"a: duplicate id (2 records: {m}:1, {m}:2)" in text
    assert f"{m}:3: invalid JSON" in text and f"gone.png: file not found ({m}:4, id c)" in text


def test_image_limits_name_the_pixel_count_and_warn_nothing(tmp_path):
    import warnings

    from PIL import Image

    over, bomb = tmp_path / "over.png", tmp_path / "bomb.png"
    Image.new("RGB", (100, 80)).save(over)  # 8,000 pixels: over 5,000, under twice that
    Image.new("RGB", (200, 100)).save(bomb)  # 20,000: over twice the limit
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's DecompressionBombWarning would raise here
        sizes, problems = check_images([str(over), str(bomb)], max_image_pixels=5000)
    assert sizes == {}
    assert problems[str(over)] == "image has 8000 pixels, over the limit of 5000 (--max-image-pixels)"
    assert problems[str(bomb)].startswith("image has 20000 pixels") and "decompression bomb" in problems[str(bomb)]


def test_a_cut_jpeg_and_an_aspect_ratio_the_processor_refuses_fail_the_check_not_the_run(tmp_path):
    """A JPEG's header reads though its data was cut short (a download that stopped): only decoding finds it.
    Qwen's processors refuse images over 200:1. Both are input problems, found before any model loads."""
    import numpy as np
    from PIL import Image

    photo, cut, thin = tmp_path / "photo.jpg", tmp_path / "cut.jpg", tmp_path / "thin.png"
    Image.fromarray((np.random.default_rng(0).random((300, 400, 3)) * 255).astype("uint8")).save(photo, quality=90)
    cut.write_bytes(photo.read_bytes()[: photo.stat().st_size // 2])
    Image.new("RGB", (3, 700)).save(thin)
    sizes, problems = check_images([str(photo), str(cut), str(thin)])
    assert sizes == {str(photo): (400, 300)}
    assert problems[str(cut)].startswith("not a readable image (OSError: image file is truncated")
    assert problems[str(thin)].startswith("3×700 px: an aspect ratio over 200:1")
    cut.write_bytes(photo.read_bytes())  # mended in place: checked again, not taken from the earlier check
    assert str(cut) in check_images([str(cut)])[0]


def test_first_use_slips_in_inputs(images, tmp_path):
    """An empty --prompt (an unset shell variable) is refused; a manifest saved with a byte-order mark reads; a
    directory's hidden files (macOS's ._x.png) are no inputs; a URL is said to be one."""

    with pytest.raises(UsageError, match="--prompt is empty"):
        collect(images=[str(images[0])], prompt="  ")
    m = tmp_path / "m.jsonl"
    m.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "image": str(images[0]), "prompt": "p"}).encode() + b"\n")
    assert [r.id for r in collect(manifest=str(m)).requests] == ["a"]
    folder = tmp_path / "imgs"
    folder.mkdir()
    shutil.copy(images[0], folder / "x.png")
    (folder / "._x.png").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    c = collect(images=[str(folder), "https://example.com/cat.png"], prompt="p")
    assert [r.id for r in c.requests] == [str(folder / "x.png")]
    assert [b.error for b in c.bad] == ["https://example.com/cat.png: a URL: images are read from local files (download it first)"]


def test_a_vlmr1_line_whose_image_is_elsewhere_names_it_once_and_says_how_to_point_at_its_folder(images, tmp_path, monkeypatch):
    """VLM-R1 joins its --image_folders to a line's image; here the folder is the manifest's: a missing image
    is named against it once (not joined twice), and the hint says how to write the paths for another folder."""
    folder = tmp_path / "jsonl"
    folder.mkdir()
    line = {"id": 1, "image": "a.png", "conversations": [{"from": "human", "value": "<image>Which?"},
                                                          {"from": "gpt", "value": "<answer>B</answer>"}]}
    (folder / "m.jsonl").write_text(json.dumps(line) + "\n")
    monkeypatch.chdir(tmp_path)  # the manifest named relatively, as users do
    with pytest.raises(InputError) as err:
        raise_for_problems(collect(manifest="jsonl/m.jsonl"))
    assert "  - jsonl/a.png: file not found" in str(err.value) and "jsonl/jsonl" not in str(err.value)
    assert "give --image-root DIR" in err.value.hint
    with pytest.raises(InputError) as err:  # --image-root given, and wrong: the hint names it, not the option to give
        raise_for_problems(collect(manifest="jsonl/m.jsonl", image_root="elsewhere"))
    assert "read under --image-root elsewhere" in err.value.hint and "give --image-root DIR" not in err.value.hint
    with pytest.raises(InputError) as err:  # --images names files: no manifest whose paths to re-read
        raise_for_problems(collect(images=["nothere.png"], prompt="x"))
    assert "nothere.png: file not found" in str(err.value) and "manifest" not in err.value.hint
    shutil.copy(images[0], tmp_path / "a.png")  # the images' folder, given: the line's image is found there
    collected = collect(manifest="jsonl/m.jsonl", image_root=str(tmp_path))
    assert [r.images for r in collected.requests] == [(str(tmp_path / "a.png"),)] and not collected.bad
    assert collected.requests[0].record["image_path"] == [str(tmp_path / "a.png")]  # what VLM-R1's rewards are handed


def test_lines_without_an_id_asking_about_one_image_are_named_by_its_rank(images, tmp_path):
    """R1-V and ms-swift files ask several questions of one image without ids: the first line keeps the
    image as its id (as every id-less line always had), the later ones get IMAGE#2, IMAGE#3, … — stable
    when lines are appended; an explicit id that collides with one is still a duplicate."""
    image = str(images[0])
    lines = [{"image_path": image, "question": "Q1", "ground_truth": "1"},
             {"image_path": image, "question": "Q2", "ground_truth": "2"},
             {"image_path": str(images[1]), "question": "Q3", "ground_truth": "3"},
             {"messages": [{"role": "user", "content": "<image>Q4"}], "images": [image]}]
    m = tmp_path / "r1v.jsonl"
    m.write_text("".join(json.dumps(line) + "\n" for line in lines))
    c = collect(manifest=str(m))
    assert [(r.id, r.prompt, r.truth) for r in c.requests] == [
        (image, "Q1", "1"), (f"{image}#2", "Q2", "2"), (str(images[1]), "Q3", "3"), (f"{image}#3", "Q4", None)]
    assert not c.fatal and any(f"({image}#2, …)" in w for w in c.warnings)
    with m.open("a") as f:
        f.write(json.dumps({"id": f"{image}#2", "image": image, "prompt": "Q5"}) + "\n")
    with pytest.raises(InputError, match=f"duplicate id \\(2 records: {m}:2, {m}:5\\)"):  # the lines named
        raise_for_problems(collect(manifest=str(m)))


def test_a_prompt_that_is_not_utf8_and_one_no_record_uses_are_said_before_loading(images, tmp_path):
    with pytest.raises(UsageError, match="--prompt is not valid UTF-8 text"):
        collect(images=[str(images[0])], prompt="bad \udcff byte")  # what Python makes of a \xff on the command line
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"id": "a", "image": str(images[0]), "prompt": "Own?"}) + "\n")
    c = collect(manifest=str(m), prompt="Override?")
    assert [r.prompt for r in c.requests] == ["Own?"] and any("so it is not used" in w for w in c.warnings)
    m.write_text(json.dumps({"id": "a", "image": str(images[0])}) + "\n")
    c = collect(manifest=str(m), prompt="Fallback?")
    assert [r.prompt for r in c.requests] == ["Fallback?"] and not any("not used" in w for w in c.warnings)


def test_a_manifest_is_read_again_only_when_its_files_changed(images, tmp_path, monkeypatch):
    """A sweep reads its inputs for every checkpoint: the same manifest, unchanged, is parsed once (a TSV's
    images were decoded anew each time); an edit, even one of the same size, is read."""
    import vlmfast.inputs.requests as requests

    parsed = []
    real = requests._read_manifest
    monkeypatch.setattr(requests, "_read_manifest", lambda *a, **k: parsed.append(1) or real(*a, **k))
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"id": "a", "image": str(images[0]), "prompt": "One?"}) + "\n")
    first = collect(manifest=str(m))
    second = collect(manifest=str(m))
    assert len(parsed) == 1 and [r.prompt for r in second.requests] == [r.prompt for r in first.requests] == ["One?"]
    m.write_text(json.dumps({"id": "a", "image": str(images[0]), "prompt": "Two?"}) + "\n")  # the same size
    assert [r.prompt for r in collect(manifest=str(m)).requests] == ["Two?"] and len(parsed) == 2
    collect(manifest=str(m), prompt="Other?")  # another reading of it: read again
    assert len(parsed) == 3


def test_a_bad_line_without_an_id_keeps_its_rank_so_mending_it_moves_no_other_id(images, tmp_path):
    image = str(images[0])
    m = tmp_path / "m.jsonl"
    lines = [{"image": image, "prompt": "Q1", "scorer": "exactt"}, {"image": image, "prompt": "Q2"}]
    m.write_text("".join(json.dumps(line) + "\n" for line in lines))
    c = collect(manifest=str(m))
    assert [b.id for b in c.bad] == [image] and [r.id for r in c.requests] == [f"{image}#2"]
    lines[0]["scorer"] = "exact"  # mended: the ids stay
    m.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [r.id for r in collect(manifest=str(m)).requests] == [image, f"{image}#2"]


def test_a_manifest_s_requests_take_system_template_and_sizes_once(images, tmp_path, monkeypatch):
    """A manifest of many lines about a few images (a resume re-reads all of them): each request's prompt is
    rendered once, --system fills in for the records without one, every line's relative image resolves to the
    same file (looked up once per distinct path in a read) and carries its size; a request whose image is
    missing keeps the rendered prompt and the system too."""
    from vlmfast.inputs import jsonl

    folder = tmp_path / "imgs"
    folder.mkdir()
    for k in range(2):
        shutil.copy(images[k], folder / f"{k}.png")
    lines = [{"id": f"q{i}", "image": f"imgs/{i % 2}.png", "prompt": f"Q{i}?"} for i in range(6)]
    lines[3]["system"] = "own"
    lines.append({"id": "gone", "image": "imgs/none.png", "prompt": "Q?"})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    looked_up = []
    real = jsonl.resolve_relative
    monkeypatch.setattr(jsonl, "resolve_relative", lambda image, base: looked_up.append(image) or real(image, base))
    c = collect(manifest=str(manifest), template="r1", system="G")
    assert sorted(looked_up) == ["imgs/0.png", "imgs/1.png", "imgs/none.png"]
    assert [r.prompt for r in c.requests] == [f"Q{i}? {R1_INSTRUCTION}" for i in range(6)]
    assert [r.system for r in c.requests] == ["G", "G", "G", "own", "G", "G"]
    assert [r.images for r in c.requests] == [(str(folder / f"{i % 2}.png"),) for i in range(6)]
    assert [r.image_sizes for r in c.requests] == [(c.image_sizes[r.images[0]],) for r in c.requests]
    assert c.image_sizes[str(folder / "1.png")] == (112, 84)
    [bad] = c.bad
    assert (bad.id, bad.request.prompt, bad.request.system) == ("gone", f"Q? {R1_INSTRUCTION}", "G")
    assert "file not found" in bad.error
