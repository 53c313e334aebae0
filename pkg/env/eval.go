package env

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/rs/zerolog/log"
)

// EvalSet is one dataset to evaluate.
type EvalSet struct {
	Name  string
	Tasks []Task
}

// EvalOptions controls an evaluation.
type EvalOptions struct {
	K           int       // samples per question (default 1)
	Seed        int64     // seeds the samples, as RunOptions.Seed
	BatchSize   int       // questions per orchestra run (default 32); a run plays BatchSize·K episodes
	Transcripts io.Writer // when set, one JSON line per agent call (docs/contracts.md)
	Render      Renderer  // writes each transcript line's rendered_prompt (nil: none)
	// Progress, when set, is called after each orchestra run with the questions done so far and the
	// total over all datasets.
	Progress func(done, total int)
}

// EvalReport is the outcome of an evaluation.
type EvalReport struct {
	K        int             `json:"k"`
	AvgAtK   float64         `json:"avg_at_k"`  // mean of the datasets' avg@k
	PassAtK  float64         `json:"pass_at_k"` // mean of the datasets' pass@k
	Datasets []DatasetReport `json:"datasets"`
	Agents   []AgentStats    `json:"agents"` // over every dataset
}

// DatasetReport holds one dataset's figures. avg@k is the mean over questions of the fraction of
// the k samples that succeeded; pass@k the fraction of questions with at least one success.
type DatasetReport struct {
	Name       string       `json:"name"`
	Questions  int          `json:"questions"`
	AvgAtK     float64      `json:"avg_at_k"`
	PassAtK    float64      `json:"pass_at_k"`
	MeanReward float64      `json:"mean_reward"`
	Agents     []AgentStats `json:"agents"`
}

// Metrics returns the report as metrics.jsonl keys under prefix (e.g. "val"):
// <prefix>/<dataset>/avg@<k>, <prefix>/<dataset>/pass@<k>, <prefix>/avg@<k>, <prefix>/pass@<k>,
// and the per-agent figures of AgentMetrics under <prefix>/.
func (r *EvalReport) Metrics(prefix string) map[string]float64 {
	k := strconv.Itoa(r.K)
	m := AgentMetrics(prefix+"/", r.Agents)
	for _, d := range r.Datasets {
		m[prefix+"/"+d.Name+"/avg@"+k] = d.AvgAtK
		m[prefix+"/"+d.Name+"/pass@"+k] = d.PassAtK
	}
	m[prefix+"/avg@"+k] = r.AvgAtK
	m[prefix+"/pass@"+k] = r.PassAtK
	return m
}

// Evaluate runs an orchestra over each dataset with K samples per question (no curriculum) and
// reports avg@K, pass@K and per-agent figures; training's validation and `drmas eval` both call it.
// An empty dataset is an error.
func Evaluate(ctx context.Context, orch Orchestra, gen llm.Generator, sets []EvalSet, opts EvalOptions) (*EvalReport, error) {
	if opts.K == 0 {
		opts.K = 1
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = 32
	}
	if opts.K < 1 || opts.BatchSize < 1 {
		return nil, fmt.Errorf("eval: k and batch size must be ≥ 1 (got %d, %d)", opts.K, opts.BatchSize)
	}
	if len(sets) == 0 {
		return nil, fmt.Errorf("eval: no datasets")
	}
	rep := &EvalReport{K: opts.K}
	all := newStatsAcc(orch.Agents())
	total, done := 0, 0
	for _, set := range sets {
		total += len(set.Tasks)
	}
	progress := opts.Progress
	opts.Progress = func(n, _ int) {
		if progress != nil {
			progress(done+n, total)
		}
	}
	for _, set := range sets {
		began := time.Now()
		d, err := evalSet(ctx, orch, gen, set, opts, all)
		if err != nil {
			return nil, err
		}
		log.Info().Str("dataset", d.Name).Int("questions", d.Questions).Int("k", opts.K).
			Float64("avg@k", d.AvgAtK).Float64("pass@k", d.PassAtK).Dur("took", time.Since(began)).Msg("eval")
		done += len(set.Tasks)
		rep.Datasets = append(rep.Datasets, d)
		rep.AvgAtK += d.AvgAtK / float64(len(sets))
		rep.PassAtK += d.PassAtK / float64(len(sets))
	}
	rep.Agents = all.result()
	return rep, nil
}

func evalSet(ctx context.Context, orch Orchestra, gen llm.Generator, set EvalSet, opts EvalOptions, all *statsAcc) (DatasetReport, error) {
	d := DatasetReport{Name: set.Name, Questions: len(set.Tasks)}
	if len(set.Tasks) == 0 {
		return d, fmt.Errorf("eval: dataset %q has no questions", set.Name)
	}
	acc := newStatsAcc(orch.Agents())
	wins := make([]int, len(set.Tasks))
	var reward float64
	for b := 0; b < len(set.Tasks); b += opts.BatchSize {
		e := min(b+opts.BatchSize, len(set.Tasks))
		r, err := orch.Run(ctx, gen, set.Tasks[b:e], opts.K, RunOptions{Seed: opts.Seed, Eval: true, TaskOffset: b})
		if err != nil {
			return d, fmt.Errorf("eval %s: %w", set.Name, err)
		}
		for _, t := range r.Trajectories {
			if t.Success {
				wins[b+t.TaskIndex]++
			}
			reward += t.Reward
		}
		acc.add(r.Trajectories)
		all.add(r.Trajectories)
		if opts.Transcripts != nil {
			if err := WriteTranscripts(opts.Transcripts, set.Name, r, opts.Render); err != nil {
				return d, err
			}
		}
		opts.Progress(e, len(set.Tasks))
	}
	for _, w := range wins {
		d.AvgAtK += float64(w) / float64(opts.K)
		d.PassAtK += b2f(w > 0)
	}
	n := float64(len(set.Tasks))
	d.AvgAtK /= n
	d.PassAtK /= n
	d.MeanReward = reward / (n * float64(opts.K))
	d.Agents = acc.result()
	return d, nil
}

// TranscriptLine is one agent call of a transcript (docs/contracts.md); reward and success are the
// trajectory's. uid, traj_uid, agent and score make every line a sample that `drmas advantages` and
// `drmas estimators` read as it is.
type TranscriptLine struct {
	Dataset    string  `json:"dataset"`
	QuestionID string  `json:"question_id"`
	Sample     int     `json:"sample"`
	UID        string  `json:"uid"` // the prompt group
	TrajUID    string  `json:"traj_uid"`
	Turn       int     `json:"turn"`
	Agent      string  `json:"agent"`
	Prompt     string  `json:"prompt"`
	Response   string  `json:"response"`
	Parsed     string  `json:"parsed"` // what the orchestra read from this response (verdict, query, answer)
	Valid      bool    `json:"valid"`
	Reward     float64 `json:"reward"`
	Score      float64 `json:"score"` // the call's score: reward minus its invalid-action penalty (role rewards included)
	Success    bool    `json:"success"`
	// Answer is the trajectory's final answer as extracted for grading ("" when none), and
	// GroundTruth the task's gold answers (any match counts): together they let a reader audit
	// every reward.
	Answer      string   `json:"answer"`
	GroundTruth []string `json:"ground_truth"`
	// What the model saw and wrote: the prompt's and the response's token counts, why generation
	// ended, and the prompt as the model read it (its tokens decoded: the chat template's rendering,
	// special tokens included), beside Prompt, the agent's prompt before the template.
	PromptTokens   int    `json:"prompt_tokens"`
	ResponseTokens int    `json:"response_tokens"`
	Finish         string `json:"finish,omitempty"`
	RenderedPrompt string `json:"rendered_prompt,omitempty"`
	// Tools are the function calls the response made, each with its result or error (a flow step with
	// tools); the next call of the agent read the results as tool messages.
	Tools []ToolUse `json:"tools,omitempty"`
	// Version is the weights version that sampled the response on a serving engine (v<step>, or a
	// LoRA adapter's <id>@<step>.<tag>); absent in-process.
	Version string `json:"weights_version,omitempty"`
	// RoutedExperts are the experts a mixture-of-experts model routed the call's tokens to (the
	// prompt and the response but the last token), as SGLang's meta_info.routed_experts: int32
	// little-endian, base64; RoutedExpertsShape is [tokens, layers, top-k]. Absent for a dense model.
	RoutedExperts      string `json:"routed_experts,omitempty"`
	RoutedExpertsShape []int  `json:"routed_experts_shape,omitempty"`
}

// Renderer decodes a prompt's tokens as the model of the call read them.
type Renderer func(model string, ids []int) string

// WriteTranscripts writes one JSON line per agent call of a rollout, in trajectory then call order;
// render, when set, fills each line's rendered_prompt.
func WriteTranscripts(w io.Writer, dataset string, r *Rollout, render Renderer) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // keep <search> readable
	for _, t := range r.Trajectories {
		var gold []string
		if t.TaskIndex >= 0 && t.TaskIndex < len(r.Tasks) {
			gold = r.Tasks[t.TaskIndex].Answers
		}
		for _, c := range t.Calls {
			line := TranscriptLine{Dataset: dataset, QuestionID: t.TaskID, Sample: t.Sample, UID: t.UID, TrajUID: t.TrajUID,
				Turn: c.Turn, Agent: c.Agent, Prompt: c.Prompt, Response: c.Response, Parsed: c.Parsed, Valid: c.Valid,
				Reward: t.Reward, Score: c.Score, Success: t.Success, Answer: t.Answer, GroundTruth: gold,
				PromptTokens: len(c.PromptIDs), ResponseTokens: len(c.ResponseIDs), Finish: string(c.Finish), Tools: c.Tools, Version: c.Version.String()}
			if render != nil && len(c.PromptIDs) > 0 {
				line.RenderedPrompt = render(c.Model, c.PromptIDs)
			}
			if r := c.Routes; r.Tokens() > 0 {
				line.RoutedExperts, line.RoutedExpertsShape = r.Base64(), []int{r.Tokens(), r.Layers, r.TopK}
			}
			if err := enc.Encode(line); err != nil {
				return fmt.Errorf("write transcript: %w", err)
			}
		}
	}
	return nil
}
