// tests/models/jinja/test_jinja.cc: units of the Jinja interpreter (models/jinja.h): parse errors, raise_exception,
// undefined values, loops, namespaces, whitespace control, tojson, request-text spans and the render bounds. The
// published templates are checked against jinja2 by test_jinja_oracle.py.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

extern "C" {
#include "models/jinja.h"
}

namespace {

struct Result {
  int rc = 0;
  std::string out, err;
  std::vector<std::pair<size_t, size_t>> spans;
};

Result render(const std::string &tpl, const std::string &ctx = "{}") {
  Result r;
  char err[512] = "";
  mdl_jinja *t = nullptr;
  if (mdl_jinja_parse(tpl.data(), tpl.size(), &t, err, sizeof err) != 0) {
    r.rc = -100; // a parse error
    r.err = err;
    return r;
  }
  mdl_jinja_opts o = {1765000000};
  char *out = nullptr;
  size_t len = 0, *sp = nullptr, nsp = 0;
  r.rc = mdl_jinja_render(t, ctx.data(), ctx.size(), &o, &out, &len, &sp, &nsp, err, sizeof err);
  mdl_jinja_free(t);
  r.err = err;
  if (r.rc == 0) {
    r.out.assign(out, len);
    for (size_t i = 0; i < nsp; i++) r.spans.emplace_back(sp[2 * i], sp[2 * i + 1]);
  } else {
    EXPECT_EQ(out, nullptr);
  }
  free(out);
  free(sp);
  return r;
}

std::string ok(const std::string &tpl, const std::string &ctx = "{}") {
  Result r = render(tpl, ctx);
  EXPECT_EQ(r.rc, 0) << tpl << ": " << r.err;
  return r.out;
}

TEST(Jinja, ParseErrorsNameTheLine) {
  Result r = render("text\n{{ x }}\n  {% foo %}");
  EXPECT_EQ(r.rc, -100);
  EXPECT_EQ(r.err, "line 3:6: unknown tag 'foo'");
  r = render("{% if x %}\nno end");
  EXPECT_EQ(r.rc, -100);
  EXPECT_NE(r.err.find("line 2:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("endif"), std::string::npos) << r.err;
  r = render("a\n\n{{ 'open }}");
  EXPECT_EQ(r.rc, -100);
  EXPECT_EQ(r.err, "line 3:4: unterminated string");
  r = render("{{ a + }}");
  EXPECT_EQ(r.rc, -100);
  EXPECT_NE(r.err.find("line 1:"), std::string::npos) << r.err;
  r = render("{% for x in y %}{% endif %}{% endfor %}");
  EXPECT_EQ(r.rc, -100);
  EXPECT_NE(r.err.find("unknown tag 'endif'"), std::string::npos) << r.err;
  r = render("{# never closed");
  EXPECT_EQ(r.err, "line 1:1: unterminated comment");
}

TEST(Jinja, RaiseExceptionGivesTheTemplatesMessage) {
  Result r = render("before{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
                    "{% endif %}",
                    R"({"messages": [{"role": "system", "content": "x"}]})");
  EXPECT_EQ(r.rc, MDL_JINJA_RAISED);
  EXPECT_EQ(r.err, "System role not supported");
  EXPECT_EQ(ok("{% if false %}{{ raise_exception('no') }}{% endif %}ok"), "ok");
}

TEST(Jinja, UndefinedAsJinja2) {
  EXPECT_EQ(ok("[{{ missing }}]{% for x in missing %}x{% endfor %}{{ missing is defined }}{{ missing|length }}"),
            "[]False0");
  EXPECT_EQ(ok("{{ d.nope is defined }}{{ d['nope'] is undefined }}{{ none.x is defined }}{{ 'ab'.x is defined }}",
               R"({"d": {"a": 1}})"),
            "FalseTrueFalseFalse");
  EXPECT_EQ(ok("{{ missing|trim }}|{{ missing|default('dflt') }}|{{ not missing }}"), "|dflt|True");
  Result r = render("\n{{ missing.attr }}");
  EXPECT_EQ(r.rc, -1);
  EXPECT_EQ(r.err, "line 2: 'missing' is undefined");
  r = render("{{ missing + 'x' }}");
  EXPECT_EQ(r.rc, -1);
  EXPECT_EQ(r.err, "line 1: 'missing' is undefined");
  r = render("{{ 'a' + 1 }}");
  EXPECT_EQ(r.err, "line 1: unsupported operand type(s) for +: 'str' and 'int'");
}

TEST(Jinja, LoopVariables) {
  EXPECT_EQ(ok("{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
               "{{ loop.first|string|first }}{{ loop.last|string|first }}{{ loop.length }}"
               "{{ loop.previtem or '-' }}{{ loop.nextitem or '-' }} {% endfor %}"),
            "103TF3-b 212FF3ac 321FT3b- ");
  EXPECT_EQ(ok("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(ok("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
               R"({"d": {"b": 1, "a": [2, "x"]}})"),
            "b=1;a=[2, 'x'];ba");
  EXPECT_EQ(ok("{% for x in range(6) if x is odd %}{{ x }}{{ loop.index }} {% endfor %}"), "11 32 53 ");
  EXPECT_EQ(ok("{% for x in range(9) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
               "{% endif %}{{ x }}{% endfor %}"),
            "013");
}

TEST(Jinja, ScopesAndNamespaces) {
  // a set inside a loop stays in its iteration; a namespace carries values out
  EXPECT_EQ(ok("{% set x = 5 %}{% set ns = namespace(n=0) %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}"
               "{% set ns.n = ns.n + i %}{% endfor %}{{ x }} {{ ns.n }}"),
            "[5][5]5 3");
  EXPECT_EQ(ok("{% if true %}{% set y = 'in if' %}{% endif %}{{ y }}"), "in if");
  EXPECT_EQ(ok("{% set b %}block {{ 1 + 1 }}{% endset %}[{{ b }}]"), "[block 2]");
  EXPECT_EQ(ok("[{% filter trim | upper %}  a{{ 'b' }}  {% endfilter %}]"), "[AB]");
  EXPECT_EQ(ok("{% macro m(a, b='x') %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, b=2) }} {{ m(b=3, a=4) }}"),
            "1-x 1-2 4-3");
  // a namespace is no mapping: not iterable, no `in`, no JSON (jinja2's Namespace)
  EXPECT_EQ(ok("{% set ns = namespace(a=1) %}{{ ns is mapping }}{{ ns.a }}"), "False1");
  for (const char *t : {"{% for x in ns %}{% endfor %}", "{{ 'a' in ns }}", "{{ ns | tojson }}"})
    EXPECT_EQ(render(std::string("{% set ns = namespace(a=1) %}") + t).rc, -1) << t;
  Result r = render("{% set x = 1 %}{% set x.a = 2 %}");
  EXPECT_EQ(r.rc, -1);
  EXPECT_NE(r.err.find("non-namespace"), std::string::npos) << r.err;
}

TEST(Jinja, FramesAsJinja2sCompiler) {
  // a name a frame writes before reading starts undefined there, even where the context has it (jinja2 3.1.6's output)
  std::string n3 = R"({"n": 3})";
  EXPECT_EQ(ok("{% for x in [1] %}[{{ n }}]{% endfor %}{% set n = 5 %}", n3), "[]");
  EXPECT_EQ(ok("{{ n }}{% for x in [1] %}[{{ n }}]{% endfor %}{% set n = 5 %}", n3), "3[3]");
  EXPECT_EQ(ok("{% for x in [1] %}[{{ n }}]{% endfor %}{% if true %}{% set n = 5 %}{% endif %}", n3), "[3]");
  EXPECT_EQ(ok("{% macro m() %}[{{ n }}]{% endmacro %}{{ m() }}{% set n = 5 %}{{ m() }}", n3), "[][5]");
  EXPECT_EQ(ok("{% for x in [1] %}{% for y in [1] %}[{{ n }}]{% endfor %}{% set n = 7 %}{% endfor %}", n3), "[]");
  EXPECT_EQ(ok("{% set b %}{{ n }}{% set n = 2 %}{{ n }}{% endset %}{{ b }}{{ n }}", n3), "323");
  EXPECT_EQ(ok("{% set n = n + 1 %}{{ n }}", n3), "4");
}

TEST(Jinja, WhitespaceControlAsHuggingFace) {
  // trim_blocks and lstrip_blocks, "+" keeping, and one trailing newline dropped (jinja2's output, checked by hand)
  EXPECT_EQ(ok("a\n{% if true %}\n  b\n{% endif %}\n  {{ c }}\n  {%+ if 1 %}x{% endif +%}\ny\n"), "a\n  b\n  \n  x\ny");
  EXPECT_EQ(ok("a  {%- if true -%}  \n b {{- ' c ' -}}  d{# note #}\n  {#- x -#}  e{% endif %}"), "ab c de");
  EXPECT_EQ(ok("x\r\n{% if 1 %}\r\ny{% endif %}\r\n"), "x\ny");
}

TEST(Jinja, ExpressionsAsPython) {
  EXPECT_EQ(ok("{{ 7 // -2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 10 / 4 }} {{ 1 / 3 }} {{ 1e20 }} {{ 0.00001 }} {{ 3 * 'ab' }}"),
            "-4 2 1024 2.5 0.3333333333333333 1e+20 1e-05 ababab");
  EXPECT_EQ(ok("{{ 'héllo'[1:3] }} {{ [1, 2, 3][::-1] }} {{ 'abc'[-1] }} {{ (1, 'a') }} {{ {'k': none, 'b': true} }}"),
            "él [3, 2, 1] c (1, 'a') {'k': None, 'b': True}");
  EXPECT_EQ(ok("{{ 'a' if x else 'b' }}{{ 1 == 1.0 }}{{ 'ell' in 'hello' }}{{ 2 not in [1] }}{{ x or 'z' }}",
               R"({"x": 0})"),
            "bTrueTrueTruez");
  EXPECT_EQ(ok("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a</t>b</t>c'.split('</t>') }}|"
               "{{ 'a b  c'.split() }}|{{ 'k=v=w'.split('=', 1)[1] }}|{{ 'abc'.startswith('ab') }}"),
            "a b|a|['a', 'b', 'c']|['a', 'b', 'c']|v=w|True");
  EXPECT_EQ(ok("{{ m | selectattr('role', 'equalto', 'user') | map(attribute='c') | join(',') }}",
               R"({"m": [{"role": "user", "c": "1"}, {"role": "bot", "c": "2"}, {"role": "user", "c": "3"}]})"),
            "1,3");
  EXPECT_EQ(ok("{{ 'a\\tb\\u00e9\\d' }}"), "a\tb\xc3\xa9\\d");
  // str() of a container is Python's repr: quotes chosen as Python does, unprintable code points escaped
  EXPECT_EQ(ok("{{ x }}", R"({"x": {"k": ["a\u00a0b\u200bc\u0085\u00e9\udb40\udc01", "it's", "q\"'"]}})"),
            "{'k': ['a\\xa0b\\u200bc\\x85\xc3\xa9\\U000e0001', \"it's\", 'q\"\\'']}");
  EXPECT_EQ(ok("{{ d.keys() }} {{ d.items() }} {{ d.items()|list }} {{ [none, d.z] }} {{ d[1, 2] is defined }}",
               R"({"d": {"a": 1}})"),
            "dict_keys(['a']) dict_items([('a', 1)]) [('a', 1)] [None, Undefined] False");
  EXPECT_EQ(ok("{{ missing is callable }} {{ 2.5|round }} {{ 0.125|round(2) }} {{ 3|round(1) }} {{ 7.5|round(0, 'floor') }}"),
            "True 2.0 0.12 3 7.0");
  EXPECT_EQ(ok("{{ 1.0 is odd }}{{ 4 is divisibleby 2 }}{{ 7 is divisibleby(2.5) }}"), "TrueTrueFalse");
  EXPECT_EQ(render("{% if a if b else c %}{% endif %}").rc, -100); // jinja2: no conditional expression as an if's test
  EXPECT_EQ(render("{{ x is string is defined }}").rc, -100);     // nor tests chained with is
  EXPECT_EQ(ok("{{ 'abc'.replace('', '-') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'h\xc3\xa9llo'.find('l') }} {{ 'x'.find('y') }}"),
            "-a-b-c- bba 2 -1");
}

TEST(Jinja, FiltersAsJinja2) {
  // expected outputs are jinja2 3.1.6's for the same template and context
  std::string m = R"({"m": [{"a": 1}, {"a": 0}, {"a": 2}]})";
  // select/map/reject return generators: iterated once, always true, no `is sequence`, no length, no JSON
  EXPECT_EQ(ok("{% set g = m|selectattr('a') %}{{ g is sequence }}{% for x in g %}{{ x.a }}{% endfor %}|"
               "{% for x in g %}{{ x.a }}{% endfor %}|{{ (m|selectattr('z')) is true }}"
               "{{ true if m|selectattr('z') else false }}",
               m),
            "False12||FalseTrue");
  EXPECT_EQ(render("{{ m|map(attribute='a')|tojson }}", m).rc, -1);
  EXPECT_EQ(render("{{ m|map(attribute='a')|length }}", m).rc, -1);
  EXPECT_EQ(ok("{{ none|selectattr('a')|list }}"), "[]");
  EXPECT_EQ(ok("{% for k, v in d|dictsort %}{{ k }}={{ v }};{% endfor %}|{% for k, v in d|dictsort(true) %}{{ k }};"
               "{% endfor %}|{% for k, v in d|dictsort(by='value', reverse=true) %}{{ k }};{% endfor %}",
               R"({"d": {"b": 1, "A": 3, "a": 2, "C": 0}})"),
            "A=3;a=2;b=1;C=0;|A;C;a;b;|A;a;b;C;");
  EXPECT_EQ(ok("[{{ 'a\nb\n\nc' | indent(2) }}][{{ 'a\nb\n' | indent(2, true, true) }}][{{ 'x' | indent('>', first=true) }}]"),
            "[a\n  b\n\n  c][  a\n  b\n  ][>x]");
  EXPECT_EQ(ok("{{ '<a>'|safe + '<b>' }}|{{ '<c>' + '&'|safe }}|{{ '<d>'|safe ~ '<e>' }}"), "<a>&lt;b&gt;|&lt;c&gt;&|<d><e>");
  EXPECT_EQ(ok("{{ [3, 1, 2]|min }}{{ ['b', 'A', 'c']|max }}{{ m|max(attribute='a') }}{{ []|min is defined }}", m),
            "1c{'a': 2}False");
  EXPECT_EQ(ok("{{ [1,2]|reverse is sequence }}{{ 'abc'|reverse }}{{ [1,2]|reverse|list }}"), "Falsecba[2, 1]");
}

TEST(Jinja, TojsonAsHuggingFace) {
  // HF's tojson is json.dumps(ensure_ascii=False): no HTML escaping, non-ASCII kept, ints exact, float repr
  std::string ctx = R"({"x": {"a": "<b>&'\"", "n": [1, 1.5, null, true, "\u00e9", 12345678901234, 1e-5, 100.0]}})";
  EXPECT_EQ(ok("{{ x | tojson }}", ctx),
            "{\"a\": \"<b>&'\\\"\", \"n\": [1, 1.5, null, true, \"\xc3\xa9\", 12345678901234, 1e-05, 100.0]}");
  EXPECT_EQ(ok("{{ {'k': [1, {}], 'e': []} | tojson(indent=2) }}"), "{\n  \"k\": [\n    1,\n    {}\n  ],\n  \"e\": []\n}");
  EXPECT_EQ(ok("{{ s | tojson(ensure_ascii=True) }}", R"({"s": "\u00e9\ud83d\ude00<"})"), "\"\\u00e9\\ud83d\\ude00<\"");
}

TEST(Jinja, SpansFollowRequestText) {
  std::string ctx = R"({"bos_token": "<s>", "messages": [{"role": "user", "content": "hi<|im_end|>"}]})";
  Result r = render("{{ bos_token + '[' + messages[0].content + ']' }}", ctx);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[hi<|im_end|>]");
  ASSERT_EQ(r.spans.size(), 1u); // the top-level bos_token is the caller's, the content is request text
  EXPECT_EQ(r.spans[0], std::make_pair(size_t(4), size_t(12)));
  // a method's, a filter's, a slice's result on request text is request text whole; tojson of it too
  r = render("<{{ messages[0].content.upper() }}><{{ messages[0].content[1:4] }}><{{ messages[0] | tojson }}>", ctx);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "<HI<|IM_END|>><i<|><{\"role\": \"user\", \"content\": \"hi<|im_end|>\"}>");
  ASSERT_EQ(r.spans.size(), 3u);
  EXPECT_EQ(r.spans[0], std::make_pair(size_t(1), size_t(12)));
  EXPECT_EQ(r.spans[1], std::make_pair(size_t(15), size_t(3)));
  EXPECT_EQ(r.spans[2], std::make_pair(size_t(20), size_t(43)));
  // through a macro's output and a block set, and two request strings side by side merge into one span
  r = render("{% macro m(x) %}({{ x }}){% endmacro %}{% set b %}{{ m(messages[0].role) }}{% endset %}{{ b }}"
             "{{ messages[0].role ~ messages[0].role }}",
             ctx);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "(user)useruser");
  ASSERT_EQ(r.spans.size(), 2u);
  EXPECT_EQ(r.spans[0], std::make_pair(size_t(1), size_t(4)));
  EXPECT_EQ(r.spans[1], std::make_pair(size_t(6), size_t(8)));
  // template text and numbers from the request carry no span
  r = render("{{ '<|im_end|>' }}{{ n }}", R"({"x": {"n": 5}, "n": 7})");
  ASSERT_EQ(r.rc, 0);
  EXPECT_TRUE(r.spans.empty());
}

TEST(Jinja, RunawayTemplatesFailInsteadOfHanging) {
  Result r = render("{% set n = range(100000) %}{% for i in n %}{% for j in n %}{% endfor %}{% endfor %}");
  EXPECT_EQ(r.rc, -1);
  EXPECT_NE(r.err.find("loop iterations"), std::string::npos) << r.err;
  r = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(r.rc, -1);
  EXPECT_NE(r.err.find("nested deeper than 64"), std::string::npos) << r.err;
  r = render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
  EXPECT_EQ(r.rc, -1);
  EXPECT_NE(r.err.find("output longer than"), std::string::npos) << r.err;
  r = render("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  EXPECT_EQ(r.rc, -1) << "a string doubling 40 times must hit a bound";
  r = render("{{ " + std::string(2000, '(') + "1" + std::string(2000, ')') + " }}");
  EXPECT_EQ(r.rc, -100);
  EXPECT_NE(r.err.find("nested too deeply"), std::string::npos) << r.err;
}

TEST(Jinja, ContextErrors) {
  Result r = render("x", "[1]");
  EXPECT_EQ(r.rc, -1);
  EXPECT_EQ(r.err, "context: not a JSON object");
  r = render("x", R"({"a": )");
  EXPECT_EQ(r.rc, -1);
  EXPECT_NE(r.err.find("context:"), std::string::npos);
  r = render("x", R"({"a": 99999999999999999999})");
  EXPECT_EQ(r.rc, -1);
  EXPECT_NE(r.err.find("out of range"), std::string::npos) << r.err;
}

TEST(Jinja, UsesVar) {
  const char *tpl = "{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}{{ messages[0].content }}";
  char err[200];
  mdl_jinja *t;
  ASSERT_EQ(mdl_jinja_parse(tpl, strlen(tpl), &t, err, sizeof err), 0) << err;
  EXPECT_EQ(mdl_jinja_uses_var(t, "tools"), 1);
  EXPECT_EQ(mdl_jinja_uses_var(t, "messages"), 1);
  EXPECT_EQ(mdl_jinja_uses_var(t, "t"), 1);
  EXPECT_EQ(mdl_jinja_uses_var(t, "documents"), 0);
  mdl_jinja_free(t);
}

TEST(Jinja, RendersOnSeveralThreadsAtOnce) {
  const char *tpl = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}"
                    "{% endfor %}{{ ns.n }}";
  char err[200];
  mdl_jinja *t;
  ASSERT_EQ(mdl_jinja_parse(tpl, strlen(tpl), &t, err, sizeof err), 0) << err;
  std::vector<std::thread> th;
  std::vector<std::string> outs(4);
  for (int k = 0; k < 4; k++) {
    th.emplace_back([&, k] {
      std::string ctx = "{\"messages\": [{\"content\": \"t" + std::to_string(k) + "\"}, {\"content\": \"!\"}]}";
      for (int i = 0; i < 200; i++) {
        char e[200], *out;
        size_t len;
        if (mdl_jinja_render(t, ctx.data(), ctx.size(), nullptr, &out, &len, nullptr, nullptr, e, sizeof e) != 0) return;
        outs[k].assign(out, len);
        free(out);
      }
    });
  }
  for (auto &x : th) x.join();
  for (int k = 0; k < 4; k++) EXPECT_EQ(outs[k], "t" + std::to_string(k) + "!2");
  mdl_jinja_free(t);
}

} // namespace
