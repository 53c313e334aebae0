package toy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/drmas/drmas/pkg/env"
)

// FormatPolicy is a format-aware random policy: every response has the right tags, with content
// drawn at random from the role's own alphabet (a digit for the solver and the answerer, a key for
// the searcher, a verdict for the verifiers). It stands in for a model that has learned the format
// but not the task: it makes the warm-up demonstrations and measures chance rates.
//
// With probability Noise the content token is drawn from the whole toy vocabulary instead, as an
// under-trained model might; a verifier then usually emits no verdict (an invalid call), while a
// searcher or answerer still emits a well-formed, if useless, query or answer.
//
// An agent offered function tools (a flow step with tools) first calls the first of them in the
// Hermes format with a random key, then answers once the result is back.
type FormatPolicy struct {
	Config Config
	Noise  float64
}

// noiseVocab is what a noisy content token is drawn from.
var noiseVocab = func() []string {
	var v []string
	for _, r := range Alphabet {
		v = append(v, string(r))
	}
	return append(v, env.Verdicts()...)
}()

// Generate answers each request from its Sampling.Seed, so reruns repeat.
func (p FormatPolicy) Generate(ctx context.Context, reqs []llm.Request) ([]llm.Completion, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]llm.Completion, len(reqs))
	for i, r := range reqs {
		rng := rand.New(rand.NewPCG(uint64(r.Sampling.Seed), 0x70f))
		pick := func(alphabet []string) string {
			if rng.Float64() < p.Noise {
				return noiseVocab[rng.IntN(len(noiseVocab))]
			}
			return alphabet[rng.IntN(len(alphabet))]
		}
		var text string
		tool := toolName(r)
		switch {
		case tool != "" && r.Messages[len(r.Messages)-1].Role != "tool": // a function tool: call it first
			text = `<tool_call>{"name": "` + tool + `", "arguments": {"key": "` + pick(keys(p.Config.Keys)) + `"}}</tool_call>`
		case p.Config.Task == Math && r.Agent == "solver":
			text = env.TagBoxedOpen + pick(digits(p.Config.Modulus)) + "}"
		case p.Config.Task == Math && (r.Agent == "verifier" || r.Agent == "helper"):
			text = env.TagVerifyOpen + pick([]string{env.VerdictApprove, env.VerdictReject}) + env.TagVerifyClose
		case p.Config.Task == Search && r.Agent == "verifier":
			text = env.TagVerifyOpen + pick([]string{env.VerdictYes, env.VerdictNo}) + env.TagVerifyClose
		case p.Config.Task == Search && r.Agent == "searcher":
			text = env.TagSearchOpen + pick(keys(p.Config.Keys)) + env.TagSearchClose
		case p.Config.Task == Search && r.Agent == "answerer":
			text = env.TagAnswerOpen + pick(digits(p.Config.Values)) + env.TagAnswerClose
		default:
			return nil, fmt.Errorf("toy format policy: no format for agent %q of %q", r.Agent, p.Config.Task)
		}
		out[i] = llm.Completion{Text: text, Finish: llm.FinishStop}
	}
	return out, nil
}

// toolName is the first function tool a request offers ("" when none): a toy agent with tools calls
// it (with a random key, as the lookup tool takes) before it answers.
func toolName(r llm.Request) string {
	specs, _ := r.ChatTemplateKwargs["tools"].([]map[string]any)
	if len(specs) == 0 {
		return ""
	}
	fn, _ := specs[0]["function"].(map[string]any)
	name, _ := fn["name"].(string)
	return name
}

func digits(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = Key(i)
	}
	return out
}

// Demos makes format demonstrations for the supervised warm-up (docs/toy-tasks.md): it runs the
// orchestra with a noiseless FormatPolicy over tasks, n samples each, twice: at training iteration 0
// (so the contexts include the curriculum's injected facts and forced searches) and without the
// curriculum (the contexts of evaluation and of a run after the curriculum has ended, such as the
// Verifier's first turn on a bare question). Every call is a demonstration: the exact messages the
// agent saw and a correct-format response with random content. Every agent the orchestra calls gets
// demonstrations in proportion to its call rate.
func Demos(ctx context.Context, orch env.Orchestra, c Config, tasks []env.Task, n int, seed int64) ([]env.Demo, error) {
	var out []env.Demo
	for _, eval := range []bool{false, true} {
		r, err := orch.Run(ctx, FormatPolicy{Config: c}, tasks, n, env.RunOptions{Seed: seed, Eval: eval})
		if err != nil {
			return nil, fmt.Errorf("toy demos: %w", err)
		}
		out = append(out, env.Demos(r)...)
	}
	return out, nil
}
