package engine

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/drmas/drmas/pkg/llm"
)

// openaiProto is the protocol of vLLM and of plain OpenAI servers: POST /v1/completions with a
// token-id prompt (vLLM's extra sampling parameters when vllm).
type openaiProto struct{ vllm bool }

// completionRequest is the OpenAI completions request; the fields after Logprobs are vLLM's extra
// sampling parameters (sent only to vLLM).
type completionRequest struct {
	Model       string   `json:"model,omitempty"`
	Prompt      []int    `json:"prompt"`
	MaxTokens   int      `json:"max_tokens"`
	Temperature float64  `json:"temperature"`
	TopP        float64  `json:"top_p"`
	Seed        int64    `json:"seed"`
	Stop        []string `json:"stop,omitempty"`
	Logprobs    int      `json:"logprobs"`
	N           int      `json:"n"`

	TopK                   *int  `json:"top_k,omitempty"`
	StopTokenIDs           []int `json:"stop_token_ids,omitempty"`
	ReturnTokensAsTokenIDs *bool `json:"return_tokens_as_token_ids,omitempty"`
	IncludeStopStrInOutput *bool `json:"include_stop_str_in_output,omitempty"`
	SkipSpecialTokens      *bool `json:"skip_special_tokens,omitempty"`
}

// completionReply is the OpenAI completions answer. TokenIDs is vLLM's (and drmas serve's) optional
// per-choice list of sampled ids.
type completionReply struct {
	Choices []struct {
		Text     string `json:"text"`
		TokenIDs []int  `json:"token_ids"`
		Logprobs *struct {
			Tokens        []string   `json:"tokens"`
			TokenLogprobs []*float64 `json:"token_logprobs"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

func (o openaiProto) check(ctx context.Context, hc *http.Client, base string) (string, error) {
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	url := base + "/v1/models"
	if err := call(ctx, hc, http.MethodGet, url, nil, &models); err != nil {
		return "", err
	}
	if len(models.Data) == 0 || models.Data[0].ID == "" {
		return "", &ReplyError{URL: url, Detail: "no model listed"}
	}
	return models.Data[0].ID, nil
}

func (o openaiProto) generate(ctx context.Context, hc *http.Client, base string, g genRequest) (result, error) {
	served, s, pieces := g.served, g.sampling, g.pieces
	if g.adapter != "" {
		served = g.adapter // vLLM: an adapter is addressed as a model of its own
	}
	req := completionRequest{Model: served, Prompt: g.prompt, MaxTokens: s.MaxNewTokens, Temperature: s.Temperature,
		TopP: topP(s.TopP), Seed: s.Seed, Stop: s.Stop, Logprobs: 1, N: 1}
	if o.vllm {
		k, yes, no := topK(s.TopK), true, false
		req.TopK, req.StopTokenIDs = &k, g.stopIDs
		req.ReturnTokensAsTokenIDs, req.IncludeStopStrInOutput, req.SkipSpecialTokens = &yes, &yes, &no
	}
	var rep completionReply
	url := base + "/v1/completions"
	if err := call(ctx, hc, http.MethodPost, url, req, &rep); err != nil {
		return result{}, err
	}
	if o.vllm {
		pieces = nil // asked for token ids: text pieces would mean the flag was ignored
	}
	return parseCompletion(url, rep, pieces)
}

// parseCompletion reads ids and log-probs from a completions reply: ids from choices[0].token_ids
// when present, else from logprobs.tokens written as "token_id:N" (vLLM's
// return_tokens_as_token_ids), else by looking each token's text up in pieces (plain OpenAI servers
// return text pieces only; nil pieces = not allowed).
func parseCompletion(url string, rep completionReply, pieces func(string) (int, bool)) (result, error) {
	bad := func(format string, args ...any) (result, error) {
		return result{}, &ReplyError{URL: url, Detail: fmt.Sprintf(format, args...)}
	}
	if len(rep.Choices) != 1 {
		return bad("%d choices, want 1", len(rep.Choices))
	}
	ch := rep.Choices[0]
	var res result
	switch fr := ch.FinishReason; {
	case fr == nil:
		return bad("choices[0].finish_reason is missing (a partial or streamed reply?)")
	case *fr == "stop":
		res.finish = llm.FinishStop
	case *fr == "length":
		res.finish = llm.FinishLength
	default:
		return bad("choices[0].finish_reason %q", *fr)
	}
	if ch.Logprobs == nil || ch.Logprobs.TokenLogprobs == nil {
		return bad("choices[0].logprobs is missing (was logprobs honoured?)")
	}
	for j, lp := range ch.Logprobs.TokenLogprobs {
		if lp == nil {
			return bad("choices[0].logprobs.token_logprobs[%d] is null", j)
		}
		res.logps = append(res.logps, float32(*lp))
	}
	switch {
	case ch.TokenIDs != nil:
		res.ids = ch.TokenIDs
	default:
		toks := ch.Logprobs.Tokens
		if len(toks) != len(res.logps) {
			return bad("%d tokens for %d log-probs", len(toks), len(res.logps))
		}
		for j, tok := range toks {
			if rest, ok := strings.CutPrefix(tok, "token_id:"); ok {
				id, err := strconv.Atoi(rest)
				if err != nil {
					return bad("logprobs.tokens[%d] %q: not token_id:<int>", j, tok)
				}
				res.ids = append(res.ids, id)
				continue
			}
			if pieces == nil {
				return bad("logprobs.tokens[%d] %q is text, not token_id:<int> (was return_tokens_as_token_ids honoured?)", j, tok)
			}
			id, ok := pieces(tok)
			if !ok {
				return bad("logprobs.tokens[%d] %q is no single token of the tokenizer: use an engine that returns token ids (sglang, vllm, drmas serve)", j, tok)
			}
			res.ids = append(res.ids, id)
		}
	}
	if len(res.ids) != len(res.logps) {
		return bad("%d token ids for %d log-probs", len(res.ids), len(res.logps))
	}
	return res, nil
}

// reload: vLLM (VLLM_SERVER_DEV_MODE=1) points its model config at dir and reloads the weights in
// place through /collective_rpc, drops its prefix cache and records the version; a plain
// OpenAI-compatible server reloads as SGLang does (drmas serve speaks both).
func (o openaiProto) reload(ctx context.Context, hc *http.Client, base, dir, version string) (string, error) {
	if !o.vllm {
		return reloadFromDisk(ctx, hc, base, dir, version)
	}
	steps := []struct {
		path string
		body any
	}{
		{"/collective_rpc", map[string]any{"method": "update_config", "kwargs": map[string]any{"overrides": map[string]any{"model_config": map[string]any{"model": dir}}}}},
		{"/collective_rpc", map[string]any{"method": "reload_weights"}},
		{"/reset_prefix_cache", nil},
	}
	for _, st := range steps {
		if err := call(ctx, hc, http.MethodPost, base+st.path, st.body, nil); err != nil {
			return "", fmt.Errorf("reload %s (is the server started with VLLM_SERVER_DEV_MODE=1?): %w", dir, err)
		}
	}
	// Newer vLLM keeps a weight version: set it and read it back. Older ones have no such endpoint.
	if err := call(ctx, hc, http.MethodPost, base+"/update_weight_version", map[string]any{"new_version": version}, nil); err != nil {
		var bad *badRequestError
		if asBad(err, &bad) && bad.status == http.StatusNotFound {
			return "", nil
		}
		return "", err
	}
	var info struct {
		WeightVersion *string `json:"weight_version"`
	}
	if err := call(ctx, hc, http.MethodGet, base+"/weight_info", nil, &info); err != nil || info.WeightVersion == nil {
		return "", err
	}
	return *info.WeightVersion, nil
}

// version: vLLM's GET /weight_info (newer vLLM); a plain OpenAI-compatible server's as SGLang's.
func (o openaiProto) version(ctx context.Context, hc *http.Client, base string) (string, error) {
	if o.vllm {
		return reportedVersion(ctx, hc, base+"/weight_info")
	}
	return reportedVersion(ctx, hc, base+"/get_model_info")
}

// loadAdapter is vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path"} (a plain-text
// "Success: ..." reply; the server needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).
// Plain OpenAI servers that load adapters (drmas serve) speak it too.
func (o openaiProto) loadAdapter(ctx context.Context, hc *http.Client, base, name, dir string) error {
	if err := call(ctx, hc, http.MethodPost, base+"/v1/load_lora_adapter", map[string]any{"lora_name": name, "lora_path": dir}, nil); err != nil {
		return fmt.Errorf("LoRA adapter %s (is the server started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?): %w", name, err)
	}
	return nil
}

// unloadAdapter is vLLM's POST /v1/unload_lora_adapter {"lora_name"}.
func (o openaiProto) unloadAdapter(ctx context.Context, hc *http.Client, base, name string) error {
	if err := call(ctx, hc, http.MethodPost, base+"/v1/unload_lora_adapter", map[string]any{"lora_name": name}, nil); err != nil {
		return fmt.Errorf("LoRA adapter %s: %w", name, err)
	}
	return nil
}
