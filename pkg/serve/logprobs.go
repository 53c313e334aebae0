package serve

import (
	"strconv"

	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/policy"
)

// completionLogprobs is OpenAI's legacy logprobs object for tokens toks (text offsets from base).
func (s *Server) completionLogprobs(toks []policy.Token, top int, asIDs bool, base int) map[string]any {
	piece := func(id int) string {
		if asIDs {
			return "token_id:" + strconv.Itoa(id)
		}
		return engine.TokenPiece(s.pol.Tok.DecodeBytes([]int{id}))
	}
	tokens := make([]string, len(toks))
	lps := make([]float32, len(toks))
	offsets := make([]int, len(toks))
	tops := make([]map[string]float32, len(toks))
	at := base
	for j, t := range toks {
		tokens[j], lps[j], offsets[j] = piece(t.ID), t.LogProb, at
		at += len(s.pol.Tok.DecodeBytes([]int{t.ID}))
		m := map[string]float32{}
		for _, a := range t.Top[:min(top, len(t.Top))] {
			m[piece(a.ID)] = a.LogProb
		}
		m[tokens[j]] = t.LogProb
		tops[j] = m
	}
	return map[string]any{"tokens": tokens, "token_logprobs": lps, "text_offset": offsets, "top_logprobs": tops}
}

// chatLogprobs is the chat logprobs object ({"content": [...]}) of toks with top alternatives each.
func (s *Server) chatLogprobs(toks []policy.Token, top int) map[string]any {
	entry := func(id int, lp float32) map[string]any {
		b := s.pol.Tok.DecodeBytes([]int{id})
		bs := make([]int, len(b))
		for k, x := range b {
			bs[k] = int(x)
		}
		return map[string]any{"token": s.pol.Tok.Decode([]int{id}), "logprob": lp, "bytes": bs}
	}
	content := make([]map[string]any, len(toks))
	for j, t := range toks {
		e := entry(t.ID, t.LogProb)
		alts := []map[string]any{}
		for _, a := range t.Top[:min(top, len(t.Top))] {
			alts = append(alts, entry(a.ID, a.LogProb))
		}
		e["top_logprobs"] = alts
		content[j] = e
	}
	return map[string]any{"content": content}
}

// sglangLogprobs are SGLang's output_token_logprobs ([logprob, id, null] per token) and, with top > 0,
// output_top_logprobs (the alternatives of each token in the same shape).
func sglangLogprobs(toks []policy.Token, top int) (lps [][]any, tops []any) {
	lps = make([][]any, len(toks))
	for j, tk := range toks {
		lps[j] = []any{tk.LogProb, tk.ID, nil}
		if top > 0 {
			alts := make([][]any, len(tk.Top))
			for k, a := range tk.Top {
				alts[k] = []any{a.LogProb, a.ID, nil}
			}
			tops = append(tops, alts)
		}
	}
	return lps, tops
}
