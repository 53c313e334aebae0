package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/spf13/cobra"
	"github.com/sugarme/gotch"
)

// generateFlags are the flags of `drmas generate`.
type generateFlags struct {
	model, adapter, prompt, promptIDs, system, dtype string
	templateKwargs                                   string
	raw, json                                        bool
	maxNew, topK                                     int
	temperature, topP                                float64
	seed                                             int64
	stop                                             []string
}

func newGenerateCmd() *cobra.Command {
	var f generateFlags
	cmd := &cobra.Command{
		Use:   "generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)",
		Short: "Generate a completion with a Llama / Qwen2 / Qwen3 model folder",
		Long: `Load a Hugging Face model folder (config.json, model.safetensors or a sharded index,
tokenizer.json, optionally tokenizer_config.json with its chat template) and generate one
completion, as an agent's policy would.

--prompt is sent as a user message (after --system, if given) through the model's chat
template, with the assistant generation prompt; --raw encodes it as it is instead.
--prompt-ids takes token ids as they are. Generation stops at the template's end-of-turn
token or the model's EOS, at a --stop string, or after --max-new-tokens tokens.
Temperature 0 is greedy decoding.

The completion's text goes to stdout; with --json, an object with the prompt and response
ids, the per-token log-probs (log-softmax(logits/T) at the chosen tokens), the text and
why generation finished.`,
		Example: `  drmas generate --model pkg/policy/testdata/toy --prompt "What is 2+3?" --temperature 0 --max-new-tokens 8
  drmas generate --model pkg/policy/testdata/toy --prompt-ids 60,97,110,115,62 --max-new-tokens 8 --json
  drmas generate --model pkg/policy/testdata/toy --system "Answer briefly." --prompt "2+3?" --top-p 0.9 --top-k 20 --seed 7
  drmas generate --model ./Qwen2.5-0.5B-Instruct --prompt "What is 2+3?" --temperature 0   # a Hugging Face folder
  CKPT=$(ls -dv runs/toy-math-lora/step-*[0-9] | tail -1)   # the newest checkpoint of configs/toy-math-lora.yaml
  drmas generate --model $CKPT/toy --adapter $CKPT/solver --prompt "P3+1"   # a LoRA adapter on its base`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			prompt, settings, dev, dt, err := f.parse()
			if err != nil {
				return badInput(err)
			}
			return runGenerate(cmd, f, prompt, settings, dev, dt)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.model, "model", "", "model folder (Hugging Face layout, or a toy folder with config.json, model.safetensors, tokenizer.json)")
	fl.StringVar(&f.adapter, "adapter", "", "a PEFT LoRA adapter folder for --model (a checkpoint's step-N/<adapter id>/): generate with it")
	fl.StringVar(&f.prompt, "prompt", "", "prompt text, sent as a user message through the chat template")
	fl.StringVar(&f.promptIDs, "prompt-ids", "", "prompt as comma-separated token ids (no chat template)")
	fl.StringVar(&f.system, "system", "", "system message before the prompt (with --prompt)")
	fl.BoolVar(&f.raw, "raw", false, "encode --prompt as it is, without the chat template")
	fl.StringVar(&f.templateKwargs, "chat-template-kwargs", "", `extra chat-template variables as a JSON object, e.g. '{"enable_thinking": false}'`)
	fl.IntVar(&f.maxNew, "max-new-tokens", 64, "most tokens to generate")
	fl.Float64Var(&f.temperature, "temperature", 1, "sampling temperature; 0 = greedy")
	fl.Float64Var(&f.topP, "top-p", 1, "nucleus sampling: keep the smallest set of tokens with this much probability (0 or 1 = off)")
	fl.IntVar(&f.topK, "top-k", 0, "keep only the k most likely tokens (0 = off)")
	fl.Int64Var(&f.seed, "seed", 0, "sampling seed")
	fl.StringSliceVar(&f.stop, "stop", nil, "stop strings (repeatable)")
	fl.StringVar(&f.dtype, "dtype", "auto", dtypeHelp)
	fl.BoolVar(&f.json, "json", false, "print the ids, log-probs, text and finish reason as JSON")
	return cmd
}

// parse checks the flags: the prompt ids (nil for a text prompt), the sampling settings, device and
// dtype (gotch.Invalid for auto).
// kwargs reads --chat-template-kwargs (nil when not given).
func (f generateFlags) kwargs() (map[string]any, error) {
	if f.templateKwargs == "" {
		return nil, nil
	}
	var kw map[string]any
	if err := json.Unmarshal([]byte(f.templateKwargs), &kw); err != nil {
		return nil, fmt.Errorf("--chat-template-kwargs: want a JSON object: %w", err)
	}
	return kw, nil
}

func (f generateFlags) parse() ([]int, llm.Sampling, gotch.Device, gotch.DType, error) {
	s := llm.Sampling{Temperature: f.temperature, TopP: f.topP, TopK: f.topK, MaxNewTokens: f.maxNew, Stop: f.stop, Seed: f.seed}
	var errs []error
	if f.model == "" {
		errs = append(errs, errors.New("--model is required"))
	}
	if (f.prompt == "") == (f.promptIDs == "") {
		errs = append(errs, errors.New("give exactly one of --prompt and --prompt-ids"))
	}
	if f.promptIDs != "" && (f.raw || f.system != "") {
		errs = append(errs, errors.New("--raw and --system apply to --prompt, not --prompt-ids"))
	}
	if f.templateKwargs != "" {
		if _, err := f.kwargs(); err != nil {
			errs = append(errs, err)
		}
		if f.raw || f.promptIDs != "" {
			errs = append(errs, errors.New("--chat-template-kwargs applies to --prompt through the chat template, not --raw or --prompt-ids"))
		}
	}
	var ids []int
	if f.promptIDs != "" {
		for _, part := range strings.Split(f.promptIDs, ",") {
			id, err := strconv.Atoi(strings.TrimSpace(part))
			if err != nil || id < 0 {
				errs = append(errs, fmt.Errorf("--prompt-ids: %q is not a token id", part))
				break
			}
			ids = append(ids, id)
		}
	}
	for _, p := range s.Check() { // the same rules as a config's agents and the policy
		errs = append(errs, fmt.Errorf("--%s: %s", strings.ReplaceAll(p.Key, "_", "-"), p.Msg))
	}
	dev, dt, err := deviceAndDType(f.dtype)
	if err != nil {
		errs = append(errs, err)
	}
	return ids, s, dev, dt, errors.Join(errs...)
}

// generateResult is what --json prints.
type generateResult struct {
	PromptIDs   []int      `json:"prompt_ids"`
	ResponseIDs []int      `json:"response_ids"`
	LogProbs    []float32  `json:"logprobs"`
	Text        string     `json:"text"`
	Finish      llm.Finish `json:"finish"`
}

func runGenerate(cmd *cobra.Command, f generateFlags, ids []int, s llm.Sampling, dev gotch.Device, dt gotch.DType) error {
	p, err := loadModelFolder(f.model, dev, dt, 0)
	if err != nil {
		return err
	}
	if f.adapter != "" {
		if p, err = withAdapter(p, f.adapter); err != nil {
			return err
		}
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	var comps []llm.Completion
	switch {
	case ids != nil:
		comps, err = p.GenerateIDs(ctx, [][]int{ids}, []llm.Sampling{s})
	case f.raw:
		comps, err = p.GenerateIDs(ctx, [][]int{p.Tok.Encode(f.prompt)}, []llm.Sampling{s})
	default:
		var msgs []llm.Message
		if f.system != "" {
			msgs = append(msgs, llm.Message{Role: "system", Content: f.system})
		}
		msgs = append(msgs, llm.Message{Role: "user", Content: f.prompt})
		kwargs, _ := f.kwargs() // parse checked it
		comps, err = p.Generate(ctx, []llm.Request{{Agent: "cli", Model: p.ID, Messages: msgs, Sampling: s, ChatTemplateKwargs: kwargs}})
	}
	if errors.Is(err, llm.ErrBadRequest) {
		return badInput(err)
	}
	if err != nil {
		return err // a failure of the model (non-finite logits), not of the input
	}
	c := comps[0]
	out := cmd.OutOrStdout()
	if !f.json {
		_, err := fmt.Fprintln(out, c.Text)
		return err
	}
	return json.NewEncoder(out).Encode(generateResult{PromptIDs: c.PromptIDs, ResponseIDs: c.ResponseIDs, LogProbs: c.LogProbs, Text: c.Text, Finish: c.Finish})
}
