"""transformers' apply_chat_template on chat templates of real-world formats.

Usage: apply_chat_template.py WORKDIR

Trains a small byte-level BPE tokenizer (HF `tokenizers`) with the special
tokens of every format below and writes, for each template NAME:

  WORKDIR/NAME/            a tokenizer folder whose tokenizer_config.json
                           records the template as its chat_template
  WORKDIR/NAME.jsonl       per conversation: {"messages", "text", "ids", "mask",
                           "offsets" (each token's characters, tokenizers'
                           offset_mapping), "prompt_messages", "prompt_ids"}, with "error"
                           and "error_type" / "prompt_error" in place of
                           what transformers (or the mask rule) refuses;
                           with two replies or more, "turns": data.split_turns'
                           samples, one per reply (turn_samples), or "turns_error"
  WORKDIR/NAME.json        {"eot_id", "reply", "reply_ids" or
                           "reply_error", "generation"}

The templates are written for this test in the style of each family's own
(ChatML/Qwen with a default system prompt, LLaMA-3, LLaMA-2 and Mistral
[INST], Zephyr, Gemma, Phi-3, Open-Assistant, Qwen2.5-style tool calls,
Qwen3-style reasoning, and one using namespace, tojson and filters; Zephyr's marks only the content, not the EOS after
it). Those marked with {% generation %} get transformers'
assistant masks (return_assistant_tokens_mask=True). Each also has a NAME-nogen
variant without the generation tags, whose mask is computed here by the rule
docs/data.md states ("Chat templates as written"): each reply trains what it
adds to the text, render(messages[:i+1]) minus render(messages[:i],
add_generation_prompt=True), up to and including the end-of-turn token.

WORKDIR/reasoning-kwargs.jsonl: {"messages", "chat_template_kwargs",
"prompt_ids"}, the reasoning template's generation prompts with
enable_thinking=False passed to apply_chat_template.

WORKDIR/jinja.jsonl holds jinja2 renderings (transformers' environment) of
the interpreter cases in JINJA_CASES, {"template", "vars", "text",
"generation"} or {"template", "vars", "error"}.
"""
import json
import os
import re
import shutil
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

SPECIAL = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<|user|>",
           "<|assistant|>", "<|system|>", "<|end|>", "<|endoftext|>", "<|prompter|>"]

CHATML = """{%- for message in messages %}
    {%- if loop.first and messages[0]['role'] != 'system' %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
    {{- '<|im_start|>' + message['role'] + '\\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}
            {{- message['content'] + '<|im_end|>' }}
        {%- endgeneration %}
    {%- else %}
        {{- message['content'] + '<|im_end|>' }}
    {%- endif %}
    {{- '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{%- if system_message %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}
    {%- else %}
        {{- message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{% generation %}{{ ' '  + content.strip() + ' ' + eos_token }}"
          "{% endgeneration %}{% endif %}{% endfor %}")

MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {% generation %}{{- ' ' + message['content'] + eos_token}}{% endgeneration %}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\\n' }}{% generation %}{{ message['content'] }}{% endgeneration %}{{ eos_token }}

{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         "{% endif %}{{ '<start_of_turn>' + role + '\\n' }}{% if role == 'model' %}{% generation %}"
         "{{ message['content'] | trim + '<end_of_turn>' }}{% endgeneration %}{{ '\\n' }}"
         "{% else %}{{ message['content'] | trim + '<end_of_turn>\\n' }}{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")

PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}"
        "{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' %}"
        "{{'<|assistant|>\\n'}}{% generation %}{{message['content'] + '<|end|>'}}{% endgeneration %}{{'\\n'}}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")

OASST = """{%- for message in messages -%}
  {%- if message.role == 'user' -%}
    {{ '<|prompter|>' ~ message.content ~ eos_token }}
  {%- elif message.role == 'system' -%}
    {{ '<|system|>' ~ message.content ~ eos_token }}
  {%- else -%}
    {{ '<|assistant|>' }}{% generation %}{{ message.content ~ eos_token }}{% endgeneration %}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"""

# ChatML with a summary of the conversation in the system turn: namespace,
# tojson, selectattr, map, unique, loop.last, inline if.
SUMMARY = """{%- set ns = namespace(system=none, last_user=-1) %}
{%- for m in messages | selectattr('role', 'equalto', 'system') %}{% set ns.system = m.content %}{% endfor %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- set info = {'turns': messages | length, 'last_user': ns.last_user,
                'roles': messages | map(attribute='role') | unique | list} %}
{{- '<|im_start|>system\\n' ~ (ns.system if ns.system is not none else 'You are Anvil.') ~ '\\n' ~ info | tojson }}
{{- '<|im_end|>\\n' }}
{%- for m in messages if m.role != 'system' %}
    {{- '<|im_start|>' ~ m.role ~ '\\n' }}
    {%- if m.role == 'assistant' %}
        {%- generation %}{{ m.content | trim }}<|im_end|>{% endgeneration %}
    {%- else %}
        {{- m.content | trim ~ '<|im_end|>' }}
    {%- endif %}
    {{- '\\n' if not loop.last or add_generation_prompt else '' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"""

# Tool use in the style of Qwen2.5's: the tools' schemas (tojson) in the
# system turn, tool_calls (dicts or JSON strings as arguments, one or
# several) in the assistant turn, consecutive tool messages in one user turn.
TOOLS = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n\\nYou may call functions. Their signatures:\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
    {{- '\\n</tools>\\nReply with <tool_call>{"name": ..., "arguments": ...}</tool_call> to call one.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'user' or message.role == 'system' %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
            {%- if message.content %}{{- message.content }}{%- endif %}
            {%- for tool_call in message.tool_calls | default([]) %}
                {%- set call = tool_call.function if tool_call.function is defined else tool_call %}
                {%- if not loop.first or message.content %}{{- '\\n' }}{%- endif %}
                {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
                {%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
            {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response' + (' name="' + message.name + '"' if message.name is defined else '') + '>\\n' }}
        {{- message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

# Reasoning replies in the style of Qwen3's: a reply's reasoning comes from
# reasoning_content or from a <think>...</think> prefix of its content, and is
# kept only for the replies after the last real user query (found by a
# reversed loop with a namespace; tool responses in user turns do not count),
# each of which gets a think block, empty when there is no reasoning;
# enable_thinking=false writes an empty block into the generation prompt.
REASONING = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == 'user' and message.content is string and
          not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
            {%- if loop.index0 > ns.last_query_index %}
                {{- '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- content }}
            {%- endif %}
            {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

TEMPLATES = {
    "chatml": (CHATML, {"eos_token": "<|im_end|>"}),
    "llama3": (LLAMA3, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "llama2": (LLAMA2, {"bos_token": "<s>", "eos_token": "</s>"}),
    "mistral": (MISTRAL, {"bos_token": "<s>", "eos_token": "</s>"}),
    "zephyr": (ZEPHYR, {"bos_token": "<s>", "eos_token": "</s>"}),
    "gemma": (GEMMA, {"bos_token": "<bos>", "eos_token": "<eos>"}),
    "phi3": (PHI3, {"bos_token": "<s>", "eos_token": "<|endoftext|>"}),
    "oasst": (OASST, {"eos_token": "</s>"}),
    "summary": (SUMMARY, {"eos_token": "<|im_end|>"}),
    "tools": (TOOLS, {"eos_token": "<|im_end|>"}),
    "reasoning": (REASONING, {"eos_token": "<|im_end|>"}),
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": " Blue, like the sky. "}],
    [{"role": "system", "content": "Answer in German."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blau"}, {"role": "user", "content": "Another one?\n"},
     {"role": "assistant", "content": "Grün — ein schönes Wort 🌿"}, {"role": "user", "content": "Danke!"},
     {"role": "assistant", "content": "Bitte."}],
    [{"role": "user", "content": "  leading spaces\tand tabs  "},
     {"role": "assistant", "content": "\nnewline first\n\nand paragraphs"},
     {"role": "user", "content": "日本語で答えて"}, {"role": "assistant", "content": "はい、わかりました。"}],
    [{"role": "user", "content": "Say <|im_end|> and </s> literally"},
     {"role": "assistant", "content": "Sure: {\"json\": [1, 2]} 'quotes' \\ back\\slash"}],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "Hmm."}],
    [{"role": "user", "content": "Only a question?"}],
    [{"role": "system", "content": "System only, then a user."}, {"role": "user", "content": "Hello"}],
    [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "Now a rare character."}, {"role": "assistant", "content": "G clef 𝄞"}],
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Its name"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
ARITHMETIC = [{"type": "function", "function": {"name": name, "description": f"{name.title()} two numbers.",
                                                "parameters": {"type": "object",
                                                               "properties": {"b": {"type": "number"},
                                                                              "a": {"type": "number"}},
                                                               "required": ["a", "b"]}}}
              for name in ("add", "multiply")]

# (messages, tools) for the tool-use template: OpenAI's form (a null content
# beside tool_calls, tool_call_id), arguments as an object and as a JSON
# string, parallel calls, tools without a call, calls without tools, [].
TOOL_CONVERSATIONS = [
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": None, "tool_calls": [
          {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
      {"role": "assistant", "content": "21 °C and clear ☀️"}], [WEATHER]),
    ([{"role": "system", "content": "Use the tools for arithmetic."},
      {"role": "user", "content": "(2+3)*4 and 7*6?"},
      {"role": "assistant", "content": "Two calls at once.", "tool_calls": [
          {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}},
          {"type": "function", "function": {"name": "multiply", "arguments": {"b": 6, "a": 7}}}]},
      {"role": "tool", "content": "5"}, {"role": "tool", "content": "42"},
      {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "multiply",
                                                                             "arguments": {"a": 5, "b": 4}}}]},
      {"role": "tool", "name": "multiply", "content": "20"},
      {"role": "assistant", "content": "20 and 42."}], ARITHMETIC),
    ([{"role": "user", "content": "Just say hi."}, {"role": "assistant", "content": "Hi!"}], [WEATHER] + ARITHMETIC),
    ([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                             "arguments": {"city": "Zürich"}}}]},
      {"role": "tool", "content": "snow"}, {"role": "assistant", "content": "Snow."}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello."}], []),
]

# (messages, None) for the reasoning template: reasoning_content, a <think> prefix in the content, a reply
# before the last query (its reasoning dropped), a tool response in a user turn, no reasoning at all.
REASONING_CONVERSATIONS = [
    ([{"role": "user", "content": "What is 17 * 3?"},
      {"role": "assistant", "reasoning_content": "17 * 3 = 51.", "content": "51"}], None),
    ([{"role": "system", "content": "Think, then answer."}, {"role": "user", "content": "2 + 2?"},
      {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"},
      {"role": "user", "content": "And 3 + 3?"},
      {"role": "assistant", "reasoning_content": "\nThree and three.\n", "content": "\n6"}], None),
    ([{"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "reasoning_content": "Ask the tool.", "content": "<tool_call>oslo</tool_call>"},
      {"role": "user", "content": "<tool_response>rain</tool_response>"},
      {"role": "assistant", "content": "<think>It rains.</think>Rain."}], None),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], None),
    ([{"role": "user", "content": "Only a question?"}], None),
]

REPLY = " Blue, like the sky. 🌿"
PROBE_USER, PROBE_REPLY = "Hi", "ANVILREPLY"


GENERATION_TAG = r"\{%-?\s*(end)?generation\s*-?%\}"


def strip_generation(template):
    return re.sub(GENERATION_TAG, "", template)


def render(tok, template, messages, generation_prompt, track=False, tools=None):
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]  # as apply_chat_template
    texts, spans = render_jinja_template(conversations=[messages], chat_template=template, tools=tools,
                                         return_assistant_tokens_mask=track, add_generation_prompt=generation_prompt,
                                         **tok.special_tokens_map)
    return (texts[0], spans[0]) if track else texts[0]


def hf_mask(offsets, spans):
    """transformers' return_assistant_tokens_mask (5.24 on) from character spans: every token whose
    characters (its tokenizers offsets) overlap a span."""
    return [int(any(start < token_end and token_start < end for start, end in spans))
            for token_start, token_end in offsets]


def end_of_turn(tok, template):
    """The first special token rendered after a reply's content, else EOS (docs/data.md)."""
    try:
        text = render(tok, template, [{"role": "user", "content": PROBE_USER},
                                      {"role": "assistant", "content": PROBE_REPLY}], False)
    except Exception:  # noqa: BLE001 - a template that refuses the probe
        return tok.eos_token_id
    k = text.find(PROBE_REPLY)
    if k < 0:
        return tok.eos_token_id
    for i in tok(text[k + len(PROBE_REPLY):], add_special_tokens=False)["input_ids"]:
        added = tok.added_tokens_decoder.get(i)
        if added is not None and added.special:
            return i
    return tok.eos_token_id


def reply_spans(tok, template, messages, full, eot_text, tools=None):
    """The documented rule for templates without {% generation %}."""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render(tok, template, messages[:i], True, tools=tools)
        through = render(tok, template, messages[:i + 1], False, tools=tools)
        if not through.startswith(prompt) or not full.startswith(through):
            raise ValueError("the reply's rendering is not a continuation")
        end = len(through)
        k = through.find(eot_text, len(prompt))
        if k >= 0:
            end = k + len(eot_text)
        spans.append((len(prompt), end))
    return spans


def encode(tok, template, messages, generation, eot_text, tools=None):
    """The rendered text, its ids, trained-token mask and each token's character offsets."""
    full = render(tok, template, messages, False, tools=tools)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [list(o) for o in enc["offset_mapping"]]
    if generation:
        r = tok.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                    return_assistant_tokens_mask=True, tools=tools)
        assert list(r["input_ids"]) == ids
        return full, ids, list(r["assistant_masks"]), offsets
    assert ids == list(tok.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                               tools=tools)["input_ids"])
    return full, ids, hf_mask(offsets, reply_spans(tok, template, messages, full, eot_text, tools)), offsets


def turn_samples(tok, template, messages, generation, eot_text, render_fn, **apply_kwargs):
    """data.split_turns (docs/data.md): one sample per assistant turn i. With {% generation %}: transformers'
    rendering of the conversation through it, trained on its last block. Without: the conversation before it
    rendered with add_generation_prompt (what the model reads when it writes the reply), then what the
    rendering through reply i adds after the conversation before it, from where the two renderings part, trained
    up to the end-of-turn token. render_fn(messages, generation_prompt, track) renders as apply_chat_template does
    with this conversation's tools and kwargs."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        through = messages[:i + 1]
        if generation:
            text, spans = render_fn(through, False, True)
            span = spans[-1]
            ids = list(tok.apply_chat_template(through, chat_template=template, tokenize=True, return_dict=True,
                                               **apply_kwargs)["input_ids"])
        else:
            with_reply = render_fn(through, False, False)
            prompt = render_fn(messages[:i], True, False)
            common = len(os.path.commonprefix([prompt, with_reply]))
            if common < len(prompt) and not (with_reply.startswith(before := render_fn(messages[:i], False, False))
                                             and len(before) <= common):
                raise ValueError("the conversation through the reply does not continue the one before it")
            text = prompt + with_reply[common:]
            k = text.find(eot_text, len(prompt))
            span = (len(prompt), k + len(eot_text) if k >= 0 else len(text))
            ids = None
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        assert ids is None or list(enc["input_ids"]) == ids
        out.append({"ids": list(enc["input_ids"]),
                    "mask": hf_mask([list(o) for o in enc["offset_mapping"]], [span])})
    return out


def reply_ids(tok, template, generation, eot_text):
    conv = [{"role": "user", "content": PROBE_USER}, {"role": "assistant", "content": REPLY}]
    if generation:
        text, spans = render(tok, template, conv, False, track=True)
    else:
        text = render(tok, template, conv, False)
        spans = reply_spans(tok, template, conv, text, eot_text)
    start, end = spans[0]
    return tok(text[start:end], add_special_tokens=False)["input_ids"]


def write_template(work, name, template, special, tok_json, conversations):
    folder = os.path.join(work, name)
    os.makedirs(folder, exist_ok=True)
    shutil.copy(tok_json, os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, **special}, f)
    hf = PreTrainedTokenizerFast(tokenizer_file=tok_json, **special)
    generation = re.search(GENERATION_TAG, template) is not None
    eot = end_of_turn(hf, template)
    eot_text = hf.convert_ids_to_tokens(eot)
    with open(os.path.join(work, name + ".jsonl"), "w") as f:
        for conv, tools in conversations:
            out = {"messages": conv}
            if tools is not None:
                out["tools"] = tools
            try:
                out["text"], out["ids"], out["mask"], out["offsets"] = encode(hf, template, conv, generation, eot_text,
                                                                              tools)
            except Exception as e:  # noqa: BLE001 - the template refuses the conversation
                out["error"], out["error_type"] = str(e), type(e).__name__
            if sum(m["role"] == "assistant" for m in conv) >= 2:
                try:
                    out["turns"] = turn_samples(
                        hf, template, conv, generation, eot_text,
                        lambda m, prompt, track: render(hf, template, m, prompt, track=track, tools=tools), tools=tools)
                except Exception as e:  # noqa: BLE001 - the template refuses the conversation
                    out["turns_error"] = str(e)
            last = max((i for i, m in enumerate(conv) if m["role"] == "assistant"), default=len(conv))
            if last == 0:  # apply_chat_template refuses an empty conversation
                f.write(json.dumps(out, ensure_ascii=False) + "\n")
                continue
            out["prompt_messages"] = conv[:last]
            try:
                out["prompt_ids"] = list(hf.apply_chat_template(conv[:last], chat_template=template, tokenize=True,
                                                                return_dict=True, add_generation_prompt=True,
                                                                tools=tools)["input_ids"])
            except Exception as e:  # noqa: BLE001
                out["prompt_error"] = str(e)
            f.write(json.dumps(out, ensure_ascii=False) + "\n")
    meta = {"eot_id": eot, "reply": REPLY, "generation": generation}
    try:
        meta["reply_ids"] = reply_ids(hf, template, generation, eot_text)
    except ValueError as e:
        meta["reply_error"] = str(e)
    with open(os.path.join(work, name + ".json"), "w") as f:
        json.dump(meta, f)


def train_tokenizer(path):
    corpus = [m["content"] for conv in CONVERSATIONS for m in conv]
    corpus += ["user assistant system model [INST] [/INST] <<SYS>> <</SYS>>",
               "The quick brown fox jumps over the lazy dog."] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.save(path)


def jinja_references(work):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from jinja_cases import JINJA_CASES, JINJA_VARS  # noqa: E402
    with open(os.path.join(work, "jinja.jsonl"), "w") as f:
        for template, extra in JINJA_CASES:
            variables = dict(JINJA_VARS, **extra)
            out = {"template": template, "vars": variables}
            try:
                text, spans = render_jinja_template(conversations=[variables["messages"]], chat_template=template,
                                                    return_assistant_tokens_mask=True,
                                                    **{k: v for k, v in variables.items() if k != "messages"})
                out["text"], out["generation"] = text[0], [list(s) for s in spans[0]]
            except Exception as e:  # noqa: BLE001
                out["error"] = type(e).__name__ + ": " + str(e)
            f.write(json.dumps(out, ensure_ascii=False) + "\n")


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    tok_json = os.path.join(work, "tokenizer.json")
    train_tokenizer(tok_json)
    names = []
    plain = [(conv, None) for conv in CONVERSATIONS]
    for name, (template, special) in TEMPLATES.items():
        conversations = {"tools": TOOL_CONVERSATIONS, "reasoning": REASONING_CONVERSATIONS}.get(name, plain)
        write_template(work, name, template, special, tok_json, conversations)
        write_template(work, name + "-nogen", strip_generation(template), special, tok_json, conversations)
        names += [name, name + "-nogen"]
    with open(os.path.join(work, "templates.json"), "w") as f:
        json.dump(names, f)
    # Template variables beyond the standard ones (TRL's chat_template_kwargs): enable_thinking=False in the
    # generation prompts of the reasoning template.
    template, special = TEMPLATES["reasoning"]
    hf = PreTrainedTokenizerFast(tokenizer_file=tok_json, **special)
    with open(os.path.join(work, "reasoning-kwargs.jsonl"), "w") as f:
        for conv, _ in REASONING_CONVERSATIONS:
            last = max((i for i, m in enumerate(conv) if m["role"] == "assistant"), default=len(conv))
            kwargs = {"enable_thinking": False}
            prompt = list(hf.apply_chat_template(conv[:last], chat_template=template, tokenize=True, return_dict=True,
                                                 add_generation_prompt=True, **kwargs)["input_ids"])
            f.write(json.dumps({"messages": conv[:last], "chat_template_kwargs": kwargs, "prompt_ids": prompt},
                               ensure_ascii=False) + "\n")
    jinja_references(work)


if __name__ == "__main__":
    main()
