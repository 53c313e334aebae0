// Package mathrunner is the math orchestra with toy prompts (pkg/env math.go, prompts: toy) played as
// a gateway runner: the same calls, in the same order, with the same prompts, parsed and scored as
// the built-in orchestra does. Solver "P<question><its earlier answers>" → \boxed{answer}; Verifier
// "C<question><the answer>" → <verify>approve|reject</verify>; on reject the Solver tries again, up to
// MaxLoop Solver calls, and the Verifier does not run after the last. The reward is 1 when the last
// \boxed{} equals a gold answer. Each call's note says whether it was well formed and its role
// reward (the Solver: its answer is right; the Verifier: its verdict matched the truth).
//
// It exists to show that a team trained through the gateway trains exactly as the same team built
// into drmas (docs/gateway.md "Equivalence"): scripts/mathrunner serves it, and the tests compare
// the two token for token.
package mathrunner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/env/answer"
)

// Runner plays math episodes. Its zero value is ready (MaxLoop 2, as orchestra.max_loop_num).
type Runner struct {
	MaxLoop int
	Client  *http.Client // nil: a client of its own
}

// Episode is the part of drmas's POST /run body the runner reads.
type Episode struct {
	Task    json.RawMessage `json:"task"`
	BaseURL string          `json:"base_url"`
	APIKey  string          `json:"api_key"`
}

// Note is the runner's word on one call.
type Note struct {
	Valid      bool    `json:"valid"`
	RoleReward float64 `json:"role_reward"`
}

// Reply is the runner's answer.
type Reply struct {
	Reward  float64 `json:"reward"`
	Success bool    `json:"success"`
	Calls   []Note  `json:"calls"`
}

// task is the task as the runner reads it: a toy task ({id, question, answers}) or a data record with
// question and answer or answers.
type task struct {
	Question string          `json:"question"`
	Answers  []string        `json:"answers"`
	Answer   json.RawMessage `json:"answer"`
}

// golds are the task's gold answers.
func (t task) golds() []string {
	if len(t.Answers) > 0 {
		return t.Answers
	}
	var s string
	if json.Unmarshal(t.Answer, &s) == nil {
		return []string{s}
	}
	if a := strings.TrimSpace(string(t.Answer)); a != "" && a != "null" {
		return []string{a}
	}
	return nil
}

var verdict = env.TagParser("verify", env.VerdictApprove, env.VerdictReject)

// Play plays one episode.
func (r Runner) Play(ctx context.Context, ep Episode) (Reply, error) {
	var t task
	if err := json.Unmarshal(ep.Task, &t); err != nil {
		return Reply{}, fmt.Errorf("task: %w", err)
	}
	maxLoop := r.MaxLoop
	if maxLoop <= 0 {
		maxLoop = 2
	}
	var out Reply
	history, correct := "", false
	for loop := 1; ; loop++ {
		response, err := r.chat(ctx, ep, "solver", "P"+t.Question+history)
		if err != nil {
			return Reply{}, err
		}
		parsed, valid := env.BoxedParser(response)
		correct = valid && match(parsed, t.golds())
		out.Calls = append(out.Calls, Note{Valid: valid, RoleReward: b2f(correct)})
		history += response // the toy context: the Solver's answers, the verdicts left out
		if loop == maxLoop {
			break
		}
		check, err := r.chat(ctx, ep, "verifier", "C"+t.Question+response)
		if err != nil {
			return Reply{}, err
		}
		v, ok := verdict(check)
		approve := !ok || v == env.VerdictApprove // an unparseable verdict approves
		out.Calls = append(out.Calls, Note{Valid: ok, RoleReward: b2f(ok && approve == correct)})
		if approve {
			break
		}
	}
	out.Reward, out.Success = b2f(correct), correct
	return out, nil
}

func match(pred string, golds []string) bool {
	for _, g := range golds {
		if answer.MathEqual(pred, g) {
			return true
		}
	}
	return false
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// chat is one call of an agent at the episode's endpoint: the prompt as one user message, the
// agent's own sampling (nothing sent); it returns the answer's text.
func (r Runner) chat(ctx context.Context, ep Episode, agent, prompt string) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": agent, "messages": []map[string]string{{"role": "user", "content": prompt}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.BaseURL+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+ep.APIKey)
	hc := r.Client
	if hc == nil {
		hc = client
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s: %w", agent, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", fmt.Errorf("%s: %w", agent, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: HTTP %d: %.300s", agent, resp.StatusCode, b)
	}
	var cr struct {
		Choices []struct {
			Message struct {
				Content *string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &cr); err != nil || len(cr.Choices) != 1 {
		return "", fmt.Errorf("%s: unreadable answer %.300s", agent, b)
	}
	if c := cr.Choices[0].Message.Content; c != nil {
		return *c, nil
	}
	return "", nil
}

// client is shared by runners without one: many episodes at once, to one loopback endpoint.
var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 10 * time.Minute}

// ServeHTTP answers POST /run with the episode's Reply (500 naming why when it could not be played).
func (r Runner) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/run" {
		http.NotFound(w, req)
		return
	}
	var ep Episode
	if err := json.NewDecoder(io.LimitReader(req.Body, 64<<20)).Decode(&ep); err != nil {
		http.Error(w, "the episode is not JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	reply, err := r.Play(req.Context(), ep)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, context.Canceled) {
			status = http.StatusServiceUnavailable
		}
		http.Error(w, err.Error(), status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(reply)
}
