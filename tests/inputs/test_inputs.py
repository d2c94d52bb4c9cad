import json
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
    assert "not a readable image" in whats[str(truncated)]
    assert "invalid JSON" in whats[f"{m}:2"]
    assert "not valid UTF-8" in whats[f"{m}:3"]
    assert "no image" in whats["noimg"]
    assert "not a JSON object" in whats[f"{m}:5"]
    with pytest.raises(InputError) as err:
        raise_for_problems(c)
    assert len(err.value.problems) == 8 and err.value.exit_code == 2
    assert "--skip-bad" in err.value.hint


def test_duplicate_ids_and_missing_prompt_and_nothing_found(images, tmp_path):
    with pytest.raises(InputError, match="duplicate id"):
        raise_for_problems(collect(images=[str(images[0]), str(images[0])], prompt="p"))
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
    with pytest.raises(InputError) as dup:  # duplicates only: --skip-bad cannot stand for two records
        raise_for_problems(collect(images=[str(images[0]), str(images[0])], prompt="p"))
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
    assert "3 bad input(s)" in text and "a: duplicate id (2 records)" in text
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
