package tokenizer

import (
	"strings"
	"testing"
	"time"
)

// A chat template renders in a sandbox: every way to exhaust the machine is a named error (before: a
// range of 10⁹ hung past 3.8 GB, 'x' * 10¹⁰ reached 6.5 GB, a recursive macro was a fatal Go stack
// overflow that no recover catches), and what stays within the bounds renders as before.
func TestChatTemplateSandbox(t *testing.T) {
	old := maxTemplateTime
	defer func() { maxTemplateTime = old }()
	msgs := []Message{{Role: "user", Content: "hi"}}
	for _, c := range []struct{ name, src, want string }{
		{"range", `{% for i in range(1000000000) %}{{ i }}{% endfor %}`, "template: range of 1000000000 items exceeds 100000"},
		{"range with step", `{{ range(0, 300000, 2)|length }}`, "template: range of 150000 items exceeds 100000"},
		{"range of huge bounds", `{{ range(-9000000000000000000, 9000000000000000000)|length }}`, "exceeds 100000"},
		{"string times", `{{ 'x' * 10000000000 }}`, "template: a string of 10000000000 bytes exceeds 67108864"},
		{"times string", `{{ 10000000000 * 'xy' }}`, "template: a string of 20000000000 bytes exceeds"},
		{"doubling", `{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}`, "template: a string of"},
		{"doubling with +", `{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}`, "template: a string of"},
		{"list doubling", `{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}`, "template: a list of"},
		{"list times", `{{ ([1, 2] * 10000000)|length }}`, "template: a list of 20000000 items exceeds"},
		{"output", `{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}`, "template: output of more than 67108864 bytes"},
		{"recursive macro", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, "template: macro f nested deeper than 200 calls"},
		{"mutual recursion", `{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}`, "nested deeper than 200 calls"},
		{"recursive loop", `{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}`, "template: loop() nested deeper than 200 calls"},
		{"time", `{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`, "template: rendering took longer than 500ms"},
		{"center", `{{ 'x'|center(3000000000) }}`, "template: filter center: argument 3000000000 exceeds 67108864"},
		{"indent", `{{ 'x'|indent(3000000000, true) }}`, "template: filter indent: argument 3000000000 exceeds"},
		{"ljust", `{{ 'x'.ljust(3000000000) }}`, "template: method ljust: argument 3000000000 exceeds"},
		{"format width", `{{ '%3000000000s'|format('x') }}`, "template: filter format: width 3000000000 exceeds"},
		{"join", `{{ (['x'] * 100)|join('y' * 60000000) }}`, "template: a string of"},
		{"replace", `{{ ('x' * 1000)|replace('x', 'y' * 1000000) }}`, "template: a string of 1000000000 bytes exceeds"},
		{"time without calls", `{% set r = range(100000) %}{% for a in r %}{% for b in r %}{% for c in r %}{% endfor %}{% endfor %}{% endfor %}`, "template: rendering took longer than 500ms"},
		{"include", `{% include 'chat_template.jinja' %}`, "include"},
	} {
		// The time bound is short where it is the bound under test, and long elsewhere: on a loaded
		// machine a size bound may take longer than 500 ms to reach.
		maxTemplateTime = 15 * time.Second
		if strings.Contains(c.want, "rendering took longer") {
			maxTemplateTime = 500 * time.Millisecond
		}
		start := time.Now()
		chat, err := NewJinjaChatTemplate(c.src, "", "")
		if err == nil {
			_, err = chat.Render(msgs, true)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one containing %q", c.name, err, c.want)
		}
		if took := time.Since(start); took > 20*time.Second {
			t.Errorf("%s: refused after %s", c.name, took)
		}
	}
	for _, c := range []struct{ name, src, want string }{
		{"range at the bound", `{{ range(100000)|length }} {{ range(5, 0, -2)|list }}`, "100000 [5, 3, 1]"},
		{"operators", `{{ 'ab' * 3 }} {{ 2 * 'c' }} {{ 1 + 2 }} {{ 1.5 * 2 }} {{ 'a' ~ 1 }} {{ [1] + [2] }} {{ [0] * 2 }} {{ 'x' + 'y' }}`, "ababab cc 3 3.0 a1 [1, 2] [0, 0] xy"},
		{"shallow macros", `{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(150) | length }}`, "342"},
		{"filters within bounds", `{{ 'x'|center(5) }}|{{ 'a-b'|replace('-', '+') }}|{{ ['a', 'b']|join(', ') }}|{{ '%3s'|format('x') }}|{{ 7|default(10000000000) }}`, "  x  |a+b|a, b|  x|7"},
		{"recursive loop over a tree", `{% for x in [{'n': 'a', 'c': [{'n': 'b', 'c': []}]}] recursive %}{{ x.n }}{{ loop(x.c) }}{% endfor %}`, "ab"},
	} {
		chat, err := NewJinjaChatTemplate(c.src, "", "")
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := chat.Render(msgs, true)
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}
