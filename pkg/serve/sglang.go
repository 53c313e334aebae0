package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"

	"github.com/drmas/drmas/pkg/llm"
)

// maxBody bounds a request body.
const maxBody = 16 << 20

// samplingParams are the request settings drmas serve honours, in SGLang's names (the OpenAI
// handlers fill them from theirs).
type samplingParams struct {
	MaxNewTokens      *int        `json:"max_new_tokens"`
	Temperature       *float64    `json:"temperature"`
	TopP              *float64    `json:"top_p"`
	TopK              *int        `json:"top_k"`
	Stop              stringOrSet `json:"stop"`
	StopTokenIDs      []int       `json:"stop_token_ids"`
	SamplingSeed      *int64      `json:"sampling_seed"`
	NoStopTrim        bool        `json:"no_stop_trim"`
	SkipSpecialTokens *bool       `json:"skip_special_tokens"`
	N                 *int        `json:"n"`
}

// stringOrSet decodes "stop": a string or a list of strings.
type stringOrSet []string

func (s *stringOrSet) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("stop: want a string or a list of strings")
	}
	*s = many
	return nil
}

// toSampling checks the settings and turns them into the policy's, with defaultMax new tokens when
// none is asked; a request without a seed gets a random one.
func (s *Server) toSampling(p samplingParams, defaultMax int) (llm.Sampling, error) {
	out := llm.Sampling{MaxNewTokens: defaultMax, Temperature: 1, Stop: p.Stop}
	if p.MaxNewTokens != nil {
		out.MaxNewTokens = *p.MaxNewTokens
	}
	if p.Temperature != nil {
		out.Temperature = *p.Temperature
	}
	if p.TopP != nil {
		out.TopP = *p.TopP
	}
	if p.TopK != nil && *p.TopK > 0 {
		out.TopK = *p.TopK
	}
	if p.SamplingSeed != nil {
		out.Seed = *p.SamplingSeed
	} else {
		out.Seed = rand.Int64()
	}
	if probs := out.Check(); len(probs) > 0 {
		return out, probs[0]
	}
	if p.N != nil && *p.N != 1 {
		return out, fmt.Errorf("n %d: drmas serve returns one completion per request (send the prompt again with another seed)", *p.N)
	}
	for _, id := range p.StopTokenIDs {
		if !slices.Contains(s.pol.StopIDs, id) {
			return out, fmt.Errorf("stop_token_ids: %d is not one of the model's stop tokens %v (drmas serve stops at those and at stop strings)", id, s.pol.StopIDs)
		}
	}
	return out, nil
}

// checkPrompt rejects token ids outside the vocabulary and prompts that do not fit the model.
func (s *Server) checkPrompt(ids []int, maxNew int) error {
	if len(ids) == 0 {
		return fmt.Errorf("empty prompt")
	}
	s.mu.Lock() // a reload may change the configuration (Server.load)
	vocab, maxPos := s.pol.Model.Config.VocabSize, s.pol.Model.Config.MaxPositionEmbeddings
	s.mu.Unlock()
	for _, id := range ids {
		if id < 0 || id >= vocab {
			return fmt.Errorf("prompt token id %d outside the vocabulary [0, %d)", id, vocab)
		}
	}
	if limit := maxPos; limit > 0 && len(ids)+maxNew > limit {
		return fmt.Errorf("prompt of %d tokens + %d new tokens exceeds the model's %d positions", len(ids), maxNew, limit)
	}
	return nil
}

// responseText decodes a completion's tokens; the final stop token is left out unless keepStop.
func (s *Server) responseText(c llm.Completion, keepStop bool) string {
	ids := c.ResponseIDs
	if n := len(ids); n > 0 && !keepStop && slices.Contains(s.pol.StopIDs, ids[n-1]) {
		ids = ids[:n-1]
	}
	return s.pol.Tok.Decode(ids)
}

// generate is SGLang's native POST /generate for one prompt (text or input_ids).
func (s *Server) generate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Text           *string         `json:"text"`
		InputIDs       json.RawMessage `json:"input_ids"`
		SamplingParams samplingParams  `json:"sampling_params"`
		ReturnLogprob  bool            `json:"return_logprob"`
		Stream         bool            `json:"stream"`
		Rid            string          `json:"rid"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.Stream {
		writeError(w, http.StatusBadRequest, "stream: drmas serve answers in one reply")
		return
	}
	var prompt []int
	switch {
	case req.InputIDs != nil && req.Text != nil:
		writeError(w, http.StatusBadRequest, "give either text or input_ids, not both")
		return
	case req.InputIDs != nil:
		if err := json.Unmarshal(req.InputIDs, &prompt); err != nil {
			writeError(w, http.StatusBadRequest, "input_ids: want one list of token ids (drmas serve takes one prompt per request; send several requests at once, it batches them)")
			return
		}
	case req.Text != nil:
		prompt = s.pol.Tok.Encode(*req.Text)
	default:
		writeError(w, http.StatusBadRequest, "text or input_ids is required")
		return
	}
	sp, err := s.toSampling(req.SamplingParams, 128)
	if err == nil {
		err = s.checkPrompt(prompt, sp.MaxNewTokens)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	comp, err := s.submit(r.Context(), prompt, sp)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	finish := map[string]any{"type": string(comp.Finish)}
	if last := comp.ResponseIDs[len(comp.ResponseIDs)-1]; comp.Finish == llm.FinishStop && slices.Contains(s.pol.StopIDs, last) {
		finish["matched"] = last
	} else if comp.Finish == llm.FinishStop {
		finish["matched"] = matchedStop(s.pol.Tok.Decode(comp.ResponseIDs), sp.Stop)
	}
	s.mu.Lock()
	version := s.version
	s.mu.Unlock()
	meta := map[string]any{"id": req.Rid, "finish_reason": finish, "prompt_tokens": len(prompt),
		"completion_tokens": len(comp.ResponseIDs), "cached_tokens": 0, "weight_version": version}
	if req.ReturnLogprob {
		lps := make([][]any, len(comp.ResponseIDs))
		for j, id := range comp.ResponseIDs {
			lps[j] = []any{comp.LogProbs[j], id, nil}
		}
		meta["output_token_logprobs"] = lps
	}
	writeJSON(w, http.StatusOK, map[string]any{"text": s.responseText(comp, req.SamplingParams.NoStopTrim),
		"output_ids": comp.ResponseIDs, "meta_info": meta})
}

func matchedStop(text string, stops []string) string {
	for _, st := range stops {
		if st != "" && strings.HasSuffix(text, st) {
			return st
		}
	}
	return ""
}

// readJSON decodes a bounded request body; on failure it answers 400 and returns false.
func readJSON(w http.ResponseWriter, r *http.Request, into any) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return false
	}
	if len(body) > maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", maxBody))
		return false
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		body = []byte("{}")
	}
	if err := json.Unmarshal(body, into); err != nil {
		writeError(w, http.StatusBadRequest, "JSON body: "+err.Error())
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers in the OpenAI error shape (SGLang and vLLM clients read it too).
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": http.StatusText(status), "code": status}})
}
