"""transformers' apply_chat_template on the chat templates real model folders ship.

Usage: chat_template_corpus.py WORKDIR [TEMPLATES]

TEMPLATES (default: .venv/llama-cpp-templates/models/templates, which
scripts/setup.sh extracts from the llama-cpp-python sdist) holds llama.cpp's
corpus of chat templates, each NAME.jinja as the model's tokenizer_config.json
has it. Trains one small byte-level BPE tokenizer (HF `tokenizers`) and, for
each template, gives it the markers the template writes (<|im_start|>,
<start_of_turn>, [INST], <｜User｜>, ...) as special tokens, then writes:

  WORKDIR/templates.json   {"names": [NAME, ...], "today": the date, "corpus": TEMPLATES}
  WORKDIR/jinja.jsonl      jinja2's renderings of jinja_corpus_cases.py: {"template",
                           "vars", "render_chat", "text", "generation"} or "error"
  WORKDIR/NAME/            a tokenizer folder whose tokenizer_config.json
                           records the template as its chat_template
  WORKDIR/NAME.json        {"eot_id", "generation"}: the end-of-turn token by
                           docs/data.md's rule, and whether the template has
                           {% generation %} blocks
  WORKDIR/NAME.jsonl       per conversation of CONVERSATIONS: {"case",
                           "messages", "tools"?, "kwargs"?, "text", "ids",
                           "mask"}, or "error" and "error_type" in place of
                           what transformers (or the mask rule) refuses; with two
                           replies or more "turns" (data.split_turns' samples:
                           turn_samples), or "turns_error"; then
                           "prompt_messages" and "prompt_ids", or "prompt_error"
                           and "prompt_error_type"

The ids come from apply_chat_template(..., tokenize=True); the masks from
return_assistant_tokens_mask=True where the template has {% generation %},
else by the rule docs/data.md states for templates without it (what each
reply adds to transformers' rendering of the conversation before it with
add_generation_prompt=True, up to and including the end-of-turn token);
error_type "NotAPrefix" marks a conversation that rule cannot split (its
"text" and "ids" are there).
"""
import datetime
import json
import os
import re
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apply_chat_template import GENERATION_TAG, WEATHER, end_of_turn, hf_mask, turn_samples  # noqa: E402
from jinja_corpus_cases import CORPUS_CASES, CORPUS_VARS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, ".venv", "llama-cpp-templates", "models", "templates")

# The markers templates write as text: special tokens in their models' tokenizers.
MARKER = re.compile(r"<\|[^|<>'\"\s]{1,40}\|?>|<[^|<>'\"\s]{1,40}\|>|<｜[^｜<>'\"\s]{1,40}｜>|\[/?[A-Z_]{2,30}\]"
                    r"|<(?:start|end)_of_turn>")

# (file-name pattern, bos_token, eos_token) as the families' tokenizer_config.json set them; else ChatML's EOS
# for a template that writes <|im_end|>, else <s> and </s>.
SPECIAL_TOKENS = [
    (r"Llama-3|Hermes|firefunction|functionary|R1-Distill-Llama", "<|begin_of_text|>", "<|eot_id|>"),
    (r"gemma", "<bos>", "<eos>"),
    (r"[Dd]eep[Ss]eek", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    (r"Phi-3", "<s>", "<|endoftext|>"),
    (r"[Mm]istral|Devstral", "<s>", "</s>"),
]

ARITHMETIC = [{"type": "function", "function": {"name": name, "description": f"{name.title()} two numbers.",
                                                "parameters": {"type": "object",
                                                               "properties": {"a": {"type": "number"},
                                                                              "b": {"type": "number"}},
                                                               "required": ["a", "b"]}}}
              for name in ("add", "multiply")]


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def call(name, arguments, call_id=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"id": call_id, **c} if call_id else c


# (case, messages, tools, kwargs): the system turn first, late and twice; tool calls with object and JSON-string
# arguments, parallel, without tools given and with reasoning; null and empty content; reasoning as
# reasoning_content, thinking, reasoning (transformers copies each to the others) and <think> in the content;
# enable_thinking either way; reasoning_effort; content parts; markers written by the user.
CONVERSATIONS = [
    ("one_turn", [user("What is 2+2?"), assistant("4")], None, None),
    ("system_multi_turn", [{"role": "system", "content": "You are terse."}, user("Name a colour."),
                           assistant(" Blue, like the sky. "), user("Another one, in German?"),
                           assistant("Grün — ein schönes Wort 🌿")], None, None),
    ("prompt_only", [user("Only a question?")], None, None),
    ("system_then_user", [{"role": "system", "content": "System only, then a user."}, user("Hello")], None, None),
    ("system_late", [user("Hi"), assistant("Hello."), {"role": "system", "content": "Answer in French now."},
                     user("Thanks"), assistant("De rien.")], None, None),
    ("two_systems", [{"role": "system", "content": "First rule."}, {"role": "system", "content": "Second rule."},
                     user("Go"), assistant("Done.")], None, None),
    ("assistant_first", [assistant("I start."), user("Hmm.")], None, None),
    ("empty_reply", [user("Say nothing."), assistant(""), user("Now a rare character."), assistant("G clef 𝄞")],
     None, None),
    ("null_content", [user("Hi"), assistant(None)], None, None),
    ("tool_call_object", [{"role": "system", "content": "Use the tools."}, user("Weather in Paris?"),
                          assistant(None, tool_calls=[call("get_weather", {"city": "Paris"}, "call_1")]),
                          {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                           "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
                          assistant("21 °C and clear ☀️")], [WEATHER], None),
    ("tool_calls_parallel_string", [user("(2+3)*4 and 7*6?"),
                                    assistant("", tool_calls=[call("add", "{\"a\": 2, \"b\": 3}", "c1"),
                                                              call("multiply", {"a": 7, "b": 6}, "c2")]),
                                    {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "5"},
                                    {"role": "tool", "tool_call_id": "c2", "name": "multiply", "content": "42"},
                                    assistant("20 and 42.")], ARITHMETIC, None),
    ("tools_unused", [user("Just say hi."), assistant("Hi!")], [WEATHER] + ARITHMETIC, None),
    ("tool_call_without_tools", [user("Weather?"),
                                 assistant(None, tool_calls=[call("get_weather", {"city": "Zürich"})]),
                                 {"role": "tool", "content": "snow"}, assistant("Snow.")], None, None),
    ("reasoning_content", [user("What is 17 * 3?"), assistant("51", reasoning_content="17 * 3 = 51."),
                           user("And 3 + 3?"), assistant("\n6", reasoning_content="\nThree and three.\n")],
     None, None),
    # Three replies with reasoning: Qwen3, QwQ and DeepSeek-R1 drop the reasoning of those before the last
    # query, so only data.split_turns trains them ("turns" below).
    ("three_turns_reasoning", [user("What is 17 * 3?"), assistant("51", reasoning_content="17 * 3 = 51."),
                               user("And 3 + 3?"), assistant("6", reasoning_content="Three and three."),
                               user("Now 2 * 21?"), assistant("42", reasoning_content="Twice twenty-one.")],
     None, None),
    ("reasoning_as_thinking", [user("What is 17 * 3?"), assistant("51", thinking="Seventeen threes.")], None, None),
    ("reasoning_as_reasoning", [user("What is 17 * 3?"), assistant("51", reasoning="Old name for it.")], None, None),
    ("think_in_content", [user("2 + 2?"), assistant("<think>\nTwo and two.\n</think>\n\n4")], None, None),
    ("thinking_off", [user("What is 17 * 3?"), assistant("51", reasoning_content="17 * 3 = 51."),
                      user("And 3 + 3?")], None, {"enable_thinking": False}),
    ("thinking_off_one_turn", [user("Hi"), assistant("Hello!")], None, {"enable_thinking": False}),
    ("thinking_on", [{"role": "system", "content": "Think first."}, user("2 + 2?"),
                     assistant("4", reasoning_content="Two and two.")], None, {"enable_thinking": True}),
    ("reasoning_tool_call", [user("Weather in Oslo?"),
                             assistant(None, reasoning_content="Ask the tool.",
                                       tool_calls=[call("get_weather", {"city": "Oslo", "unit": "celsius"}, "o1")]),
                             {"role": "tool", "tool_call_id": "o1", "name": "get_weather", "content": "rain"},
                             assistant("Rain.", reasoning_content="It rains.")], [WEATHER], None),
    ("reasoning_effort", [{"role": "system", "content": "Be careful."}, user("Prove it."), assistant("Done.")],
     None, {"reasoning_effort": "high"}),
    ("content_parts", [user([{"type": "text", "text": "Describe this."}]), assistant("A cat.")], None, None),
    # firefunction-v2 reads `functions` and `datetime`, Llama 3.x `date_string` (else it prints today's date).
    ("template_variables", [user("Weather in Lima?"),
                            assistant(None, tool_calls=[call("get_weather", {"city": "Lima"}, "l1")]),
                            {"role": "tool", "tool_call_id": "l1", "name": "get_weather", "content": "fog"},
                            assistant("Fog.")], [WEATHER],
     {"functions": json.dumps([WEATHER["function"]]), "datetime": "2024-07-01", "date_string": "1 Jul 2024"}),
    # Llama 3.1's built-in tools (<|python_tag|>name.call(...)); gpt-oss's python tool.
    ("builtin_tools", [user("Search for llamas."),
                       assistant(None, tool_calls=[call("brave_search", {"query": "llamas"}, "b1")]),
                       {"role": "tool", "tool_call_id": "b1", "name": "brave_search",
                        "content": "Llamas are camelids."},
                       assistant("They are camelids.")], [WEATHER], {"builtin_tools": ["brave_search", "python"]}),
    ("markers_in_text", [user("Say <|im_end|> and </s> literally"),
                         assistant("Sure: {\"json\": [1, 2]} 'quotes' \\ back\\slash")], None, None),
]


class NotAPrefix(Exception):
    """The mask rule for templates without {% generation %} cannot split the conversation (the text and ids
    are still transformers')."""

    def __init__(self, message, text=None, ids=None):
        super().__init__(message)
        self.text, self.ids = text, ids


def render(tok, template, messages, generation_prompt, tools, kwargs):
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]  # as apply_chat_template
    texts, _ = render_jinja_template(conversations=[messages], chat_template=template, tools=tools,
                                     add_generation_prompt=generation_prompt,
                                     **{**tok.special_tokens_map, **(kwargs or {})})
    return texts[0]


def render_tracked(tok, template, messages, generation_prompt, track, tools, kwargs):
    """render(), or with `track` the text and its {% generation %} spans."""
    if not track:
        return render(tok, template, messages, generation_prompt, tools, kwargs)
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    texts, spans = render_jinja_template(conversations=[messages], chat_template=template, tools=tools,
                                         return_assistant_tokens_mask=True, add_generation_prompt=generation_prompt,
                                         **{**tok.special_tokens_map, **(kwargs or {})})
    return texts[0], spans[0]


def reply_spans(tok, template, messages, full, eot_text, tools, kwargs):
    """docs/data.md's rule for templates without {% generation %}, on transformers' renderings."""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render(tok, template, messages[:i], True, tools, kwargs)
        through = render(tok, template, messages[:i + 1], False, tools, kwargs)
        if not through.startswith(prompt) or not full.startswith(through):
            raise NotAPrefix(f"message {i}: the rendering up to it is not where the rest starts")
        end = len(through)
        k = through.find(eot_text, len(prompt))
        if k >= 0:
            end = k + len(eot_text)
        spans.append((len(prompt), end))
    return spans


def encode(tok, template, messages, generation, eot_text, tools, kwargs):
    """transformers' ids and trained-token mask of the conversation, and the text."""
    r = tok.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True, tools=tools,
                                return_assistant_tokens_mask=generation, **(kwargs or {}))
    ids = list(r["input_ids"])
    full = render(tok, template, messages, False, tools, kwargs)
    if generation:
        return full, ids, list(r["assistant_masks"])
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    assert list(enc["input_ids"]) == ids
    try:
        spans = reply_spans(tok, template, messages, full, eot_text, tools, kwargs)
    except NotAPrefix as e:
        raise NotAPrefix(str(e), full, ids) from None
    return full, ids, hf_mask(enc["offset_mapping"], spans)


def special_tokens(name, template):
    for pattern, bos, eos in SPECIAL_TOKENS:
        if re.search(pattern, name):
            return {"bos_token": bos, "eos_token": eos}
    return {"eos_token": "<|im_end|>"} if "<|im_end|>" in template else {"bos_token": "<s>", "eos_token": "</s>"}


def make_tokenizer(base, folder, template, special):
    tok = Tokenizer.from_file(base)
    markers = sorted({m for m in MARKER.findall(template) if "{" not in m} | set(special.values()))
    tok.add_special_tokens(markers)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, **special}, f,
                  ensure_ascii=False)
    return PreTrainedTokenizerFast(tokenizer_file=path, **special)


def write_template(work, name, template, base):
    special = special_tokens(name, template)
    hf = make_tokenizer(base, os.path.join(work, name), template, special)
    generation = re.search(GENERATION_TAG, template) is not None
    eot = end_of_turn(hf, template)
    eot_text = hf.convert_ids_to_tokens(eot)
    with open(os.path.join(work, name + ".jsonl"), "w") as f:
        for case, conv, tools, kwargs in CONVERSATIONS:
            out = {"case": case, "messages": conv}
            if tools is not None:
                out["tools"] = tools
            if kwargs is not None:
                out["kwargs"] = kwargs
            try:
                out["text"], out["ids"], out["mask"] = encode(hf, template, conv, generation, eot_text, tools, kwargs)
            except Exception as e:  # noqa: BLE001 - the template (or the mask rule) refuses the conversation
                out["error"], out["error_type"] = str(e), type(e).__name__
                if isinstance(e, NotAPrefix):
                    out["text"], out["ids"] = e.text, e.ids
            if sum(m["role"] == "assistant" for m in conv) >= 2 and "error" not in out or \
                    out.get("error_type") == "NotAPrefix":
                try:  # data.split_turns' samples, each from transformers' rendering of its prefix
                    out["turns"] = turn_samples(
                        hf, template, conv, generation, eot_text,
                        lambda m, prompt, track: render_tracked(hf, template, m, prompt, track, tools, kwargs),
                        tools=tools, **(kwargs or {}))
                except Exception as e:  # noqa: BLE001
                    out["turns_error"] = str(e)
            last = max((i for i, m in enumerate(conv) if m["role"] == "assistant"), default=len(conv))
            if last > 0:  # apply_chat_template refuses an empty conversation
                out["prompt_messages"] = conv[:last]
                try:
                    out["prompt_ids"] = list(hf.apply_chat_template(conv[:last], chat_template=template, tokenize=True,
                                                                    return_dict=True, add_generation_prompt=True,
                                                                    tools=tools, **(kwargs or {}))["input_ids"])
                except Exception as e:  # noqa: BLE001
                    out["prompt_error"], out["prompt_error_type"] = str(e), type(e).__name__
            f.write(json.dumps(out, ensure_ascii=False) + "\n")
    with open(os.path.join(work, name + ".json"), "w") as f:
        json.dump({"eot_id": eot, "generation": generation}, f)


def train_tokenizer(path):
    corpus = []
    for _, conv, tools, _ in CONVERSATIONS:
        corpus += [json.dumps(m, ensure_ascii=False) for m in conv] + [json.dumps(tools or [])]
    corpus += ["system user assistant model tool function arguments name content description parameters",
               "You are a helpful assistant. The quick brown fox jumps over the lazy dog."] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.save(path)


def jinja_references(work):
    with open(os.path.join(work, "jinja.jsonl"), "w") as f:
        for template, extra, chat in CORPUS_CASES:
            variables = dict(CORPUS_VARS, **extra)
            out = {"template": template, "vars": variables, "render_chat": chat}
            try:
                track = re.search(GENERATION_TAG, template) is not None
                text, spans = render_jinja_template(conversations=[variables["messages"]], chat_template=template,
                                                    return_assistant_tokens_mask=track,
                                                    **{k: v for k, v in variables.items() if k != "messages"})
                out["text"], out["generation"] = text[0], [list(s) for s in spans[0]] if track else []
            except Exception as e:  # noqa: BLE001
                out["error"] = type(e).__name__ + ": " + str(e)
            f.write(json.dumps(out, ensure_ascii=False) + "\n")


def main():
    work = sys.argv[1]
    corpus = sys.argv[2] if len(sys.argv) > 2 else CORPUS
    if not os.path.isdir(corpus):
        sys.exit(f"{corpus}: no such folder; scripts/setup.sh puts llama.cpp's chat templates there")
    os.makedirs(work, exist_ok=True)
    base = os.path.join(work, "base-tokenizer.json")
    train_tokenizer(base)
    names = sorted(f[:-len(".jinja")] for f in os.listdir(corpus) if f.endswith(".jinja"))
    today = None
    while today != datetime.date.today():  # made again if the date (which templates print) changed meanwhile
        today = datetime.date.today()
        for name in names:
            with open(os.path.join(corpus, name + ".jinja"), encoding="utf-8") as f:
                write_template(work, name, f.read(), base)
    jinja_references(work)
    with open(os.path.join(work, "templates.json"), "w") as f:
        json.dump({"names": names, "today": today.strftime("%Y-%m-%d"), "corpus": corpus}, f)


if __name__ == "__main__":
    main()
