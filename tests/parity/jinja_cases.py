"""Interpreter cases for tests/chat/template_hf_test.cpp: templates
(with JINJA_VARS, plus each case's extra variables) that jinja2, set up as
transformers sets it up, renders (or refuses) and Anvil must render (or
refuse) the same. Run by apply_chat_template.py."""

JINJA_VARS = {
    "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": " Hi there\n"},
                 {"role": "assistant", "content": "Hello! 🌿"}, {"role": "user", "content": "Zähle bis 3"},
                 {"role": "assistant", "content": "1, 2, 3"}],
    "add_generation_prompt": False, "bos_token": "<s>", "eos_token": "</s>", "tools": None, "documents": None,
}

JINJA_CASES = [(t, {}) for t in [
 "{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
 "{{ 1.0 }} {{ 1e16 }} {{ 1.5e-5 }} {{ 0.0001 }} {{ 123456789.123 }} {{ 1/3 }} {{ -0.0 }} {{ 3.14e100 }}",
 "{{ none }} {{ true }} {{ False }} {{ [1, 'a', none, 2.5] }} {{ (1,) }} {{ (1, 2) }} {{ {'a': 1, 'b': [1, {'c': 'd'}]} }} {{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }}",
 "{{ 'abc'[::-1] }} {{ 'abc'[1:] }} {{ 'abcdef'[1:5:2] }} {{ [1,2,3,4][-2:] }} {{ 'héllo'[1] }} {{ 'x'[5] }}|{{ [1,2,3][::-1] }} {{ 'abc'[-1] }}",
 "a\n  {% if true %}\n  b\n  {% endif %}\nc\n",
 "{% for m in messages %}\n{{ m.role }}: {{ m['content'] }}\n{% endfor %}\n",
 "{%- for m in messages -%}\n  {{- m.role -}} \n{%- endfor %}  x  ",
 "  {#- comment -#}  a {# c #}\n b {#+ c +#} \n c\n   {# x #}\nd",
 "{% set c = 0 %}{% for i in range(3) %}{% set c = c + 1 %}{{ c }}{% endfor %}{{ c }}",
 "{% set ns = namespace(c=0, s='') %}{% for m in messages %}{% set ns.c = ns.c + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.c }} {{ ns.s }}",
 "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}|{% endfor %}",
 "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content|trim }};{% else %}none{% endfor %}",
 "{% for m in [] %}x{% else %}empty{% endfor %}",
 "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
 "{{ messages | length }} {{ messages|count }} {{ messages[0].content|upper }} {{ 'ABC'|lower }} {{ 'hello world'|title }} {{ 'hELLO'|capitalize }} {{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}",
 "{{ messages|map(attribute='role')|join(', ') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|rejectattr('role', 'equalto', 'user')|map(attribute='role')|list }}",
 "{{ messages|first }} {{ (messages|last).content }} {{ [3,1,2]|sort }} {{ ['b','A','a']|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ [1,2,2,3]|unique|list }} {{ [1,2,3]|sum }} {{ [1,5,2]|max }} {{ [4,1]|min }}",
 "{{ messages|tojson }}",
 "{{ messages[0]|tojson(indent=2) }} {{ {'a': [1,2,{}], 'b': [], 'c': 'é\"\\n\\t\\u0001'}|tojson(indent=4) }} {{ {'b':1,'a':2}|tojson(sort_keys=true) }} {{ [1,2]|tojson(separators=(',', ':')) }}",
 "{{ 'é'|tojson(ensure_ascii=true) }} {{ '🌿'|tojson(true) }} {{ 1.5|tojson }} {{ none|tojson }} {{ {1: 2, true: 3}|tojson }}",
 "{{ x|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }} {{ x|d('e') }} {{ undefined_var }}|{{ x is defined }} {{ messages is defined }} {{ none is none }} {{ 1 is number }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }}",
 "{{ 'a' in 'cat' }} {{ 'x' not in ['a'] }} {{ 'role' in messages[0] }} {{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1,2] == [1,2] }} {{ (1,2) == [1,2] }} {{ 1 == 1.0 }} {{ 1 == true }}",
 "{{ 'a' ~ 1 ~ none ~ x }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 'ab' * 3 }} {{ 3 * [1] }} {{ -3|abs }} {{ - 2 ** 2 }} {{ not true }} {{ not x }} {{ 1 if false }}|{{ 1 if true else 2 }} {{ 0 or 'x' }} {{ 1 and 'y' }} {{ none or [] }}",
 "{{ ' a b  c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ '  x '.strip() }}|{{ 'xy'.startswith('x') }} {{ 'xy'.endswith(('a','y')) }} {{ 'Hello'.replace('l', 'L') }} {{ 'hello world'.title() }} {{ 'abc'.upper() }} {{ 'a\\nb\\r\\nc\\n'.splitlines() }}",
 "{{ messages[0].get('content') }} {{ messages[0].get('x', 'def') }} {{ messages[0].items()|list }} {{ messages[0].keys()|list }} {{ messages[0].values()|list }} {% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %} {% for k, v in messages[0]|items %}{{ k }}{% endfor %}",
 "{{ 'x'.find('y') }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }} {{ '-'.join(['a','b']) }} {{ 'x'.zfill(3) }} {{ 'ab'.center(6) }}|{{ 'ab'.ljust(4, '*') }} {{ 'a:b:c'.partition(':') }}",
 "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '3.5'|float }} {{ 'x'|float }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 5|round }} {{ 42|string }} {{ [1]|string }}",
 "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(width='> ', blank=true) }}",
 "{% macro render(m, prefix='> ') %}{{ prefix }}{{ m.content }}{% endmacro %}{% for m in messages %}{{ render(m) }}|{{ render(m, prefix='# ') }}{% endfor %}",
 "{% set x %}Hello {{ messages[0].role }}{% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}",
 "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}",
 "{{ raise_exception('bad ' ~ messages|length) }}",
 "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{% generation %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endgeneration %}{% endif %}{% endfor %}",
 "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{% if m.role == 'assistant' %}{% generation %}{{ m.content + '<|im_end|>' }}{% endgeneration %}{% else %}{{ m.content + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
 "{% macro g(m) %}pre{% generation %}{{ m.content }}{% endgeneration %}{% endmacro %}{% for m in messages %}[{{ g(m) }}]{% endfor %}",
 "{{ messages|selectattr('role', 'equalto', 'system')|first }} {% if messages|selectattr('role','eq','nobody') %}truthy{% endif %} {{ messages|map(attribute='content')|map('length')|list }} {{ ['a','B']|map('upper')|list }} {{ [1,0,2]|select|list }} {{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3]|reject('gt', 1)|list }}",
 "{{ messages|reverse|map(attribute='role')|list }} {{ 'abc'|reverse }} {{ [1,2]|reverse|list }} {{ {'b': 1, 'a': 2}|dictsort }} {{ 'a b c'|wordcount }} {{ '<a>'|e }} {{ 'x'|safe + 'y' }} {{ 'x y'|replace(' ', '_') }} {{ 'aaa'|replace('a', 'b', 2) }}",
 "{{ x.y }}",
 "{{ messages[0].foo.bar }}",
 "{{ messages[0].foo is defined }} {{ none.x is defined }} {{ messages[10] is defined }} {{ messages[0]['nope'] }}|",
 "{{ 'a' + 1 }}",
 "{{ 1 / 0 }}",
 "{% for m in messages %}{% if loop.last %}{{ m.content }}{% endif %}{% endfor %}{{ loop }}",
 "{{ namespace(a=1) }} {% set n = namespace(messages[0]) %}{{ n.role }}",
 "{{ dict(a=1, b=2) }} {{ range(5) | list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }}",
 "{%- if tools %}tools{% else %}no tools{% endif %} {{ tools is none }} {{ documents }}",
 "{% set sys = messages|selectattr('role','equalto','system')|list %}{{ sys|length }}{{ (sys|first).content if sys else 'none' }}",
 "{%- set x = 'a' -%}\n\n   {{ x }}   \n\n{%- if x -%}  y  {%- endif -%}\n   z",
 "line1\n{% if true %}\n    indented\n{% endif %}\n    {%+ if true %}keep{% endif %}\n{% if true -%}\n   stripped\n{%- endif %}\nend",
 "{{ messages[0].content }}{#- trailing -#}\n\n{{ 'x' }}\n",
 "{{ 'a' }}\r\n{% if true %}\r\nb\r\n{% endif %}\r\n",
 "{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
 "{% if messages[-1].role == 'assistant' and messages[-1].content.endswith('3') %}yes{% endif %} {{ messages[-1]['content'][-1:] }} {{ messages|length > 2 }}",
 "{{ '%s and %d'|format('a', 3) }} {{ 'x' is lower }} {{ 'X' is upper }} {{ 1 is sameas 1 }} {{ none is sameas none }} {{ true is true }} {{ 'a' is in 'abc' }} {{ 2 is gt 1 }}",
 "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %} {% for c in 'héé' %}{{ c }}.{% endfor %} {% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}",
 "{{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1_000 }} {{ 1.5e3 }} {{ 'a' 'b' }} {{ \"\\u00e9\\x41\\101\\\\n\" }}",
 "{{ messages.0.role }} {{ (1, 2).0 }}",
 "{%- for message in messages %}{%- if message['role'] == 'system' -%}{{ message['content'] }}{{ '\\n\\n' }}{%- elif message['role'] == 'user' -%}{{ 'User: ' ~ message['content'] ~ '\\n' }}{%- else -%}{{ 'Assistant: ' }}{%- generation -%}{{ message['content'] ~ eos_token }}{%- endgeneration -%}{{ '\\n' }}{%- endif -%}{%- endfor -%}",
 "{{ [1,2,3]|join }} {{ messages|join(', ', attribute='role') }} {{ messages|map(attribute='missing', default='?')|join }} {{ messages|map(attribute='missing')|list|length }}",
 "{{ 'x'|center(5) }}|{{ ''|first }}|{{ []|last }}|{{ 'abc'|list }} {{ {'a':1}|list }} {{ 'abc'|length }} {{ 'é🌿'|length }} {{ 'é🌿'|tojson }}",
 "{% if 'x' %}{% elif y %}{% endif %}{% if false %}a{% elif true %}b{% else %}c{% endif %}",
 "{% set g = messages|map(attribute='role') %}{{ g|length }}",
 "{{ strftime_now is defined }} {{ raise_exception is callable }}",
 ]]

JINJA_CASES += [
    ("{% if add_generation_prompt %}gen{% else %}no{% endif %}", {"add_generation_prompt": True}),
    ("{{ tools | length }} {% for t in tools %}{{ t.name }}: {{ t | tojson }}\n{% endfor %}",
     {"tools": [{"name": "get_weather", "parameters": {"city": {"type": "string"}}, "n": 1.5, "ok": True}]}),
]

# Whitespace control: trim_blocks, lstrip_blocks, - and +, comments, newlines.
JINJA_CASES += [(t, {}) for t in [
 "   {% if true %}x{% endif %}",
 "  {{ 'a' }}  {% if true %}x{% endif %}  \n  {% if true %}y{% endif %}",
 "a\t \t{% if true %}\tb{% endif %}\n\t{# c #}\nd",
 "a  {%- if true -%}  b  {%- endif -%}  c",
 "a\n\n  {%+ if true +%}\n  b\n  {%+ endif %}\nc",
 "{{ '}}' }} {{ {'a': '%}'}['a'] }} {{ \"{%\" }}",
 "{% for m in messages %}{{ m.role }}\n{% endfor %}\n\n",
 "x\n{% if true %}\n\n{% endif %}\n\ny\n",
 "{# a #}{# b #}\n{# c -#}\n\n  z",
 "{%- for m in messages %}\n   - {{ m.role }}{% if not loop.last %},{% endif %}\n{%- endfor %}",
 "{% set x = 1 %}\n  {%- set y = 2 -%}\n  {{ x + y }}\n",
 "a {{- ' b ' -}} c {{ 'd' }}\n e",
 "{{ 'a' }}\n{% if false %}x{% elif true %}\n  y\n{% else %}z{% endif %}\n",
 "\n{% macro f(x) -%}\n  [{{ x }}]\n{%- endmacro %}\n{{ f(1) }}{{ f(2) }}\n",
 "{% generation %}a{% endgeneration %}\n{% generation %}\nb\n{% endgeneration %}",
 "{%- generation -%}  a  {%- endgeneration -%}  {{ 'é🌿' }}{% generation %}{{ 'x' }}{% endgeneration %}",
 "{% set s %}\n  inner {{ 1 }}\n{% endset %}[{{ s }}]",
 "{{ 'multi\nline' }}\n  {% if true %}\n  ok\n  {% endif %}",
 "{{ x\n  | default('d')\n }}\n{%\n  if true\n%}\nyes\n{% endif %}",
 "tab\t{%- if true %} x {% endif -%}\t\n end",
]]

LLAMA31 = r'''{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
'''

QWEN25 = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
'''

QWEN3 = r'''{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "system" %}
        {{- '<|im_start|>system\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}'''

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}}, "required": ["city"]}}}]
TM = [{"role": "system", "content": "You are a bot."}, {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "22°C, sunny"}, {"role": "tool", "content": {"extra": [1, 2.5, None]}},
      {"role": "assistant", "content": "<think>\nIt is warm.\n</think>\n\nIt is 22°C and sunny."}, {"role": "user", "content": "Thanks"}]
# Real-world templates: LLaMA-3.1 (tools), Qwen2.5 (tools), Qwen3 (thinking).
for t in [LLAMA31, QWEN25, QWEN3]:
    JINJA_CASES += [(t, {}), (t, {"add_generation_prompt": True}), (t, {"messages": TM}), (t, {"messages": TM, "tools": TOOLS}),
              (t, {"messages": TM, "tools": TOOLS, "tools_in_user_message": False, "builtin_tools": ["get_weather", "code_interpreter"]}),
              (t, {"messages": TM[1:3] + [{"role":"user","content":"x"}], "enable_thinking": False, "add_generation_prompt": True})]

S = "  a  b\tc \n d  "
# Python str semantics: methods, case mappings, numbers, filters.
JINJA_CASES += [(t, {"s": S}) for t in [
 "{{ s.split() }} {{ s.split(None, 1) }} {{ s.split(maxsplit=0) }} {{ s.rsplit(None, 1) }} {{ s.rsplit(maxsplit=2) }} {{ s.split(' ') }} {{ s.split(' ', 2) }} {{ s.rsplit(' ', 2) }}",
 "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' a') }}|{{ 'xxaxx'.strip('x') }}|{{ ''.split() }}|{{ ''.split(',') }}|{{ 'a,b'.rsplit(',') }}",
 "{{ 'hello world'.title() }} {{ \"they're bill's\".title() }} {{ 'ÉCOLE été'.lower() }} {{ 'straße'.upper() }} {{ 'hELLO wORLD'.capitalize() }} {{ 'a1b2'.title() }}",
 "{{ 'abc'.isalpha() }} {{ 'ab1'.isalnum() }} {{ '123'.isdigit() }} {{ ' \\t'.isspace() }} {{ 'abc'.islower() }} {{ 'ABC1'.isupper() }} {{ ''.isdigit() }} {{ 'Ab'.islower() }}",
 "{{ 'aXbXc'.replace('X', '-', 1) }} {{ 'abc'.replace('', '.') }} {{ 'abc'.replace('', '.', 2) }} {{ 'héllo'.find('l') }} {{ 'héllo'.index('o') }} {{ 'aaa'.count('a') }} {{ 'aaaa'.count('aa') }} {{ 'x'.count('') }}",
 "{{ 'a-b'.partition('-') }} {{ 'a-b-c'.rpartition('-') }} {{ 'ab'.partition('x') }} {{ 'pre_x'.removeprefix('pre_') }} {{ 'x.py'.removesuffix('.py') }} {{ '-5'.zfill(4) }} {{ 'ab'.rjust(5, '.') }} {{ 'abc'.center(8, '*') }}",
 "{{ 'a\\r\\nb\\rc\\x0bd\\x1ce\\u2028f'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }} {{ ''.splitlines() }} {{ '\\n'.splitlines() }}",
 "{{ 'Hello World'|title }} {{ 'hello-world (x) [y] <z>'|title }} {{ 'ABC def'|capitalize }} {{ '  x\\n'|trim }}|{{ 'a b'|wordcount }} {{ 'one, two; three'|wordcount }}",
 "{{ '3'|int + 1 }} {{ ' 0x1A '|int(0, 16) }} {{ '0b11'|int(base=2) }} {{ '1_000'|int }} {{ '-7'|int }} {{ '1e3'|float }} {{ 'nan'|float }} {{ '  2.5 '|float }} {{ true|int }} {{ none|int }} {{ '12abc'|int }}",
 "{{ 2.5|round }} {{ 3.5|round }} {{ -2.5|round }} {{ 0.125|round(2) }} {{ 2.675|round(2) }} {{ 1.0005|round(3) }} {{ 7|round(1, 'floor') }} {{ 1.23456|round(2, 'ceil') }}",
 "{{ [1, 2.0, 'a', none, true, [1], {'k': (1, 2)}]|tojson }} {{ {'a': {'b': []}, 'c': {}}|tojson(indent=2) }} {{ [1,[2,[3]]]|tojson(indent='\\t') }} {{ {'x': 1}|tojson(indent=0) }}",
 "{{ (1, 2) + (3,) }} {{ [1] * 0 }} {{ 'ab' * -1 }}|{{ 10 % -3 }} {{ -10 // 3 }} {{ 2 ** 0.5 }} {{ 7 / 7 }} {{ 1e300 * 1e10 }} {{ 0.1 + 0.2 }}",
 "{{ [3, 1, 2]|sort|list }} {{ ['b', 'a', 'C']|sort(case_sensitive=true) }} {{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }} {{ ['a', 'A', 'b']|unique|list }} {{ {'b': 1, 'A': 2}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }}",
 "{{ [1, 2]|sum(start=10) }} {{ [{'v': 1}, {'v': 2}]|sum(attribute='v') }} {{ ['a', 'B']|max }} {{ [{'v': 3}, {'v': 5}]|min(attribute='v') }} {{ []|max }}|{{ 'xyz'|first }} {{ 'xyz'|last }} {{ {'a': 1, 'b': 2}|last }}",
 "{{ range(3)|map('string')|join('-') }} {{ [[1, 2], [3]]|map('length')|list }} {{ [{'a': {'b': 1}}]|map(attribute='a.b')|list }} {{ [[5, 6]]|map(attribute='0')|list }} {{ ['x', '', 'y']|select|list }} {{ [1, 2, 3]|select('in', [1, 3])|list }}",
 "{{ [{'r': 'u'}, {'r': 'a'}, {}]|selectattr('r')|list }} {{ [{'r': 'u'}, {'r': 'a'}, {}]|selectattr('r', 'defined')|list }} {{ [{'r': 'u'}, {}]|rejectattr('r', 'undefined')|list }} {{ [{'r': 1}, {'r': 2}]|selectattr('r', '>', 1)|list }}",
]]
JINJA_CASES += [(t, {}) for t in [
 "{{ 'ΟΔΟΣ ΚΑΙ Σ.'.lower() }} {{ 'ΣΑΣ'|lower }} {{ 'ﬁne ŉ ǰ'.upper() }} {{ 'ﬁne'.title() }} {{ 'ﬁne'.capitalize() }} {{ 'İx'.lower() }} {{ 'ß'|capitalize }} {{ 'ßa'|title }}",
]]

# Strings marked safe (|safe, |e): no double escaping, and + escapes the plain side.
JINJA_CASES += [(t, {}) for t in [
    "{{ '<a>'|e|e }} {{ 'x'|safe + '<y>' }} {{ '<y>' + 'x'|safe }} {{ '<a>'|safe|e }} {{ ('<a>'|e ~ '<b>') }} "
    "{{ '<a>'|e|string + '<c>' }} {{ '<'|safe|length }} {{ '<a>'|safe|upper }}",
]]

# range() objects, slices (Python's own subscript: failures raise).
JINJA_CASES += [(t, {}) for t in [
    "{{ range(10) }} {{ range(1, 9, 2) }} {{ range(3)|list }} {{ range(3) == [0, 1, 2] }} {{ range(3)|length }} "
    "{{ range(3)[1] }} {{ 2 in range(3) }} {{ range(5)[1:3] }} {{ ('<a>'|safe,) }}",
    "{{ range(10)[::-1] }} {{ range(10)[::2] }} {{ range(2, 20, 3)[1:-1] }} {{ range(5)[10:] }} {{ range(5)[-2:] }} "
    "{{ range(10, 0, -2)[1::2] }}",
    "{{ range(3)|tojson }}", "{{ range(2) + [1] }}", "{{ messages[0][:'r'] }}", "{{ [1, 2][x:] }}",
]]
