package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/serve"
)

func init() { register(newServeCmd) }

type serveFlags struct {
	model, host, dtype, name string
	port, threads, maxBatch  int
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve --model DIR [--host 127.0.0.1] [--port N]",
		Short: "Serve a model over HTTP (SGLang-native and OpenAI-compatible endpoints)",
		Long: `Load a model folder and answer HTTP requests until SIGINT/SIGTERM, batching concurrent
requests. Endpoints:
  POST /generate                  SGLang native: {"input_ids" | "text", "sampling_params", "return_logprob"}
  POST /v1/completions            OpenAI: a prompt string or token-id list (vLLM's return_tokens_as_token_ids too)
  POST /v1/chat/completions       OpenAI chat: messages through the model's chat template
  POST /update_weights_from_disk  SGLang: {"model_path", "weight_version"} reloads weights in place
  POST /collective_rpc            vLLM dev mode: update_config + reload_weights
  GET  /health, /v1/models, /get_model_info, /weight_info
Every request samples from its own seed (sampling_params.sampling_seed or seed), so the same
request gives the same tokens whatever it is batched with, and the same tokens as drmas's local
engine. The bound address is printed to stdout (useful with --port 0). A training points
models[].rollout.urls at it with engine sglang, vllm or openai.`,
		Example: `  drmas serve --model runs/toy-search/step-250/small --port 30000
  curl -s localhost:30000/v1/chat/completions -d '{"messages":[{"role":"user","content":"2+3?"}],"max_tokens":8,"seed":1}'
  curl -s localhost:30000/generate -d '{"input_ids":[60,97,110],"sampling_params":{"max_new_tokens":4,"sampling_seed":7},"return_logprob":true}'
  drmas serve --model ./Qwen2.5-0.5B-Instruct --host 0.0.0.0 --port 8000 --dtype bfloat16 --device cuda:0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.model == "" {
				return badInput(fmt.Errorf("--model is required"))
			}
			if f.port < 0 || f.port > 65535 {
				return badInput(fmt.Errorf("--port %d: want 0-65535 (0 = any free port)", f.port))
			}
			return runServe(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.model, "model", "", "model folder to serve (Hugging Face layout or a drmas checkpoint's model folder)")
	fl.StringVar(&f.host, "host", "127.0.0.1", "address to listen on (0.0.0.0: every interface)")
	fl.IntVar(&f.port, "port", 30000, "port to listen on (0 = any free port; the address is printed)")
	fl.StringVar(&f.dtype, "dtype", "auto", dtypeHelp)
	fl.StringVar(&f.name, "name", "", "model name in /v1/models (default: the folder)")
	fl.IntVar(&f.threads, "threads", 0, "libtorch intra-op threads (0 = one per core)")
	fl.IntVar(&f.maxBatch, "max-batch", 64, "most requests generated together in one batch")
	return cmd
}

func runServe(cmd *cobra.Command, f serveFlags) error {
	dev, dt, err := deviceAndDType(f.dtype)
	if err != nil {
		return badInput(err)
	}
	p, err := loadModelFolder(f.model, dev, dt, f.threads)
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(f.model)
	if err != nil {
		return err
	}
	srv := serve.New(p, abs, serve.Options{Name: f.name, MaxBatch: f.maxBatch})
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := cmd.OutOrStdout()
	return srv.ListenAndServe(ctx, net.JoinHostPort(f.host, strconv.Itoa(f.port)), func(a net.Addr) {
		fmt.Fprintf(out, "http://%s\n", a.String())
	})
}
