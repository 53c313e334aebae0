package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/llm"
)

// result is a parsed reply: the sampled ids, their log-probs, why generation ended and, when asked,
// the experts the tokens were routed to.
type result struct {
	ids    []int
	logps  []float32
	finish llm.Finish
	routes *llm.Routes
}

// genRequest is one completion to sample: the prompt's ids with the sampling settings, on the
// replica's model served (its name) or the LoRA adapter named adapter ("" = the base); stopIDs are
// the stop tokens, pieces maps a token's text to its id (for replies that carry text pieces only);
// routes, for a mixture-of-experts model, asks for the experts every token went to.
type genRequest struct {
	served, adapter string
	prompt          []int
	sampling        llm.Sampling
	stopIDs         []int
	pieces          func(string) (int, bool)
	routes          llm.RouteShape
}

// protocol is one engine's HTTP dialect.
type protocol interface {
	// check asks whether the replica at base is up; it returns the model name it serves ("" if none).
	check(ctx context.Context, hc *http.Client, base string) (string, error)
	// generate samples one completion on the replica at base.
	generate(ctx context.Context, hc *http.Client, base string, g genRequest) (result, error)
	// loadAdapter makes the replica load the PEFT adapter folder dir under name; unloadAdapter
	// drops name.
	loadAdapter(ctx context.Context, hc *http.Client, base, name, dir string) error
	unloadAdapter(ctx context.Context, hc *http.Client, base, name string) error
	// reload makes the replica load the weights in dir and tag them version; it returns the version the
	// replica reports serving afterwards ("" when the engine cannot tell).
	reload(ctx context.Context, hc *http.Client, base, dir, version string) (string, error)
	// version is the weights version the replica reports serving ("" when the engine cannot tell).
	version(ctx context.Context, hc *http.Client, base string) (string, error)
}

// routesReturner is a protocol that answers a mixture-of-experts model's routed experts when
// genRequest.routes asks (SGLang's return_routed_experts).
type routesReturner interface{ returnsRoutes() }

func (sglang) returnsRoutes() {}

func protocolFor(engine string) (protocol, error) {
	if p, ok := protocols[engine]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("rollout engine %q: want one of %s", engine, strings.Join(slices.DeleteFunc(Kinds.Names(), func(k string) bool { return k == Local }), ", "))
}

// topK and topP turn our "0 = off" into the engines' off values.
func topK(k int) int {
	if k <= 0 {
		return -1
	}
	return k
}

func topP(p float64) float64 {
	if p <= 0 || p > 1 {
		return 1
	}
	return p
}

// --- SGLang: POST /generate with input_ids (docs: basic_usage/sampling_params, native_api) ---

type sglang struct{}

// sglangRequest is GenerateReqInput's subset we use.
type sglangRequest struct {
	InputIDs        []int          `json:"input_ids"`
	SamplingParams  sglangSampling `json:"sampling_params"`
	ReturnLogprob   bool           `json:"return_logprob"`
	LogprobStartLen int            `json:"logprob_start_len"`
	Stream          bool           `json:"stream"`
	LoraPath        string         `json:"lora_path,omitempty"` // the adapter's name (recent SGLang)
	// ReturnRoutedExperts asks a mixture-of-experts model's routes (SGLang started with
	// --enable-return-routed-experts; drmas serve always can).
	ReturnRoutedExperts bool `json:"return_routed_experts,omitempty"`
}

type sglangSampling struct {
	MaxNewTokens      int      `json:"max_new_tokens"`
	Temperature       float64  `json:"temperature"`
	TopP              float64  `json:"top_p"`
	TopK              int      `json:"top_k"`
	Stop              []string `json:"stop,omitempty"`
	StopTokenIDs      []int    `json:"stop_token_ids,omitempty"`
	SamplingSeed      int64    `json:"sampling_seed"`
	NoStopTrim        bool     `json:"no_stop_trim"`
	SkipSpecialTokens bool     `json:"skip_special_tokens"`
}

// sglangReply is /generate's answer: meta_info.output_token_logprobs holds [logprob, token_id, text]
// per sampled token, meta_info.finish_reason {"type": "stop"|"length"|"abort", ...}.
type sglangReply struct {
	Text      string `json:"text"`
	OutputIDs []int  `json:"output_ids"`
	MetaInfo  struct {
		FinishReason *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"finish_reason"`
		OutputTokenLogprobs []json.RawMessage `json:"output_token_logprobs"`
		CompletionTokens    *int              `json:"completion_tokens"`
		RoutedExperts       *string           `json:"routed_experts"` // base64 int32 [tokens, layers, top-k]
	} `json:"meta_info"`
}

func (sglang) check(ctx context.Context, hc *http.Client, base string) (string, error) {
	if err := call(ctx, hc, http.MethodGet, base+"/health", nil, nil); err != nil {
		return "", err
	}
	var info struct {
		ModelPath string `json:"model_path"`
	}
	if err := call(ctx, hc, http.MethodGet, base+"/get_model_info", nil, &info); err != nil {
		return "", err
	}
	return info.ModelPath, nil
}

func (sglang) generate(ctx context.Context, hc *http.Client, base string, g genRequest) (result, error) {
	s := g.sampling
	req := sglangRequest{InputIDs: g.prompt, ReturnLogprob: true, LogprobStartLen: -1, LoraPath: g.adapter, SamplingParams: sglangSampling{
		MaxNewTokens: s.MaxNewTokens, Temperature: s.Temperature, TopP: topP(s.TopP), TopK: topK(s.TopK),
		Stop: s.Stop, StopTokenIDs: g.stopIDs, SamplingSeed: s.Seed, NoStopTrim: true}, ReturnRoutedExperts: g.routes.MoE()}
	var rep sglangReply
	url := base + "/generate"
	if err := call(ctx, hc, http.MethodPost, url, req, &rep); err != nil {
		return result{}, err
	}
	res, err := parseSGLang(url, rep)
	if err != nil || !g.routes.MoE() {
		return res, err
	}
	if res.routes, err = sglangRoutes(rep.MetaInfo.RoutedExperts, g.routes, len(g.prompt)+len(res.ids)-1); err != nil {
		return result{}, &ReplyError{URL: url, Detail: err.Error()}
	}
	return res, nil
}

// sglangRoutes reads meta_info.routed_experts: the experts of the n tokens a forward saw (the
// prompt and the response but the last token), or of every token (some versions count the last).
func sglangRoutes(raw *string, shape llm.RouteShape, n int) (*llm.Routes, error) {
	if raw == nil {
		return nil, fmt.Errorf("meta_info.routed_experts is missing (is SGLang started with --enable-return-routed-experts?)")
	}
	r, err := llm.RoutesFromBase64(*raw, shape.Layers, shape.TopK)
	if err != nil {
		return nil, fmt.Errorf("meta_info.%w", err)
	}
	switch r.Tokens() {
	case n:
	case n + 1:
		r.IDs = r.IDs[:n*shape.Layers*shape.TopK]
	default:
		return nil, fmt.Errorf("meta_info.routed_experts covers %d tokens, want %d (the prompt and the response but the last)", r.Tokens(), n)
	}
	return r, nil
}

// parseSGLang reads the sampled ids and log-probs of a /generate reply.
func parseSGLang(url string, rep sglangReply) (result, error) {
	bad := func(format string, args ...any) (result, error) {
		return result{}, &ReplyError{URL: url, Detail: fmt.Sprintf(format, args...)}
	}
	fr := rep.MetaInfo.FinishReason
	if fr == nil {
		return bad("meta_info.finish_reason is missing (a partial or streamed reply?)")
	}
	var res result
	switch fr.Type {
	case "stop":
		res.finish = llm.FinishStop
	case "length":
		res.finish = llm.FinishLength
	case "abort":
		return bad("the engine aborted the request: %s", fr.Message)
	default:
		return bad("meta_info.finish_reason.type %q", fr.Type)
	}
	if rep.MetaInfo.OutputTokenLogprobs == nil {
		return bad("meta_info.output_token_logprobs is missing (was return_logprob honoured?)")
	}
	for j, raw := range rep.MetaInfo.OutputTokenLogprobs {
		var item []json.RawMessage
		if err := json.Unmarshal(raw, &item); err != nil || len(item) < 2 {
			return bad("output_token_logprobs[%d] = %s: want [logprob, token_id, text]", j, raw)
		}
		var lp *float64
		var id *int
		if json.Unmarshal(item[0], &lp) != nil || lp == nil {
			return bad("output_token_logprobs[%d]: log-prob %s is not a number", j, item[0])
		}
		if json.Unmarshal(item[1], &id) != nil || id == nil {
			return bad("output_token_logprobs[%d]: token id %s is not an integer", j, item[1])
		}
		res.ids = append(res.ids, *id)
		res.logps = append(res.logps, float32(*lp))
	}
	// output_ids ends with the sampled ids (some versions put more ids before them).
	if n, m := len(rep.OutputIDs), len(res.ids); rep.OutputIDs != nil && (n < m || !equalInts(rep.OutputIDs[n-m:], res.ids)) {
		return bad("output_ids %v do not end with the ids of output_token_logprobs %v", rep.OutputIDs, res.ids)
	}
	if n := rep.MetaInfo.CompletionTokens; n != nil && *n != len(res.ids) {
		return bad("completion_tokens %d but %d sampled tokens came back", *n, len(res.ids))
	}
	return res, nil
}

func (sglang) reload(ctx context.Context, hc *http.Client, base, dir, version string) (string, error) {
	return reloadFromDisk(ctx, hc, base, dir, version)
}

func (sglang) version(ctx context.Context, hc *http.Client, base string) (string, error) {
	return reportedVersion(ctx, hc, base+"/get_model_info")
}

// reportedVersion reads "weight_version" from a GET of url: "" when the reply has none or the
// endpoint does not exist (an engine that keeps no version).
func reportedVersion(ctx context.Context, hc *http.Client, url string) (string, error) {
	var info struct {
		WeightVersion *string `json:"weight_version"`
	}
	if err := call(ctx, hc, http.MethodGet, url, nil, &info); err != nil {
		var bad *badRequestError
		if asBad(err, &bad) && bad.status == http.StatusNotFound {
			return "", nil
		}
		return "", err
	}
	if info.WeightVersion == nil {
		return "", nil
	}
	return *info.WeightVersion, nil
}

// loadAdapter is SGLang's POST /load_lora_adapter {"lora_name", "lora_path"} → {"success",
// "error_message", "loaded_adapters"} (the server needs --enable-lora, and --max-loaded-loras room).
func (sglang) loadAdapter(ctx context.Context, hc *http.Client, base, name, dir string) error {
	return sglangLoRAUpdate(ctx, hc, base+"/load_lora_adapter", map[string]any{"lora_name": name, "lora_path": dir}, name)
}

// unloadAdapter is SGLang's POST /unload_lora_adapter {"lora_name"}.
func (sglang) unloadAdapter(ctx context.Context, hc *http.Client, base, name string) error {
	return sglangLoRAUpdate(ctx, hc, base+"/unload_lora_adapter", map[string]any{"lora_name": name}, name)
}

func sglangLoRAUpdate(ctx context.Context, hc *http.Client, url string, body map[string]any, name string) error {
	var rep struct {
		Success      *bool   `json:"success"`
		ErrorMessage *string `json:"error_message"`
	}
	if err := call(ctx, hc, http.MethodPost, url, body, &rep); err != nil {
		return fmt.Errorf("LoRA adapter %s (is the server started with --enable-lora?): %w", name, err)
	}
	if rep.Success == nil {
		return &ReplyError{URL: url, Detail: "no \"success\" field"}
	}
	if !*rep.Success {
		msg := "no error_message"
		if rep.ErrorMessage != nil {
			msg = *rep.ErrorMessage
		}
		return fmt.Errorf("%s: LoRA adapter %s: %s", url, name, msg)
	}
	return nil
}

// reloadFromDisk is SGLang's POST /update_weights_from_disk {"model_path", "weight_version"} →
// {"success", "message"}, then GET /get_model_info for the weight_version now served.
func reloadFromDisk(ctx context.Context, hc *http.Client, base, dir, version string) (string, error) {
	var rep struct {
		Success *bool  `json:"success"`
		Message string `json:"message"`
	}
	url := base + "/update_weights_from_disk"
	if err := call(ctx, hc, http.MethodPost, url, map[string]any{"model_path": dir, "weight_version": version}, &rep); err != nil {
		return "", err
	}
	if rep.Success == nil {
		return "", &ReplyError{URL: url, Detail: "no \"success\" field"}
	}
	if !*rep.Success {
		return "", fmt.Errorf("%s could not load %s: %s", url, dir, rep.Message)
	}
	var info struct {
		WeightVersion *string `json:"weight_version"`
	}
	if err := call(ctx, hc, http.MethodGet, base+"/get_model_info", nil, &info); err != nil {
		return "", err
	}
	if info.WeightVersion == nil {
		return "", nil
	}
	return *info.WeightVersion, nil
}

func asBad(err error, target **badRequestError) bool {
	b, ok := err.(*badRequestError)
	if ok {
		*target = b
	}
	return ok
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
