"""Interpreter cases for the constructs the template corpus brought
(tests/chat/template_corpus_test.cpp): {% filter %} blocks, str.format, the
scope of set and filter blocks, and transformers' reasoning aliases. Each
template renders with CORPUS_VARS plus its extra variables, in jinja2 as
transformers sets it up (render_jinja_template, which aliases the messages'
reasoning); Anvil must render the same text and {% generation %} spans, or
refuse where jinja2 does. Run by chat_template_corpus.py."""

CORPUS_VARS = {
    "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": " Hi there\n"},
                 {"role": "assistant", "content": "Hello! 🌿", "reasoning_content": "Greet back."},
                 {"role": "user", "content": "Zähle bis 3"},
                 {"role": "assistant", "content": "1, 2, 3", "thinking": "Count.", "reasoning": "Old."},
                 {"role": "assistant", "reasoning": "Only the old name.", "content": "ok"}],
    "add_generation_prompt": False, "bos_token": "<s>", "eos_token": "</s>", "tools": None, "documents": None,
}

FILTER_BLOCKS = [
    "{% filter upper %}{% set x = 1 %}a{{ x }}{% endfilter %}[{{ x }}]",
    "{% set y %}{% set x = 1 %}a{% endset %}[{{ x }}]{{ y }}",
    "{% set x = 5 %}{% filter upper %}{% set x = 1 %}{{ x }}{% endfilter %}[{{ x }}]",
    "{% for i in [1, 2] %}{% filter upper %}a{{ i }}{% if i == 1 %}{% continue %}{% endif %}b{% endfilter %}{% endfor %}",
    "{% for i in [1, 2] %}{% filter upper %}a{% break %}{% endfilter %}{% endfor %}|",
    "{%- filter trim | upper -%}  a  {%- endfilter -%}|",
    "{% filter replace('a', 'b') %}aaa{% endfilter %} {% filter indent(2) %}\na\nb{% endfilter %}",
    "{% set ns = namespace(a=1) %}{% filter trim %} {% set ns.a = 2 %} {% endfilter %}{{ ns.a }}",
    "{% filter nosuch %}x{% endfilter %}",
    "{% if false %}{% filter nosuch %}x{% endfilter %}{% endif %}ok",
    "{% filter upper %}{% filter lower %}AbC{% endfilter %}x{% endfilter %} {% filter e %}<a>{% endfilter %}",
    "{% filter tojson %}x\"{% endfilter %} {% filter default('z') %}{% endfilter %}|",
    "{% filter length %}abc{% endfilter %}",
    "{% filter upper %}{{ raise_exception('boom') }}{% endfilter %}",
    "{% filter trim %}{% macro m() %}x{% endmacro %}{% endfilter %}{{ m() }}",
    "{% filter upper is defined %}x{% endfilter %}",
    "{% set z | upper %}x{% endset %}{{ z }}{% set w | upper is defined %}x{% endset %}",
    "{%- set s -%}\n{%- filter trim -%}\n  In addition,\n  two lines.\n{%- endfilter -%}\n{%- endset -%}[{{ s }}]",
    "{% for m in messages %}{% filter trim %}  {{ m.role }}  {% endfilter %};{% endfor %}",
    "{% filter upper %}{% generation %}ab{% endgeneration %}{% endfilter %}cd{% generation %}ef{% endgeneration %}",
    "{% filter upper %}x{% endfilter",
    "{% filter %}x{% endfilter %}",
]

STR_FORMAT = [
    "{{ '<｜hy_User{}｜>'.format(':opensource') }} {{ '{} and {}'.format(1, 'two') }} {{ '{1}{0}{1}'.format('a', 'b') }}",
    "{{ '{name} is {age}'.format(name='Ann', age=3) }} {{ '{0} {x}'.format(1, x=2) }} {{ '{{}} {{{}}}'.format(7) }}",
    "{{ '{0[role]}: {0[content]}'.format(messages[0]) }} {{ '{0.role}'.format(messages[1]) }} {{ '{m[0][role]}'.format(m=messages) }}",
    "{{ '{0.nosuch}|{0[nope]}|'.format(messages[0]) }}",
    "{{ '{!r} {!s} {!r}'.format('a', none, [1, 'b']) }} {{ '{:>6}|{:<6}|{:^6}|{:*^7}'.format('ab', 'ab', 'ab', 'ab') }}",
    "{{ '{:.2}|{:05}|{:s}|{:10.3}|'.format('abcdef', 'ab', 'x', 'abcdef') }}",
    "{{ '{:d} {:5d} {:<5d}| {:+d} {: d} {:05d} {:x} {:#x} {:X} {:#o} {:b} {:,} {:_} {:_x}'.format(42, 42, 42, 42, 42, -42, 255, 255, 255, 8, 5, 1234567, 1234567, 65535) }}",
    "{{ '{} {:f} {:.2f} {:e} {:.3E} {:g} {:.3g} {:G} {:%} {:.1%} {:,.2f} {:+.1f} {:08.2f} {:#.0f} {:.0f}'.format(1.5, 1.5, 3.14159, 12345.678, 12345.678, 0.00001234, 1234567.0, 1e-10, 0.25, 0.125, 1234567.891, 2.25, -3.14159, 2.0, 2.5) }}",
    "{{ '{:.3} {:.0} {} {} {} {:10} {:<10}| {:e} {:f}'.format(1.0, 2.0, 1e16, 1e-5, 0.1, 1.5, 2.5, 0.0, -0.0) }}",
    "{{ '{:.3}|{:.0}|{:.0}|{:.2}|{:.20}|{:.3}|{:.3}|{:.3}|{:.3}|{:.1}|{:.2}|{:.3}|{:.3}'.format(100.0, 2.0, 0.5, 1234.5, 1e16, 0.0001234, 0.00001234, 99.99, 9.999, 1.0, 10.0, -1.5, 7) }}",
    "{{ '{} {:d} {:>5} {:.1f} {}'.format(true, false, true, true, none) }} {{ '{:5}|{:>5}|'.format(none ~ '', [1]|string) }}",
    "{{ '{:{w}}|{:>{w}.{p}f}|{:{}{}}|'.format('a', 3.14159, 'b', '>', 4, w=6, p=2) }}",
    "{{ '{:é^7}|{:🌿<4}|{:>4}|'.format('x', 'y', 'ü') }}",
    "{{ '{:c}{:c}|{:3c}|{:<3c}|{:.500}|{:.3f}|{:.40e}'.format(65, 127807, 66, 67, 1.5, 1e300, 2.5) }}",
    "{{ '{!a}|{!a}|{0!a:>12}'.format('héllo 🌿', ['é', {'ü': 1}]) }}",
    "{{ '{:010,}|{:0=10,}|{:012_x}|{:010,.2f}|{:0>10,}|{:#}|{:#.3}|{:#.1}'.format(1, 1.5, 255, -1234.5, 7, 1e16, 2.5, 2.5) }}",
    "{{ '{} {}'.format(1) }}",
    "{{ '{0} {}'.format(1, 2) }}",
    "{{ '{} {0}'.format(1, 2) }}",
    "{{ '{x}'.format(y=1) }}",
    "{{ 'a } b'.format() }}",
    "{{ 'a { b'.format() }}",
    "{{ '{:d}'.format('x') }}",
    "{{ '{:+}'.format('x') }}",
    "{{ '{:.2d}'.format(5) }}",
    "{{ '{:x}'.format(1.5) }}",
    "{{ '{:>5}'.format([1]) }}",
    "{{ '{!x}'.format(1) }}",
    "{{ '{0[}'.format([1]) }}",
    "{{ '{:,_}'.format(1) }}",
    "{{ 'no fields'.format(1, 2, x=3) }} {{ ''.format() }}",
]

# Rendered by Anvil through chat::render_chat, where a message's reasoning is aliased as transformers does
# (the variables besides the messages are unused).
REASONING = [
    "{% for m in messages %}{{ m.role }}: {{ m | tojson }}\n{% endfor %}",
    "{% for m in messages %}{{ m.thinking }}|{{ m.reasoning_content }}|{{ m.reasoning }};{% endfor %}",
    "{% for m in messages %}{{ m.keys() | list }}{% endfor %}",
]

# (template, extra variables, whether it renders through render_chat)
CORPUS_CASES = [(t, {}, False) for t in FILTER_BLOCKS + STR_FORMAT] + [(t, {}, True) for t in REASONING]
