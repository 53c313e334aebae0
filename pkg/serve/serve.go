package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/policy"
)

// Options configure a server.
type Options struct {
	Name     string        // model name reported by /v1/models (default: the model folder)
	MaxBatch int           // requests per generation batch (default 64)
	Window   time.Duration // how long a batch waits for more requests (default 2ms; static batching only)
	// Static turns continuous batching off: a batch gathered within Window runs to its end and the
	// requests that arrive meanwhile wait for it. Continuous (the default): MaxBatch rows in
	// flight, a request that arrives takes a finished row's slot at the next decoding step.
	Static bool
	DType  string // dtype weights are loaded in on reload (default: the policy's)

	// APIKey, when set, is required as "Authorization: Bearer <key>" on every endpoint but /health.
	APIKey string
	// WeightUpdates enables the endpoints that change the served weights or their version
	// (/update_weights_from_disk, /collective_rpc, /update_weight_version); off, they answer 403.
	WeightUpdates bool
	// WeightsRoot is the only folder reloads may read from (with WeightUpdates; required then).
	WeightsRoot string

	// LoRAs are the adapters served from start-up (PEFT folders, read wherever they are); with
	// WeightUpdates, /v1/load_lora_adapter and /load_lora_adapter add more from under WeightsRoot.
	LoRAs []LoRA
	// MaxLoRAs bounds the adapters held at once: loading one more is refused (default
	// DefaultMaxLoRAs).
	MaxLoRAs int

	ReadHeaderTimeout time.Duration // to read a request's headers (default 10s)
	ReadTimeout       time.Duration // to read a whole request, body included (default 60s)
	IdleTimeout       time.Duration // a keep-alive connection may wait for its next request (default 60s)
	MaxConns          int           // open connections at once; more wait to be accepted (default 1024)
	// MaxConnsPerClient bounds the connections open from one client address: more from it are
	// closed as soon as they are accepted (default: three quarters of MaxConns).
	MaxConnsPerClient int
	MaxInflightBytes  int64 // request bodies held at once; beyond, 503 (default 256 MiB)
}

// Server serves one policy.
type Server struct {
	pol  *policy.Policy
	opt  Options
	jobs chan *job

	root          string // WeightsRoot, absolute with symbolic links resolved
	maxTokenBytes int    // the longest token's bytes (precheck)
	inflight      budget

	mu        sync.Mutex
	modelPath string // folder the current weights came from
	// modelRooted: modelPath is a folder a client named under the weights root (not the start-up one)
	modelRooted bool
	version     string // weight version tag ("default" until a reload names one)
	pending     string // vLLM-style update_config: the folder reload_weights will read

	loras loraSet // LoRA adapters by name

	batches atomic.Int64 // generation batches run
	tokens  atomic.Int64 // tokens sampled
}

// New prepares a server for pol, which was loaded from dir. Call ListenAndServe to serve. With
// weight updates on, the weights root must be an existing folder.
func New(pol *policy.Policy, dir string, opt Options) (*Server, error) {
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = 64
	}
	if opt.Window <= 0 {
		opt.Window = 2 * time.Millisecond
	}
	if opt.Name == "" {
		opt.Name = dir
	}
	if opt.ReadHeaderTimeout <= 0 {
		opt.ReadHeaderTimeout = 10 * time.Second
	}
	if opt.ReadTimeout <= 0 {
		opt.ReadTimeout = 60 * time.Second
	}
	if opt.IdleTimeout <= 0 {
		opt.IdleTimeout = 60 * time.Second
	}
	if opt.MaxConns <= 0 {
		opt.MaxConns = 1024
	}
	if opt.MaxConnsPerClient <= 0 {
		opt.MaxConnsPerClient = max(1, opt.MaxConns*3/4)
	}
	if opt.MaxInflightBytes <= 0 {
		opt.MaxInflightBytes = 256 << 20
	}
	if opt.APIKey != "" {
		if err := CheckAPIKey(opt.APIKey); err != nil {
			return nil, err
		}
	}
	s := &Server{pol: pol, opt: opt, jobs: make(chan *job, 1024), modelPath: dir, version: "default"}
	s.inflight.most = opt.MaxInflightBytes
	if opt.WeightUpdates {
		if opt.WeightsRoot == "" {
			return nil, fmt.Errorf("weight updates need a weights root: the only folder reloads may read from (--weights-root)")
		}
		root, err := filepath.Abs(opt.WeightsRoot)
		if err == nil {
			root, err = filepath.EvalSymlinks(root)
		}
		if err != nil {
			return nil, fmt.Errorf("weights root %s: %w", opt.WeightsRoot, err)
		}
		if st, err := os.Stat(root); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("weights root %s: not a folder", opt.WeightsRoot)
		}
		s.root = root
	}
	if len(opt.LoRAs) > s.maxLoRAs() {
		return nil, fmt.Errorf("%d LoRA adapters given, more than --max-loras %d", len(opt.LoRAs), s.maxLoRAs())
	}
	if err := s.loadStartLoRAs(opt.LoRAs); err != nil {
		return nil, err
	}
	if pol.Tok != nil {
		for id := 0; id < pol.Tok.VocabSize(); id++ {
			s.maxTokenBytes = max(s.maxTokenBytes, len(pol.Tok.DecodeBytes([]int{id})))
		}
	}
	return s, nil
}

// CheckAPIKey refuses an API key no client could send: only white space, white space at either end
// (HTTP clients and servers strip it from the Authorization header, so the key sent never equals
// it) or control characters (which cannot travel in a header). Each would lock every client out
// with 401.
func CheckAPIKey(key string) error {
	const where = "API key (--api-key or DRMAS_API_KEY)"
	switch {
	case strings.TrimSpace(key) == "":
		return fmt.Errorf("%s of %d white-space characters: no client can send it, every request would get 401; set a real key (e.g. openssl rand -hex 16) or leave it unset", where, len(key))
	case strings.TrimSpace(key) != key:
		return fmt.Errorf("%s begins or ends with white space (a trailing newline?), which HTTP strips from the Authorization header: every request would get 401; remove it", where)
	case strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("%s holds a control character, which cannot travel in an HTTP header: every request would get 401; remove it", where)
	}
	return nil
}

// Handler routes the server's endpoints, behind the API key when there is one.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /get_model_info", s.modelInfo)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /v1/models/{id...}", s.model)
	mux.HandleFunc("POST /generate", s.generate)
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	mux.HandleFunc("POST /update_weights_from_disk", s.weightUpdate(s.updateFromDisk))
	mux.HandleFunc("POST /collective_rpc", s.weightUpdate(s.collectiveRPC))
	mux.HandleFunc("POST /update_weight_version", s.weightUpdate(s.updateWeightVersion))
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /weight_info", s.weightInfo)
	mux.HandleFunc("POST /v1/load_lora_adapter", s.weightUpdate(s.vllmLoRA(true)))
	mux.HandleFunc("POST /v1/unload_lora_adapter", s.weightUpdate(s.vllmLoRA(false)))
	mux.HandleFunc("POST /load_lora_adapter", s.weightUpdate(s.sglangLoRAUpdate(true)))
	mux.HandleFunc("POST /unload_lora_adapter", s.weightUpdate(s.sglangLoRAUpdate(false)))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no endpoint %s %s (drmas serve --help lists them)", r.Method, r.URL.Path)})
	})
	if s.opt.APIKey == "" {
		return mux
	}
	return requireKey(s.opt.APIKey, mux)
}

// ListenAndServe serves on addr until ctx ends; ready (if set) is called with the bound address
// (useful with port 0) once the server accepts connections.
func (s *Server) ListenAndServe(ctx context.Context, addr string, ready func(net.Addr)) error {
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	ln := newLimitListener(raw, s.opt.MaxConns, s.opt.MaxConnsPerClient)
	// No write timeout: a streamed generation writes for as long as it samples. A request's read
	// deadline is lifted once its body is read (readJSON).
	srv := &http.Server{Handler: overflowGuard(s.Handler()), ConnContext: connContext, ReadHeaderTimeout: s.opt.ReadHeaderTimeout,
		ReadTimeout: s.opt.ReadTimeout, IdleTimeout: s.opt.IdleTimeout, MaxHeaderBytes: 64 << 10}
	loop, stopLoop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.run(loop); close(done) }()
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	if ready != nil {
		ready(ln.Addr())
	}
	log.Info().Str("addr", ln.Addr().String()).Str("model", s.opt.Name).Bool("api_key", s.opt.APIKey != "").
		Bool("weight_updates", s.opt.WeightUpdates).Msg("serving")
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() && s.opt.APIKey == "" {
		log.Warn().Str("addr", ln.Addr().String()).Msg("serving beyond this machine without an API key: anyone who reaches the port can use the model (set --api-key or DRMAS_API_KEY)")
	}
	err = srv.Serve(ln)
	stopLoop()
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) modelInfo(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"model_path": s.modelPath, "tokenizer_path": s.modelPath,
		"is_generation": true, "preferred_sampling_params": nil, "weight_version": s.version,
		"has_image_understanding": false, "has_audio_understanding": false})
}

// models is GET /v1/models: the base, then each LoRA adapter with its parent (as vLLM lists them).
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	data := []map[string]any{s.baseCard()}
	s.mu.Unlock()
	for _, sv := range s.loras.names() {
		data = append(data, s.loraCard(sv))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// baseCard is the base model's entry in /v1/models (under s.mu).
func (s *Server) baseCard() map[string]any {
	return map[string]any{"id": s.opt.Name, "object": "model", "created": 0, "owned_by": "drmas", "root": s.modelPath,
		"parent": nil, "max_model_len": s.pol.Model.Config.MaxPositionEmbeddings}
}

// loraCard is an adapter's entry in /v1/models: its folder as root, the base as parent.
func (s *Server) loraCard(sv *served) map[string]any {
	return map[string]any{"id": sv.name, "object": "model", "created": 0, "owned_by": "drmas", "root": sv.path,
		"parent": s.opt.Name, "max_model_len": s.pol.Model.Config.MaxPositionEmbeddings}
}

// model is GET /v1/models/{id}: the base or an adapter, or 404 in OpenAI's error shape.
func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id == s.opt.Name {
		s.mu.Lock()
		defer s.mu.Unlock()
		writeJSON(w, http.StatusOK, s.baseCard())
		return
	}
	for _, sv := range s.loras.names() {
		if sv.name == id {
			writeJSON(w, http.StatusOK, s.loraCard(sv))
			return
		}
	}
	writeError(w, s.unknownModel(id))
}
