package tokenizer

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// clock is what strftime_now reads; tests pin it.
var clock = time.Now

// errorf makes the error a template function returns.
func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// jinjaTemplate is a model's own chat_template compiled with gonja and set
// up the way transformers' apply_chat_template sets up jinja2:
// trim_blocks and lstrip_blocks on, no autoescaping, undefined names empty,
// raise_exception and strftime_now as globals, tojson without ASCII escapes.
type jinjaTemplate struct {
	tpl      *exec.Template
	bos, eos string
}

// jinjaEnvironment is gonja's default environment plus the globals and the
// tojson filter of transformers.
func jinjaEnvironment() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{})
	filters.Update(builtins.Filters)
	// Replace cannot fail: tojson is a builtin filter.
	_ = filters.Replace("tojson", filterToJSON)
	_ = filters.Replace("reverse", filterReverse)
	sandboxFilters(filters)
	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	ctx.Set("raise_exception", func(msg string) (string, error) {
		return "", fmt.Errorf("chat template raised: %s", msg)
	})
	ctx.Set("strftime_now", func(format string) string { return strftime(clock(), format) })
	ctx.Set(getitemName, getitem)
	ctx.Set(getsliceName, getslice)
	sandboxGlobals(ctx)
	return &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: sandboxControlStructures(),
		Methods:           pythonMethods(),
	}
}

// compileJinja parses source as a chat template.
func compileJinja(source, bos, eos string) (*jinjaTemplate, error) {
	if err := checkTemplateBounds(source); err != nil {
		return nil, err
	}
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	const name = "/chat_template.jinja"
	loader, err := loaders.NewMemoryLoader(map[string]string{name: source})
	if err != nil {
		return nil, err
	}
	tpl, err := exec.NewTemplate(name, cfg, loader, jinjaEnvironment())
	if err != nil {
		return nil, shortenGonjaError(err)
	}
	pythonize(tpl.Root(), source)
	return &jinjaTemplate{tpl: tpl, bos: bos, eos: eos}, nil
}

// render runs the template with the variables transformers'
// apply_chat_template passes: messages, add_generation_prompt, bos_token and
// eos_token ("" when the model has none, where transformers would leave them
// undefined), tools = None and documents = None, then kwargs (the
// chat_template_kwargs of vLLM and SGLang: enable_thinking, date_string,
// tools, ...), which may override any of them.
func (j *jinjaTemplate) render(messages []Message, addGenerationPrompt bool, kwargs map[string]any) (out string, err error) {
	defer func() {
		// A bound of the sandbox, or a template that gonja mishandles: neither may take the
		// trainer down.
		if r := recover(); r != nil {
			if se, ok := r.(sandboxError); ok {
				out, err = "", fmt.Errorf("chat template: %w", se)
				return
			}
			out, err = "", fmt.Errorf("chat template: gonja panicked: %v", r)
		}
	}()
	msgs := make([]map[string]any, len(messages))
	for i, m := range messages {
		msgs[i] = map[string]any{"role": m.Role, "content": m.Content}
		if m.ReasoningContent != "" {
			msgs[i]["reasoning_content"] = m.ReasoningContent
		}
	}
	vars := map[string]any{
		"messages":              msgs,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             j.bos,
		"eos_token":             j.eos,
		"tools":                 nil,
		"documents":             nil,
	}
	for k, v := range kwargs {
		vars[k] = v
	}
	sb := newSandbox(maxTemplateTime)
	vars[sandboxName] = sb
	w := &sandboxWriter{s: sb}
	if err := j.tpl.Execute(w, exec.NewContext(vars)); err != nil {
		return "", fmt.Errorf("chat template: %w", shortenGonjaError(err))
	}
	return w.b.String(), nil
}

// shortenGonjaError drops the template source that gonja pastes into some
// parse errors.
func shortenGonjaError(err error) error {
	msg := err.Error()
	if i := strings.Index(msg, "failed to parse template '"); i >= 0 {
		if j := strings.LastIndex(msg, "': "); j > i {
			return errors.New("failed to parse template: " + msg[j+3:])
		}
	}
	return err
}

// filterToJSON is transformers' tojson, json.dumps(x, ensure_ascii=False):
// gonja's tojson output with Go's HTML-safe escapes undone and Python's
// ", " and ": " separators in compact output.
func filterToJSON(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	builtin, _ := builtins.Filters.Get("tojson")
	out := builtin(e, in, params)
	if out.IsError() || !out.IsString() {
		return out
	}
	return exec.AsSafeValue(pythonJSON(out.String()))
}

// pythonJSON rewrites Go JSON text the way json.dumps(ensure_ascii=False)
// writes it, leaving string contents otherwise alone.
func pythonJSON(s string) string {
	compact := !strings.Contains(s, "\n")
	unescape := map[string]string{
		`\u0027`: "'", `\u003c`: "<", `\u003e`: ">", `\u0026`: "&", `\u2028`: "\u2028", `\u2029`: "\u2029",
	}
	var sb strings.Builder
	inString := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inString && c == '\\':
			if i+6 <= len(s) {
				if r, ok := unescape[s[i:i+6]]; ok {
					sb.WriteString(r)
					i += 5
					continue
				}
			}
			sb.WriteByte(c)
			if i+1 < len(s) {
				i++
				sb.WriteByte(s[i])
			}
			continue
		case c == '"':
			inString = !inString
		}
		sb.WriteByte(c)
		if compact && !inString && (c == ':' || c == ',') {
			sb.WriteByte(' ')
		}
	}
	return sb.String()
}

// strftime formats t with the C strftime directives chat templates use
// (Llama 3.1 writes the date with strftime_now("%d %b %Y")), and glibc's
// "-" flag that drops the padding ("%-d").
func strftime(t time.Time, format string) string {
	layouts := map[byte]string{
		'd': "02", 'm': "01", 'y': "06", 'Y': "2006", 'b': "Jan", 'B': "January", 'h': "Jan",
		'a': "Mon", 'A': "Monday", 'H': "15", 'I': "03", 'M': "04", 'S': "05", 'p': "PM",
	}
	unpadded := map[byte]string{'d': "2", 'm': "1", 'I': "3"}
	var sb strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			sb.WriteByte(format[i])
			continue
		}
		i++
		c := format[i]
		switch {
		case c == '%':
			sb.WriteByte('%')
		case c == 'j':
			fmt.Fprintf(&sb, "%03d", t.YearDay())
		case c == '-' && i+1 < len(format) && strings.IndexByte("dmIHMSj", format[i+1]) >= 0:
			i++
			if l, ok := unpadded[format[i]]; ok {
				sb.WriteString(t.Format(l))
			} else {
				n := map[byte]int{'H': t.Hour(), 'M': t.Minute(), 'S': t.Second(), 'j': t.YearDay()}[format[i]]
				fmt.Fprintf(&sb, "%d", n)
			}
		default:
			if l, ok := layouts[c]; ok {
				sb.WriteString(t.Format(l))
			} else {
				sb.WriteByte('%')
				sb.WriteByte(c)
			}
		}
	}
	return sb.String()
}
