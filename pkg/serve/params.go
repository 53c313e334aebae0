package serve

import (
	"encoding/json"
	"fmt"
)

// unsupportedParams are sampling settings of OpenAI, vLLM and SGLang that drmas serve's sampler
// does not implement. They are read so that a request setting one is refused (400 naming it)
// rather than answered as if it had been honoured; each one's default (what drmas samples with) is
// accepted.
type unsupportedParams struct {
	LogitBias         map[string]float64 `json:"logit_bias"`
	PresencePenalty   *float64           `json:"presence_penalty"`
	FrequencyPenalty  *float64           `json:"frequency_penalty"`
	RepetitionPenalty *float64           `json:"repetition_penalty"`
	MinP              *float64           `json:"min_p"`
	MinTokens         *int               `json:"min_tokens"`     // vLLM
	MinNewTokens      *int               `json:"min_new_tokens"` // SGLang
	IgnoreEOS         *bool              `json:"ignore_eos"`
	BestOf            *int               `json:"best_of"`
	// Constrained decoding: OpenAI's response_format, SGLang's regex, json_schema and ebnf, vLLM's
	// guided_* and structured_outputs. Each is refused unless null (response_format: {"type": "text"}).
	ResponseFormat    json.RawMessage `json:"response_format"`
	Regex             json.RawMessage `json:"regex"`
	JSONSchema        json.RawMessage `json:"json_schema"`
	EBNF              json.RawMessage `json:"ebnf"`
	GuidedJSON        json.RawMessage `json:"guided_json"`
	GuidedRegex       json.RawMessage `json:"guided_regex"`
	GuidedChoice      json.RawMessage `json:"guided_choice"`
	GuidedGrammar     json.RawMessage `json:"guided_grammar"`
	StructuredOutputs json.RawMessage `json:"structured_outputs"`
}

// check refuses a setting other than its default (best_of: n, the completions per prompt); prefix
// is what the request nests them under ("sampling_params." on /generate).
func (u unsupportedParams) check(prefix string, n int) error {
	refuse := func(name string, v any, def string) error {
		return badRequest(prefix+name, "%s%s %v: not supported by drmas serve (its sampler implements temperature, top_p, top_k, stop, stop_token_ids and seed); leave it out or send the default, %s", prefix, name, v, def)
	}
	for tok, b := range u.LogitBias {
		if b != 0 {
			return refuse("logit_bias", fmt.Sprintf("{%q: %g, …}", tok, b), "{} (no bias)")
		}
	}
	for _, f := range []struct {
		name string
		v    *float64
		def  float64
	}{{"presence_penalty", u.PresencePenalty, 0}, {"frequency_penalty", u.FrequencyPenalty, 0},
		{"repetition_penalty", u.RepetitionPenalty, 1}, {"min_p", u.MinP, 0}} {
		if f.v != nil && *f.v != f.def {
			return refuse(f.name, *f.v, fmt.Sprint(f.def))
		}
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"min_tokens", u.MinTokens}, {"min_new_tokens", u.MinNewTokens}} {
		if f.v != nil && *f.v != 0 {
			return refuse(f.name, *f.v, "0")
		}
	}
	if u.IgnoreEOS != nil && *u.IgnoreEOS {
		return refuse("ignore_eos", true, "false")
	}
	if u.BestOf != nil && *u.BestOf != n {
		return refuse("best_of", *u.BestOf, fmt.Sprintf("n (%d): every completion is returned", n))
	}
	if f := u.ResponseFormat; len(f) > 0 && string(f) != "null" {
		var rf struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(f, &rf) != nil || rf.Type != "text" {
			return refuse("response_format", snippet(string(f), 80), `{"type": "text"} (no constraint on the output)`)
		}
	}
	for _, f := range []struct {
		name string
		v    json.RawMessage
	}{{"regex", u.Regex}, {"json_schema", u.JSONSchema}, {"ebnf", u.EBNF}, {"guided_json", u.GuidedJSON},
		{"guided_regex", u.GuidedRegex}, {"guided_choice", u.GuidedChoice}, {"guided_grammar", u.GuidedGrammar},
		{"structured_outputs", u.StructuredOutputs}} {
		if len(f.v) > 0 && string(f.v) != "null" {
			return refuse(f.name, snippet(string(f.v), 80), "null (no constraint on the output)")
		}
	}
	return nil
}

// snippet is s cut to n bytes with "…", for messages that quote a request.
func snippet(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
