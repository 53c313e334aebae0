package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/serve"
)

type serveFlags struct {
	model, host, dtype, name string
	port, threads, maxBatch  int

	apiKey, weightsRoot      string
	weightUpdates            bool
	continuous               bool
	kvTokens                 int64
	readTimeout, idleTimeout time.Duration
	headerTimeout            time.Duration
	maxConns, maxInflightMB  int
	maxConnsPerClient        int
	loras                    []string // NAME=PATH
	maxLoRAs                 int
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:     "serve --model DIR [--host 127.0.0.1] [--port N]",
		Short:   "Serve a model over HTTP (SGLang-native and OpenAI-compatible endpoints)",
		Long:    serveLong,
		Example: serveExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.validate(); err != nil {
				return err
			}
			return runServe(cmd, f)
		},
	}
	f.bind(cmd)
	return cmd
}

// serveLong is the help of drmas serve: the endpoints, the lock-down, LoRA adapters and the limits.
const serveLong = `Load a model folder and answer HTTP requests until SIGINT/SIGTERM, batching concurrent
requests (streamed or not). Endpoints:
  POST /v1/chat/completions       OpenAI chat: messages through the model's chat template; stream,
                                  stream_options.include_usage, n, logprobs + top_logprobs, stop
  POST /v1/completions            OpenAI: a prompt string, a list of them, token ids; stream, n,
                                  logprobs (top alternatives), stop; vLLM's return_tokens_as_token_ids,
                                  return_token_ids, include_stop_str_in_output, skip_special_tokens
  POST /generate                  SGLang native: {"input_ids" | "text", "sampling_params",
                                  "return_logprob", "top_logprobs_num", "stream"}
  GET  /v1/models, /v1/models/{id}, /get_model_info, /weight_info, /health
  POST /update_weights_from_disk  SGLang: {"model_path", "weight_version"} reloads weights in place
  POST /collective_rpc            vLLM dev mode: update_config + reload_weights
  POST /update_weight_version     SGLang: sets the reported weight version
  POST /v1/load_lora_adapter      vLLM: {"lora_name", "lora_path"} loads a PEFT adapter folder
  POST /v1/unload_lora_adapter    vLLM: {"lora_name"}
  POST /load_lora_adapter         SGLang: {"lora_name", "lora_path"}; /unload_lora_adapter {"lora_name"}
The update and load endpoints change what is served: they answer 403 unless
--enable-weight-updates is given, and then load only from folders under --weights-root (a
training's run folder).

LoRA adapters: --lora NAME=DIR (repeatable) serves the PEFT adapter folder DIR under NAME from
start-up; at most --max-loras adapters are held at once. A request runs on an adapter when its
OpenAI "model" is the adapter's name, or its /generate "lora_path" is; rows on different adapters
and on the base share batches. /v1/models lists the adapters with the base as "parent". An adapter
unloaded while requests run on it is freed when they end.

Access: with --api-key (or the environment variable DRMAS_API_KEY) every endpoint but /health needs
"Authorization: Bearer <key>" (what OpenAI clients send with apiKey); without one, anyone who can
reach the port can use the model, so the default address is 127.0.0.1 and serving on another one
without a key prints a warning. A training sends the key with models[].rollout.api_key.

Errors come in OpenAI's shape ({"error": {"message", "type", "param", "code"}}); an unknown model
is a 404. Stop strings are removed from the text (include_stop_str_in_output / no_stop_trim keep
them) and matched across token boundaries; the end-of-turn token never appears in the text.
Every request samples from its own seed (seed / sampling_params.sampling_seed; choice k of n uses
seed+k), so the same request gives the same tokens whatever it is batched with, and the same tokens
as drmas's local engine. Slow clients are cut by --header-timeout / --read-timeout, idle
keep-alive connections by --idle-timeout, and at most --max-conns connections are open at once
(at most --max-conns-per-client from one address; a refusal before a request's work begins, such
as a 401 without the key, closes its connection; /health answers even with every slot taken).
The bound address is printed to stdout (useful with --port 0). A training points
models[].rollout.urls at it with engine sglang, vllm or openai.`

// serveExample is the Example text of drmas serve.
const serveExample = `  drmas serve --model pkg/policy/testdata/toy --port 30000
  drmas serve --model $(ls -dv runs/toy-search/step-*[0-9] | tail -1)/small --port 30000   # a checkpoint's model
  curl -s localhost:30000/v1/chat/completions -d '{"messages":[{"role":"user","content":"2+3?"}],"max_tokens":8,"seed":1}'
  curl -sN localhost:30000/v1/chat/completions -d '{"messages":[{"role":"user","content":"2+3?"}],"stream":true,"stream_options":{"include_usage":true}}'
  curl -s localhost:30000/v1/completions -d '{"prompt":["1+1=","2+2="],"n":2,"seed":3,"logprobs":3,"stop":["\n"],"max_tokens":8}'
  curl -s localhost:30000/generate -d '{"input_ids":[60,97,110],"sampling_params":{"max_new_tokens":4,"sampling_seed":7},"return_logprob":true}'
  # on the network: a key (clients send it as a Bearer token)
  export DRMAS_API_KEY=$(openssl rand -hex 16)
  drmas serve --model ./Qwen2.5-0.5B-Instruct --host 0.0.0.0 --port 8000 --dtype bfloat16 --device cuda:0
  curl -s http://HOST:8000/v1/models -H "Authorization: Bearer $DRMAS_API_KEY"
  # a training's replica: reloads allowed from the run's folder only
  drmas serve --model ./start --api-key "$KEY" --enable-weight-updates --weights-root runs/my-run
  # LoRA adapters: one from start-up, more at run time (vLLM's or SGLang's endpoints)
  drmas serve --model ./base --lora solver=./solver-adapter --enable-weight-updates --weights-root runs/lora
  curl -s localhost:30000/v1/load_lora_adapter -d '{"lora_name":"verifier@7","lora_path":"runs/lora/step-7/verifier"}'
  curl -s localhost:30000/v1/completions -d '{"model":"solver","prompt":"1+1=","max_tokens":8}'
  curl -s localhost:30000/generate -d '{"text":"1+1=","lora_path":"verifier@7","sampling_params":{"max_new_tokens":8}}'`

// validate refuses flag values before the model loads, taking the API key from DRMAS_API_KEY when
// --api-key is not given.
func (f *serveFlags) validate() error {
	if f.model == "" {
		return badInput(fmt.Errorf("--model is required"))
	}
	if f.port < 0 || f.port > 65535 {
		return badInput(fmt.Errorf("--port %d: want 0-65535 (0 = any free port)", f.port))
	}
	if f.apiKey == "" {
		f.apiKey = os.Getenv("DRMAS_API_KEY")
	}
	if f.apiKey != "" {
		if err := serve.CheckAPIKey(f.apiKey); err != nil {
			return badInput(err) // before the model loads
		}
	}
	if f.weightUpdates && f.weightsRoot == "" {
		return badInput(fmt.Errorf("--enable-weight-updates needs --weights-root DIR: the only folder reloads may read from (a training's run folder)"))
	}
	if !f.weightUpdates && f.weightsRoot != "" {
		return badInput(fmt.Errorf("--weights-root is only used with --enable-weight-updates"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--header-timeout", f.headerTimeout}, {"--read-timeout", f.readTimeout}, {"--idle-timeout", f.idleTimeout}} {
		if d.v <= 0 {
			return badInput(fmt.Errorf("%s %s: want a duration > 0, e.g. 30s", d.name, d.v))
		}
	}
	if f.maxLoRAs < 1 {
		return badInput(fmt.Errorf("--max-loras %d: want ≥ 1", f.maxLoRAs))
	}
	if len(f.loras) > f.maxLoRAs {
		return badInput(fmt.Errorf("%d --lora adapters, more than --max-loras %d", len(f.loras), f.maxLoRAs))
	}
	if f.maxConns < 1 || f.maxInflightMB < 1 {
		return badInput(fmt.Errorf("--max-conns %d, --max-inflight-mb %d: want ≥ 1", f.maxConns, f.maxInflightMB))
	}
	if f.maxConnsPerClient < 0 || f.maxConnsPerClient > f.maxConns {
		return badInput(fmt.Errorf("--max-conns-per-client %d: want 1–--max-conns (%d), or 0 for three quarters of --max-conns", f.maxConnsPerClient, f.maxConns))
	}
	return nil
}

// bind declares the flags of drmas serve on cmd, writing into f.
func (f *serveFlags) bind(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.model, "model", "", "model folder to serve (Hugging Face layout or a drmas checkpoint's model folder)")
	fl.StringVar(&f.host, "host", "127.0.0.1", "address to listen on (0.0.0.0: every interface)")
	fl.IntVar(&f.port, "port", 30000, "port to listen on (0 = any free port; the address is printed)")
	fl.StringVar(&f.dtype, "dtype", "auto", dtypeHelp)
	fl.StringVar(&f.name, "name", "", "model name in /v1/models, which clients send as \"model\" (default: the folder; an empty model means this one)")
	fl.IntVar(&f.threads, "threads", 0, "libtorch intra-op threads (0 = one per core)")
	fl.IntVar(&f.maxBatch, "max-batch", 64, "most requests generated together (rows in flight)")
	fl.BoolVar(&f.continuous, "continuous", true, "continuous batching: a request that arrives takes a finished row's slot at the next decoding step (false: a batch runs to its end while new requests wait)")
	fl.Int64Var(&f.kvTokens, "kv-tokens", 0, "most KV-cache positions (rows in flight × cache columns) of continuous batching; a request waits for room (0: no limit)")
	fl.StringVar(&f.apiKey, "api-key", "", "key every endpoint but /health requires as \"Authorization: Bearer <key>\" (default: $DRMAS_API_KEY; none: open)")
	fl.BoolVar(&f.weightUpdates, "enable-weight-updates", false, "allow /update_weights_from_disk, /collective_rpc and /update_weight_version (403 otherwise)")
	fl.StringVar(&f.weightsRoot, "weights-root", "", "with --enable-weight-updates: the only folder reloads may load from")
	fl.DurationVar(&f.headerTimeout, "header-timeout", 10*time.Second, "time a client has to send a request's headers")
	fl.DurationVar(&f.readTimeout, "read-timeout", 60*time.Second, "time a client has to send a whole request, body included")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", 60*time.Second, "time an idle keep-alive connection is kept open")
	fl.IntVar(&f.maxConns, "max-conns", 1024, "most connections open at once (16 more serve /health only, 503 to anything else; more wait to be accepted)")
	fl.IntVar(&f.maxConnsPerClient, "max-conns-per-client", 0, "most connections open at once from one client address (more: 503, closed; 0 = three quarters of --max-conns)")
	fl.IntVar(&f.maxInflightMB, "max-inflight-mb", 256, "most MiB of request bodies held at once (more: 503, retry)")
	fl.StringArrayVar(&f.loras, "lora", nil, "NAME=DIR: serve the PEFT LoRA adapter folder DIR under NAME (repeatable); requests name it as \"model\" or \"lora_path\"")
	fl.IntVar(&f.maxLoRAs, "max-loras", serve.DefaultMaxLoRAs, "most LoRA adapters held at once (loading more is refused)")
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
	loras, err := parseLoRAFlags(f.loras)
	if err != nil {
		return badInput(err)
	}
	p.KVTokens = f.kvTokens
	srv, err := serve.New(p, abs, serve.Options{Name: f.name, MaxBatch: f.maxBatch, Static: !f.continuous, APIKey: f.apiKey, LoRAs: loras, MaxLoRAs: f.maxLoRAs,
		WeightUpdates: f.weightUpdates, WeightsRoot: f.weightsRoot, ReadHeaderTimeout: f.headerTimeout,
		ReadTimeout: f.readTimeout, IdleTimeout: f.idleTimeout, MaxConns: f.maxConns, MaxConnsPerClient: f.maxConnsPerClient, MaxInflightBytes: int64(f.maxInflightMB) << 20})
	if err != nil {
		return badInput(err)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := cmd.OutOrStdout()
	return srv.ListenAndServe(ctx, net.JoinHostPort(f.host, strconv.Itoa(f.port)), func(a net.Addr) {
		fmt.Fprintf(out, "http://%s\n", a.String())
	})
}

// parseLoRAFlags reads --lora NAME=DIR values (vLLM's --lora-modules name=path).
func parseLoRAFlags(vals []string) ([]serve.LoRA, error) {
	var out []serve.LoRA
	seen := map[string]bool{}
	for _, v := range vals {
		name, dir, ok := strings.Cut(v, "=")
		if !ok || name == "" || dir == "" {
			return nil, fmt.Errorf("--lora %q: want NAME=DIR (a PEFT adapter folder)", v)
		}
		if seen[name] {
			return nil, fmt.Errorf("--lora %q: the name %s is given twice", v, name)
		}
		seen[name] = true
		out = append(out, serve.LoRA{Name: name, Path: dir})
	}
	return out, nil
}
