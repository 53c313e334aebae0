// Package serve is `drmas serve`: an HTTP server for any model drmas loads, speaking the protocols
// drmas's rollout engines speak — SGLang's native /generate and /update_weights_from_disk, the
// OpenAI /v1/completions and /v1/chat/completions, vLLM's dev-mode reload — so that checkpoints can be
// chatted with from any OpenAI client and trainings can sample on it as on a real engine.
//
// Concurrent requests are batched: a request waits at most a couple of milliseconds for others, and
// each batch is one call of the policy's batched generation. Every request samples from its own
// seeded stream (sampling_seed / seed), so a request gets the same tokens whatever else shares its
// batch (up to floating-point noise of batched matmuls), and the same tokens as drmas's local engine.
package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
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
	Window   time.Duration // how long a batch waits for more requests (default 2ms)
	DType    string        // dtype weights are loaded in on reload (default: the policy's)
}

// Server serves one policy.
type Server struct {
	pol  *policy.Policy
	opt  Options
	jobs chan *job

	mu        sync.Mutex
	modelPath string // folder the current weights came from
	version   string // weight version tag ("default" until a reload names one)
	pending   string // vLLM-style update_config: the folder reload_weights will read

	batches atomic.Int64 // generation batches run
}

// New prepares a server for pol, which was loaded from dir. Call Run to start its batching loop.
func New(pol *policy.Policy, dir string, opt Options) *Server {
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = 64
	}
	if opt.Window <= 0 {
		opt.Window = 2 * time.Millisecond
	}
	if opt.Name == "" {
		opt.Name = dir
	}
	return &Server{pol: pol, opt: opt, jobs: make(chan *job, 1024), modelPath: dir, version: "default"}
}

// Handler routes the server's endpoints.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /get_model_info", s.modelInfo)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /generate", s.generate)
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	mux.HandleFunc("POST /update_weights_from_disk", s.updateFromDisk)
	mux.HandleFunc("POST /collective_rpc", s.collectiveRPC)
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /update_weight_version", s.updateWeightVersion)
	mux.HandleFunc("GET /weight_info", s.weightInfo)
	return mux
}

// ListenAndServe serves on addr until ctx ends; ready (if set) is called with the bound address
// (useful with port 0) once the server accepts connections.
func (s *Server) ListenAndServe(ctx context.Context, addr string, ready func(net.Addr)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
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
	log.Info().Str("addr", ln.Addr().String()).Str("model", s.opt.Name).Msg("serving")
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

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{{
		"id": s.opt.Name, "object": "model", "owned_by": "drmas", "root": s.modelPath,
		"max_model_len": s.pol.Model.Config.MaxPositionEmbeddings}}})
}

func (s *Server) weightInfo(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"weight_version": s.version})
}

func (s *Server) updateWeightVersion(w http.ResponseWriter, r *http.Request) {
	var req struct {
		NewVersion *string `json:"new_version"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.NewVersion == nil {
		writeError(w, http.StatusBadRequest, "new_version is required")
		return
	}
	s.mu.Lock()
	s.version = *req.NewVersion
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "new_version": *req.NewVersion})
}

// updateFromDisk is SGLang's POST /update_weights_from_disk: load the weights of model_path (same
// architecture) in place; the reply says whether it worked.
func (s *Server) updateFromDisk(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ModelPath     string  `json:"model_path"`
		WeightVersion *string `json:"weight_version"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	if req.ModelPath == "" {
		writeError(w, http.StatusBadRequest, "model_path is required")
		return
	}
	if err := s.reload(r.Context(), req.ModelPath); err != nil {
		writeJSON(w, http.StatusOK, map[string]any{"success": false, "message": err.Error(), "num_paused_requests": 0})
		return
	}
	s.mu.Lock()
	if req.WeightVersion != nil {
		s.version = *req.WeightVersion
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
}

// collectiveRPC is the part of vLLM's dev-mode POST /collective_rpc that reloads weights from disk:
// "update_config" with kwargs.overrides.model_config.model names the folder, "reload_weights" loads it.
func (s *Server) collectiveRPC(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Method string `json:"method"`
		Kwargs struct {
			Overrides struct {
				ModelConfig struct {
					Model string `json:"model"`
				} `json:"model_config"`
			} `json:"overrides"`
		} `json:"kwargs"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	switch req.Method {
	case "update_config":
		dir := req.Kwargs.Overrides.ModelConfig.Model
		if dir == "" {
			writeError(w, http.StatusBadRequest, "update_config: kwargs.overrides.model_config.model is required")
			return
		}
		s.mu.Lock()
		s.pending = dir
		s.mu.Unlock()
	case "reload_weights":
		s.mu.Lock()
		dir := s.pending
		if dir == "" {
			dir = s.modelPath
		}
		s.mu.Unlock()
		if err := s.reload(r.Context(), dir); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("collective_rpc method %q: drmas serve supports update_config and reload_weights", req.Method))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": []any{nil}})
}

// reload queues a weight reload behind the generation batches already queued and waits for it.
func (s *Server) reload(ctx context.Context, dir string) error {
	j := &job{reload: dir, done: make(chan struct{})}
	select {
	case s.jobs <- j:
	case <-ctx.Done():
		return ctx.Err()
	}
	<-j.done // a reload is never abandoned half-way
	if j.err == nil {
		s.mu.Lock()
		s.modelPath = dir
		s.mu.Unlock()
	}
	return j.err
}
