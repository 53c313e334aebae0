package serve

import (
	"errors"
	"net/http"
	"slices"

	"github.com/drmas/drmas/pkg/llm"
)

// result is a request's choices as they arrive.
type result struct {
	texts  []*choiceText
	comps  []llm.Completion
	ended  []bool
	sentLP []int // tokens whose log-probs were streamed, per choice
}

// collect runs choices and follows their tokens until every one has ended; each time events arrive
// it calls step (nil: none) with the choices they touched, in order, and which of them ended.
func (s *Server) collect(r *http.Request, choices []choice, topt textOptions, step func(res *result, touched []int, ended map[int]bool) error) (*result, error) {
	res := &result{texts: make([]*choiceText, len(choices)), comps: make([]llm.Completion, len(choices)),
		ended: make([]bool, len(choices)), sentLP: make([]int, len(choices))}
	for i := range choices {
		res.texts[i] = newChoiceText(s.pol.Tok, s.pol.StopIDs, topt)
	}
	st, err := s.start(r.Context(), choices)
	if err != nil {
		return nil, err
	}
	left := len(choices)
	for left > 0 {
		evs, err := st.next(r.Context())
		if err != nil {
			return nil, err
		}
		var touched []int
		ended := map[int]bool{}
		seen := map[int]bool{}
		for _, e := range evs {
			if !seen[e.choice] {
				seen[e.choice] = true
				touched = append(touched, e.choice)
			}
			if !e.end {
				res.texts[e.choice].add(e.tok)
				continue
			}
			if e.err != nil {
				if errors.Is(e.err, llm.ErrBadRequest) {
					return nil, badRequest("", "%v", e.err)
				}
				return nil, e.err
			}
			res.comps[e.choice], res.ended[e.choice] = e.comp, true
			ended[e.choice] = true
			left--
		}
		if step != nil {
			slices.Sort(touched)
			if err := step(res, touched, ended); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}

// usage counts each prompt once and every choice's tokens.
func usage(prompts [][]int, res *result) map[string]int {
	p, c := 0, 0
	for _, pr := range prompts {
		p += len(pr)
	}
	for _, t := range res.texts {
		c += len(t.toks)
	}
	return map[string]int{"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
}
