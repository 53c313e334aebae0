package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/drmas/drmas/pkg/files"
	"github.com/drmas/drmas/pkg/llm"

	"github.com/rs/zerolog/log"
)

// Message is one turn of a conversation: the policies' message (pkg/llm),
// so that nothing a conversation carries is lost between them. Role,
// Content, ReasoningContent, ToolCalls, ToolCallID and Name reach the
// template as transformers' message fields (role, content,
// reasoning_content, tool_calls, tool_call_id, name); an empty optional
// field is left out of the message, as a message without it.
type Message = llm.Message

// ToolCall is an assistant turn's function call (pkg/llm).
type ToolCall = llm.ToolCall

// Built-in chat template names. They write each message as it is; the
// models' own templates add what the built-ins leave out (Qwen2.5's default
// system prompt when none is given, Qwen3's removal of <think> blocks from
// earlier turns, Llama 3.1's dated system header).
const (
	// TemplateChatML is Qwen-style ChatML: "<|im_start|>role\ncontent<|im_end|>\n"
	// per message, "<|im_start|>assistant\n" as the generation prompt.
	TemplateChatML = "chatml"
	// TemplateQwen3 is ChatML whose generation prompt ends with Qwen3's
	// empty think block, "<think>\n\n</think>\n\n": thinking off.
	TemplateQwen3 = "qwen3"
	// TemplateLlama3 is Llama 3's "<|begin_of_text|>" then
	// "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>" per
	// message, content trimmed.
	TemplateLlama3 = "llama3"
	// TemplatePlain is "role: content\n" per message and "assistant: " as the
	// generation prompt, for models without a chat format.
	TemplatePlain = "plain"
)

// Token strings the built-in templates write.
const (
	llama3BOS = "<|begin_of_text|>"
	llama3EOT = "<|eot_id|>"
)

// ChatTemplate turns a conversation into the prompt text a model was tuned
// on. It is either the model's own Jinja template or a built-in one.
type ChatTemplate struct {
	name      string
	jinja     *jinjaTemplate // nil for a built-in
	source    string         // the Jinja source; "" for a built-in
	endOfTurn []string
}

// Name is the built-in's name, or "jinja" for a model's own template.
func (c *ChatTemplate) Name() string { return c.name }

// Source is the Jinja source of a model's own template ("" for a built-in): what it tells the
// model, e.g. the tool-call format it asks for (pkg/toolcall's FormatForTemplate).
func (c *ChatTemplate) Source() string { return c.source }

// EndOfTurn returns the strings that end an assistant turn under this
// template ("<|im_end|>", "<|eot_id|>", the model's EOS): generation stops
// at the first of them.
func (c *ChatTemplate) EndOfTurn() []string { return append([]string(nil), c.endOfTurn...) }

// Render writes messages as prompt text. With addGenerationPrompt the text
// ends with the header of a new assistant turn, ready for generation.
func (c *ChatTemplate) Render(messages []Message, addGenerationPrompt bool) (string, error) {
	return c.RenderWith(messages, addGenerationPrompt, nil)
}

// RenderWith is Render with extra template variables, the
// chat_template_kwargs that vLLM and SGLang accept per request (Qwen3's
// enable_thinking, Llama 3.1's date_string, tools, ...); they override the
// defaults transformers passes. The built-in templates read only
// enable_thinking (qwen3: true drops the empty think block), and refuse
// tools and messages with tool calls. A value given as json.RawMessage
// reaches a Jinja template as the JSON it holds, its objects' keys in their
// order (a tool schema written by hand, as transformers would keep it); Go
// maps come out in sorted key order.
func (c *ChatTemplate) RenderWith(messages []Message, addGenerationPrompt bool, kwargs map[string]any) (string, error) {
	if c.jinja != nil {
		return c.jinja.render(messages, addGenerationPrompt, kwargs)
	}
	// The built-ins have no tool format: rendering without the tools would hide them from the
	// model.
	if tools, err := builtinKwarg(kwargs, "tools"); err != nil {
		return "", err
	} else if tools != nil {
		return "", fmt.Errorf("chat template %q is built in and cannot render tools; use the model's own chat template", c.name)
	}
	enableThinking, err := builtinKwarg(kwargs, "enable_thinking")
	if err != nil {
		return "", err
	}
	for i, m := range messages {
		if len(m.ToolCalls) > 0 {
			return "", fmt.Errorf("chat template %q is built in and cannot render tool calls (message %d); use the model's own chat template", c.name, i)
		}
	}
	var sb strings.Builder
	switch c.name {
	case TemplateChatML, TemplateQwen3:
		for _, m := range messages {
			sb.WriteString(ImStart + m.Role + "\n" + m.Content + ImEnd + "\n")
		}
		if addGenerationPrompt {
			sb.WriteString(ImStart + "assistant\n")
			if think, _ := enableThinking.(bool); c.name == TemplateQwen3 && !think {
				sb.WriteString("<think>\n\n</think>\n\n")
			}
		}
	case TemplateLlama3:
		sb.WriteString(llama3BOS)
		for _, m := range messages {
			sb.WriteString("<|start_header_id|>" + m.Role + "<|end_header_id|>\n\n" + strings.TrimSpace(m.Content) + llama3EOT)
		}
		if addGenerationPrompt {
			sb.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
		}
	case TemplatePlain:
		for _, m := range messages {
			sb.WriteString(m.Role + ": " + m.Content + "\n")
		}
		if addGenerationPrompt {
			sb.WriteString("assistant: ")
		}
	}
	return sb.String(), nil
}

// builtinKwarg is the value of a template argument a built-in reads, decoded when it was given
// as json.RawMessage; nil when absent or null.
func builtinKwarg(kwargs map[string]any, key string) (any, error) {
	v := kwargs[key]
	if raw, ok := v.(json.RawMessage); ok {
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("chat template: argument %s: invalid JSON: %w", key, err)
		}
	}
	return v, nil
}

// BuiltinChatTemplate returns a built-in template by name (TemplateChatML,
// TemplateQwen3, TemplateLlama3, TemplatePlain). eos, when not empty, is
// the model's end-of-sequence token, added to EndOfTurn.
func BuiltinChatTemplate(name, eos string) (*ChatTemplate, error) {
	var eot []string
	switch name {
	case TemplateChatML, TemplateQwen3:
		eot = []string{ImEnd}
	case TemplateLlama3:
		eot = []string{llama3EOT}
	case TemplatePlain:
	default:
		return nil, fmt.Errorf("chat template %q is not built in (want %s, %s, %s or %s)",
			name, TemplateChatML, TemplateQwen3, TemplateLlama3, TemplatePlain)
	}
	return &ChatTemplate{name: name, endOfTurn: appendUnique(eot, eos)}, nil
}

// NewJinjaChatTemplate compiles a Jinja chat template. bos and eos are the
// model's bos_token and eos_token ("" when it has none).
func NewJinjaChatTemplate(source, bos, eos string) (*ChatTemplate, error) {
	j, err := compileJinja(source, bos, eos)
	if err != nil {
		return nil, err
	}
	// A template can parse and still fail when run (an unsupported filter
	// or method): try it on a typical conversation, and on one without a
	// system turn for templates that refuse system messages.
	var probeErr error
	for _, probe := range [][]Message{
		{{Role: "system", Content: "s"}, {Role: "user", Content: "u"}, {Role: "assistant", Content: "a"}, {Role: "user", Content: "u"}},
		{{Role: "user", Content: "u"}, {Role: "assistant", Content: "a"}, {Role: "user", Content: "u"}},
	} {
		if _, probeErr = j.render(probe, true, nil); probeErr == nil {
			break
		}
	}
	if probeErr != nil {
		return nil, probeErr
	}
	var eot []string
	for _, marker := range []string{ImEnd, llama3EOT} {
		if strings.Contains(source, marker) {
			eot = append(eot, marker)
		}
	}
	return &ChatTemplate{name: "jinja", jinja: j, source: source, endOfTurn: appendUnique(eot, eos)}, nil
}

// LoadChatTemplate reads the chat template of a Hugging Face model folder:
// chat_template from tokenizer_config.json (a string, or a list of
// {name, template} of which "default" is taken), else chat_template.jinja,
// else chat_template.json, with bos_token and eos_token from
// tokenizer_config.json. A folder without a template gets the built-in that
// its tokens point to (ChatML when the tokenizer has "<|im_start|>", Llama 3
// for "<|start_header_id|>", else plain). A template gonja cannot render
// falls back the same way, with a warning.
func LoadChatTemplate(modelDir string) (*ChatTemplate, error) {
	cfgPath := filepath.Join(modelDir, "tokenizer_config.json")
	cfg, err := readTokenizerConfig(cfgPath)
	if err != nil {
		return nil, err
	}
	source, origin, err := findTemplateSource(modelDir, cfg)
	if err != nil {
		return nil, err
	}
	if source == "" {
		name := builtinFor(markerText(modelDir, cfg))
		log.Info().Str("model", modelDir).Str("template", name).Msg("no chat template in the model folder; using a built-in")
		return BuiltinChatTemplate(name, cfg.eos)
	}
	ct, err := NewJinjaChatTemplate(source, cfg.bos, cfg.eos)
	if err == nil {
		return ct, nil
	}
	var tooBig *TemplateBoundsError
	if errors.As(err, &tooBig) { // refused, not replaced: something is wrong with the folder
		return nil, fmt.Errorf("%s: %w", origin, err)
	}
	name := builtinFor(source)
	log.Warn().Err(err).Str("template", origin).Str("fallback", name).
		Msg("gonja cannot render the model's chat template; using a built-in that matches its markers")
	return BuiltinChatTemplate(name, cfg.eos)
}

// tokenizerConfig is what LoadChatTemplate needs from tokenizer_config.json.
type tokenizerConfig struct {
	template json.RawMessage
	bos, eos string
	raw      []byte
}

func readTokenizerConfig(path string) (tokenizerConfig, error) {
	data, err := files.Read(path, files.MaxJSON)
	if errors.Is(err, fs.ErrNotExist) {
		return tokenizerConfig{}, nil
	}
	if err != nil {
		return tokenizerConfig{}, fmt.Errorf("chat template: %w", err)
	}
	var doc struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return tokenizerConfig{}, fmt.Errorf("chat template: %s: %w", path, err)
	}
	bos, err := tokenContent(doc.BOS)
	if err != nil {
		return tokenizerConfig{}, fmt.Errorf("chat template: %s: bos_token: %w", path, err)
	}
	eos, err := tokenContent(doc.EOS)
	if err != nil {
		return tokenizerConfig{}, fmt.Errorf("chat template: %s: eos_token: %w", path, err)
	}
	return tokenizerConfig{template: doc.ChatTemplate, bos: bos, eos: eos, raw: data}, nil
}

// tokenContent reads a special token written as null, "text", or an
// AddedToken object {"content": "text", ...}.
func tokenContent(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("want a string or {\"content\": ...}, got %s", raw)
	}
	return obj.Content, nil
}

// findTemplateSource returns the Jinja source of the model's template and
// where it came from, or "" when the folder has none.
func findTemplateSource(dir string, cfg tokenizerConfig) (string, string, error) {
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	if !isNull(cfg.template) {
		src, err := templateFromJSON(cfg.template)
		if err != nil {
			return "", "", fmt.Errorf("chat template: %s: chat_template: %w", cfgPath, err)
		}
		return src, cfgPath + ": chat_template", nil
	}
	jinjaPath := filepath.Join(dir, "chat_template.jinja")
	if data, err := files.Read(jinjaPath, files.MaxJSON); err == nil {
		return string(data), jinjaPath, nil
	}
	jsonPath := filepath.Join(dir, "chat_template.json")
	data, err := files.Read(jsonPath, files.MaxJSON)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("chat template: %w", err)
	}
	var doc struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return "", "", fmt.Errorf("chat template: %s: %w", jsonPath, err)
	}
	src, err := templateFromJSON(doc.ChatTemplate)
	if err != nil {
		return "", "", fmt.Errorf("chat template: %s: chat_template: %w", jsonPath, err)
	}
	return src, jsonPath, nil
}

// templateFromJSON reads a chat_template value: a string, or a list of
// named templates of which "default" is used.
func templateFromJSON(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("want a string or a list of {name, template}")
	}
	var names []string
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
		names = append(names, n.Name)
	}
	return "", fmt.Errorf("no template named \"default\" (have %q)", names)
}

// markerText gathers the added tokens of a model folder (from
// tokenizer_config.json and tokenizer.json): they tell which built-in
// template a model without one was meant for.
func markerText(dir string, cfg tokenizerConfig) string {
	var parts []string
	var c struct {
		Decoder map[string]struct {
			Content string `json:"content"`
		} `json:"added_tokens_decoder"`
	}
	if json.Unmarshal(cfg.raw, &c) == nil {
		for _, t := range c.Decoder {
			parts = append(parts, t.Content)
		}
	}
	var tj struct {
		Added []struct {
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	if data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json")); err == nil && json.Unmarshal(data, &tj) == nil {
		for _, t := range tj.Added {
			parts = append(parts, t.Content)
		}
	}
	return strings.Join(parts, " ")
}

// builtinFor picks the built-in template whose tokens appear in text.
func builtinFor(text string) string {
	switch {
	case strings.Contains(text, ImStart) && strings.Contains(text, "enable_thinking"):
		return TemplateQwen3
	case strings.Contains(text, ImStart):
		return TemplateChatML
	case strings.Contains(text, "<|start_header_id|>"):
		return TemplateLlama3
	default:
		return TemplatePlain
	}
}

func appendUnique(list []string, s string) []string {
	if s == "" {
		return list
	}
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}
