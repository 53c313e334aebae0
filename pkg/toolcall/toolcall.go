// Package toolcall reads the function calls a model writes in its family's format, and writes
// parsed calls back as the assistant message's tool_calls, which the chat template renders in the
// next turn's prompt.
//
// Two formats, those the chat templates instruct:
//
//   - Hermes (Qwen2.5, Qwen3, Hermes, and any template that asks for <tool_call> tags): each call is
//     <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>; a response may hold several, with
//     text before, between and after them.
//   - Llama3JSON (Llama 3.1, 3.2, 3.3): the response is a JSON call {"name": …, "parameters": {…}}
//     (the form the template asks for; "arguments" is read too, as vLLM does), possibly after
//     <|python_tag|>, several separated by ";"; text may precede <|python_tag|> but nothing may
//     follow the calls.
//
// Parse returns the calls (name, arguments as the raw JSON object written) and the answer text
// outside them, or an *Error whose Reason says what is malformed: an unclosed or stray tag, invalid
// JSON, a call that is not an object, a missing or empty name, arguments that are not an object,
// text after Llama's calls. A response with one malformed call has no valid calls: the caller
// treats it as one invalid action. Reasoning (Qwen3's <think> block) is the caller's to remove
// first, as vLLM's reasoning parser runs before its tool parser.
package toolcall

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"

	"github.com/drmas/drmas/pkg/llm"
)

// Format is a model family's way of writing function calls.
type Format string

// The formats Parse reads.
const (
	// Hermes is <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>, any number of them with
	// text around them (Qwen2.5, Qwen3, Hermes 2 Pro and 3).
	Hermes Format = "hermes"
	// Llama3JSON is Llama 3.1's JSON call {"name": …, "parameters": {…}}, optionally after
	// <|python_tag|>, several separated by ";" (Llama 3.1, 3.2, 3.3).
	Llama3JSON Format = "llama3_json"
)

// Tags of the formats.
const (
	HermesOpen  = "<tool_call>"
	HermesClose = "</tool_call>"
	PythonTag   = "<|python_tag|>"
)

// Call is one function call a response made.
type Call struct {
	Name string
	// Arguments is the JSON object the call passed, as written (without surrounding whitespace);
	// "{}" when the call gave none.
	Arguments json.RawMessage
}

// Result is what a response holds: its calls, in order, and the text outside them.
type Result struct {
	Calls []Call
	// Content is the answer text: the text outside the calls, each piece trimmed of surrounding
	// whitespace and the non-empty pieces joined by "\n" (Hermes); the text before <|python_tag|>,
	// or the whole response when it holds no call, trimmed (Llama3JSON).
	Content string
}

// Reason names what is malformed in a response.
type Reason string

// The reasons Parse gives.
const (
	UnclosedTag        Reason = "unclosed tag"         // <tool_call> without </tool_call>
	StrayTag           Reason = "stray tag"            // </tool_call> without <tool_call>
	InvalidJSON        Reason = "invalid JSON"         // the call is not JSON
	NotAnObject        Reason = "not an object"        // the call is JSON but not an object
	MissingName        Reason = "missing name"         // no "name", or an empty one
	NameNotString      Reason = "name not a string"    // "name" is not a JSON string
	ArgumentsNotObject Reason = "arguments not object" // "arguments" / "parameters" is not an object
	TrailingText       Reason = "text after the calls" // Llama3JSON: text follows the last call
	NotJSONCall        Reason = "not a JSON call"      // Llama3JSON: after <|python_tag|>, no JSON object
	DuplicateKey       Reason = "duplicate key"        // a key twice in one object of the call, at any depth
)

// Error is a malformed response: Reason, the call it concerns (0-based, in the order the calls were
// written), the byte offset in the response where the call starts, and a detail.
type Error struct {
	Format Format
	Reason Reason
	Call   int
	Offset int
	Detail string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s tool call %d (byte %d): %s", e.Format, e.Call, e.Offset, e.Reason)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Parse reads the function calls in a model's response written in format f. A response without
// calls is no error (Result.Calls is empty); a malformed one is an *Error.
func Parse(f Format, text string) (Result, error) {
	switch f {
	case Hermes:
		return parseHermes(text)
	case Llama3JSON:
		return parseLlama(text)
	}
	return Result{}, fmt.Errorf("tool-call format %q unknown (want %s or %s)", f, Hermes, Llama3JSON)
}

func parseHermes(text string) (Result, error) {
	var res Result
	var content []string
	keep := func(s string) {
		if s = strings.TrimSpace(s); s != "" {
			content = append(content, s)
		}
	}
	rest, offset := text, 0
	for i := 0; ; i++ {
		open := strings.Index(rest, HermesOpen)
		if stray := strings.Index(rest, HermesClose); stray >= 0 && (open < 0 || stray < open) {
			return Result{}, &Error{Format: Hermes, Reason: StrayTag, Call: i, Offset: offset + stray,
				Detail: HermesClose + " without " + HermesOpen}
		}
		if open < 0 {
			keep(rest)
			break
		}
		keep(rest[:open])
		start := offset + open
		body := rest[open+len(HermesOpen):]
		end := strings.Index(body, HermesClose)
		if end < 0 {
			return Result{}, &Error{Format: Hermes, Reason: UnclosedTag, Call: i, Offset: start,
				Detail: HermesOpen + " without " + HermesClose}
		}
		if next := strings.Index(body[:end], HermesOpen); next >= 0 {
			return Result{}, &Error{Format: Hermes, Reason: UnclosedTag, Call: i, Offset: start,
				Detail: "another " + HermesOpen + " opens before " + HermesClose}
		}
		call, err := decodeCall(body[:end], "arguments")
		if err != nil {
			err.Format, err.Call, err.Offset = Hermes, i, start
			return Result{}, err
		}
		res.Calls = append(res.Calls, call)
		consumed := open + len(HermesOpen) + end + len(HermesClose)
		rest, offset = rest[consumed:], offset+consumed
	}
	res.Content = strings.Join(content, "\n")
	return res, nil
}

func parseLlama(text string) (Result, error) {
	body, offset := text, 0
	tagged := false
	if i := strings.Index(text, PythonTag); i >= 0 {
		tagged = true
		body, offset = text[i+len(PythonTag):], i+len(PythonTag)
		text = text[:i]
	} else {
		// Without the tag, a response is a call only if it is a JSON object with a key
		// ({"…): an answer that merely starts with a brace stays an answer.
		t := strings.TrimLeftFunc(text, unicode.IsSpace)
		if !strings.HasPrefix(t, "{") || !strings.HasPrefix(strings.TrimLeftFunc(t[1:], unicode.IsSpace), `"`) {
			return Result{Content: strings.TrimSpace(text)}, nil
		}
		text = ""
	}
	res := Result{Content: strings.TrimSpace(text)}
	for i := 0; ; i++ {
		trimmed := strings.TrimLeftFunc(body, unicode.IsSpace)
		offset += len(body) - len(trimmed)
		body = trimmed
		if body == "" {
			if i == 0 {
				return Result{}, &Error{Format: Llama3JSON, Reason: NotJSONCall, Call: 0, Offset: offset,
					Detail: "nothing after " + PythonTag}
			}
			break
		}
		if body[0] != '{' {
			if i == 0 {
				detail := fmt.Sprintf("%.40q", body)
				if tagged {
					detail += " (Llama's built-in tool calls, name.call(…), are not read)"
				}
				return Result{}, &Error{Format: Llama3JSON, Reason: NotJSONCall, Call: 0, Offset: offset, Detail: detail}
			}
			return Result{}, &Error{Format: Llama3JSON, Reason: TrailingText, Call: i - 1, Offset: offset,
				Detail: fmt.Sprintf("%.40q", body)}
		}
		dec := json.NewDecoder(strings.NewReader(body))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return Result{}, &Error{Format: Llama3JSON, Reason: InvalidJSON, Call: i, Offset: offset, Detail: jsonDetail(err)}
		}
		call, cerr := decodeCall(string(raw), "parameters", "arguments")
		if cerr != nil {
			cerr.Format, cerr.Call, cerr.Offset = Llama3JSON, i, offset
			return Result{}, cerr
		}
		res.Calls = append(res.Calls, call)
		n := int(dec.InputOffset())
		body, offset = body[n:], offset+n
		// Calls are separated by ";" (what vLLM's Llama parser splits on).
		trimmed = strings.TrimLeftFunc(body, unicode.IsSpace)
		if strings.HasPrefix(trimmed, ";") {
			offset += len(body) - len(trimmed) + 1
			body = trimmed[1:]
		}
	}
	return res, nil
}

// decodeCall reads one call's JSON: an object with a non-empty string "name" and an object
// under the first of argKeys present (absent: {}). Its Format, Call and Offset are the caller's
// to set.
func decodeCall(body string, argKeys ...string) (Call, *Error) {
	raw := bytes.TrimSpace([]byte(body))
	if len(raw) == 0 {
		return Call{}, &Error{Reason: InvalidJSON, Detail: "empty call"}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return Call{}, &Error{Reason: InvalidJSON, Detail: jsonDetail(err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return Call{}, &Error{Reason: InvalidJSON, Detail: fmt.Sprintf("text after the JSON value: %.40q", raw[dec.InputOffset():])}
	}
	if v[0] != '{' {
		return Call{}, &Error{Reason: NotAnObject, Detail: fmt.Sprintf("got %.40s", v)}
	}
	if key, dup := duplicateKey(v); dup {
		return Call{}, &Error{Reason: DuplicateKey, Detail: fmt.Sprintf("%.60q appears twice (a reader could take either value)", key)}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(v, &fields); err != nil {
		return Call{}, &Error{Reason: InvalidJSON, Detail: jsonDetail(err)}
	}
	nameRaw, ok := fields["name"]
	if !ok {
		return Call{}, &Error{Reason: MissingName, Detail: `no "name"`}
	}
	var name string
	if err := json.Unmarshal(nameRaw, &name); err != nil {
		return Call{}, &Error{Reason: NameNotString, Detail: fmt.Sprintf(`"name" is %.40s`, nameRaw)}
	}
	if strings.TrimSpace(name) == "" {
		return Call{}, &Error{Reason: MissingName, Detail: `"name" is empty`}
	}
	args := json.RawMessage("{}")
	for _, k := range argKeys {
		a, ok := fields[k]
		if !ok {
			continue
		}
		if a = bytes.TrimSpace(a); len(a) == 0 || a[0] != '{' {
			return Call{}, &Error{Reason: ArgumentsNotObject, Detail: fmt.Sprintf("%q of %s is %.60s", k, name, a)}
		}
		args = a
		break
	}
	return Call{Name: name, Arguments: args}, nil
}

// duplicateKey finds the first key given twice in one object of the valid JSON value v, at any depth,
// and returns its path (name, arguments.x, arguments.q[1].k).
func duplicateKey(v []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var walk func(path string) (string, bool)
	walk = func(path string) (string, bool) {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return "", false
				}
				k, _ := kt.(string)
				kp := k
				if path != "" {
					kp = path + "." + k
				}
				if seen[k] {
					return kp, true
				}
				seen[k] = true
				if p, dup := walk(kp); dup {
					return p, true
				}
			}
			_, _ = dec.Token() // }
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if p, dup := walk(fmt.Sprintf("%s[%d]", path, i)); dup {
					return p, true
				}
			}
			_, _ = dec.Token() // ]
		}
		return "", false
	}
	return walk("")
}

// jsonDetail is a JSON error in words, with the offset where the decoder stopped when it says.
func jsonDetail(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d of the call)", se, se.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "the JSON ends early"
	}
	return err.Error()
}

// FormatFor picks the tool-call format of a model family or chat-template name: Qwen, Qwen2.5,
// Qwen3, QwQ, Hermes and ChatML names (and drmas's built-ins "chatml" and "qwen3") are Hermes;
// Llama 3.x names ("llama3.1", "Llama-3.2-1B-Instruct", "llama3") are Llama3JSON. Case, "-", "_"
// and "." are ignored. An unknown name is an error listing what is known.
func FormatFor(name string) (Format, error) {
	n := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || r == ' ' || r == '/' {
			return -1
		}
		return unicode.ToLower(r)
	}, name)
	switch {
	case strings.Contains(n, "qwen") || strings.Contains(n, "qwq") || strings.Contains(n, "hermes") || n == "chatml":
		return Hermes, nil
	case strings.Contains(n, "llama3"):
		return Llama3JSON, nil
	}
	return "", fmt.Errorf("no tool-call format known for %q: Qwen/Hermes/ChatML names read %s, Llama 3.x names %s", name, Hermes, Llama3JSON)
}

// FormatForTemplate picks the format a chat template's source asks the model for: <tool_call> tags
// are Hermes; Llama 3.1's instruction ({"name": function name, "parameters": …}, or its
// <|python_tag|>) is Llama3JSON. ok is false for a template that names neither.
func FormatForTemplate(source string) (f Format, ok bool) {
	switch {
	case strings.Contains(source, HermesOpen):
		return Hermes, true
	case strings.Contains(source, `"parameters": dictionary of argument name`) || strings.Contains(source, PythonTag):
		return Llama3JSON, true
	}
	return "", false
}

// ToolCalls turns parsed calls into an assistant message's tool_calls ({"id", "type": "function",
// "function": {"name", "arguments"}}, the arguments the object the model wrote), which the chat
// template renders back in the model's format. id gives call i its id (Mistral's templates want
// nine alphanumerics; Qwen's and Llama's read none); nil leaves the ids empty.
func ToolCalls(calls []Call, id func(i int) string) []llm.ToolCall {
	if len(calls) == 0 {
		return nil
	}
	out := make([]llm.ToolCall, len(calls))
	for i, c := range calls {
		out[i] = llm.ToolCall{Type: "function", Function: llm.FunctionCall{Name: c.Name, Arguments: c.Arguments}}
		if id != nil {
			out[i].ID = id(i)
		}
	}
	return out
}

// Message is the assistant message of a parsed response for the next turn's conversation: its
// content and its calls as tool_calls (see ToolCalls).
func (r Result) Message(id func(i int) string) llm.Message {
	return llm.Message{Role: "assistant", Content: r.Content, ToolCalls: ToolCalls(r.Calls, id)}
}

// ResultMessage is the "tool" message that returns content as the result of call.
func ResultMessage(call llm.ToolCall, content string) llm.Message {
	return llm.Message{Role: "tool", Content: content, ToolCallID: call.ID, Name: call.Function.Name}
}
