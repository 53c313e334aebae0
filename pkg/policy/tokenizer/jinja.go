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
	_ = filters.Replace("items", filterItems)
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
// tools, ...), which may override any of them. A kwarg given as
// json.RawMessage (at any depth) reaches the template as Python's json.loads
// would make it, its objects' keys in their order (see pyjson.go).
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
	sb := newSandbox(maxTemplateTime)
	order := &keyOrder{}
	defer order.release()
	msgs := make([]map[string]any, len(messages))
	for i, m := range messages {
		if msgs[i], err = messageValue(m, order); err != nil {
			return "", fmt.Errorf("chat template: message %d: %w", i, err)
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
		if vars[k], err = templateValues(v, order); err != nil {
			return "", fmt.Errorf("chat template: argument %s: %w", k, err)
		}
	}
	vars[sandboxName] = sb
	w := &sandboxWriter{s: sb}
	if err := j.tpl.Execute(w, exec.NewContext(vars)); err != nil {
		return "", fmt.Errorf("chat template: %w", shortenGonjaError(err))
	}
	return w.b.String(), nil
}

// messageValue is m as transformers hands a message to a template: a dict
// with role and content, and each optional field that m has
// (reasoning_content, tool_calls, tool_call_id, name), in that order. A tool
// call is {"id": …, "type": …, "function": {"name": …, "arguments": …}}
// without the fields it lacks, its arguments decoded from their JSON (an
// object, or the string that OpenAI's form sends).
func messageValue(m Message, order *keyOrder) (map[string]any, error) {
	v := map[string]any{"role": m.Role, "content": m.Content}
	keys := []string{"role", "content"}
	set := func(k string, x any) {
		v[k] = x
		keys = append(keys, k)
	}
	if m.ReasoningContent != "" {
		set("reasoning_content", m.ReasoningContent)
	}
	if m.ToolCalls != nil {
		calls := make([]any, len(m.ToolCalls))
		for i, tc := range m.ToolCalls {
			fn := map[string]any{"name": tc.Function.Name}
			fnKeys := []string{"name"}
			if len(tc.Function.Arguments) > 0 {
				args, err := decodeJSON(tc.Function.Arguments, order)
				if err != nil {
					return nil, fmt.Errorf("tool call %d (%s): arguments: %w", i, tc.Function.Name, err)
				}
				fn["arguments"] = args
				fnKeys = append(fnKeys, "arguments")
			}
			order.record(fn, fnKeys)
			call := map[string]any{}
			var callKeys []string
			if tc.ID != "" {
				call["id"] = tc.ID
				callKeys = append(callKeys, "id")
			}
			if tc.Type != "" {
				call["type"] = tc.Type
				callKeys = append(callKeys, "type")
			}
			call["function"] = fn
			callKeys = append(callKeys, "function")
			order.record(call, callKeys)
			calls[i] = call
		}
		set("tool_calls", calls)
	}
	if m.ToolCallID != "" {
		set("tool_call_id", m.ToolCallID)
	}
	if m.Name != "" {
		set("name", m.Name)
	}
	order.record(v, keys)
	return v, nil
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
