"""VLM-R1's own code, copied where vlmfast must behave as it does (om-ai-lab/VLM-R1 at 90052f4,
src/open-r1-multimodal/src/open_r1/grpo_jsonl.py ``main``, unchanged since f4f3665 in this part): how a JSONL
line becomes the dataset row its trainer hands reward functions (``datasets`` left out: the row is the dict
its ``map`` returns). Its REC reward, verbatim at both commits: ``vlmr1/qwen_module_*.py`` beside this file."""

from __future__ import annotations

import json
import os
from pathlib import Path

REWARDS = Path(__file__).parent / "vlmr1"
QWEN_MODULES = {"90052f4": REWARDS / "qwen_module_90052f4.py", "f4f3665": REWARDS / "qwen_module_f4f3665.py"}

def grpo_jsonl_rows(data_file: str, image_folder: str, accu_reward_method: str = "default") -> list[dict]:
    """grpo_jsonl.py ``main``: the JSONL loop, then ``make_conversation_from_jsonl`` (its ``prompt`` left out:
    TRL builds the prompts argument from it, not a column)."""
    all_data = []
    with open(data_file, 'r') as f:
        for line in f:
            item = json.loads(line)
            if 'image' in item:
                if isinstance(item['image'], str):
                    # Store image path instead of loading the image
                    item['image_path'] = [os.path.join(image_folder, item['image'])]
                    del item['image'] # remove the image column so that it can be loaded later
                elif isinstance(item['image'], list):
                    # if the image is a list, then it is a list of images (for multi-image input)
                    item['image_path'] = [os.path.join(image_folder, image) for image in item['image']]
                    del item['image'] # remove the image column so that it can be loaded later
                else:
                    raise ValueError(f"Unsupported image type: {type(item['image'])}")
            # Remove immediate image loading
            item['problem'] = item['conversations'][0]['value'].replace('<image>', '')

            # Handle solution that could be a float or string
            solution_value = item['conversations'][1]['value']
            if isinstance(solution_value, str):
                item['solution'] = solution_value.replace('<answer>', '').replace('</answer>', '').strip()
            else:
                # If it's a float or other non-string type, keep it as is
                item['solution'] = str(solution_value)

            del item['conversations']
            item['accu_reward_method'] = item.get('accu_reward_method', accu_reward_method) # if accu_reward_method is in the data jsonl, use the value in the data jsonl, otherwise use the defined value
            all_data.append(item)

    def make_conversation_from_jsonl(example):
        return {
            **example,
            'image_path': [p for p in example['image_path']],  # Store path instead of loaded image
            'problem': example['problem'],
            'solution': f"<answer> {example['solution']} </answer>",
            'accu_reward_method': example['accu_reward_method'],
        }

    return [make_conversation_from_jsonl(item) for item in all_data]
