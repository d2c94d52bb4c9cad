"""The chat templates vlmfast supplies: its own ChatML template (the tiny checkpoints ship it) and Qwen2-VL's
released one, which the loader puts on a checkpoint that lost its template."""

# ChatML, one block per turn; image/video parts become vision placeholder runs. The tiny test
# checkpoints ship it, and the loader falls back to it for checkpoints that lost their template.
CHAT_TEMPLATE = r"""{#- vlmfast: ChatML turns, vision parts rendered as placeholder runs -#}
{%- for turn in messages -%}
{{- '<|im_start|>' + turn['role'] + '\n' -}}
{%- if turn['content'] is string -%}
{{- turn['content'] -}}
{%- else -%}
{%- for part in turn['content'] -%}
{%- if part.get('type') in ('image', 'image_url') or 'image' in part -%}
{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
{%- elif part.get('type') == 'video' or 'video' in part -%}
{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
{%- elif 'text' in part -%}
{{- part['text'] -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

# Qwen2-VL's and Qwen2.5-VL's released chat template, verbatim: a prompt without a system turn gets
# "You are a helpful assistant." (trainers that load the released processor train with it)
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content "
    "or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' "
    "or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)
