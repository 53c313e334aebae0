package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
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

// weightUpdate answers 403 unless weight updates are enabled.
func (s *Server) weightUpdate(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.opt.WeightUpdates {
			closeAfter(w)
			writeError(w, &apiError{status: http.StatusForbidden,
				msg: "weight updates are disabled on this server (start it with --enable-weight-updates --weights-root DIR)"})
			return
		}
		h(w, r)
	}
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

func (s *Server) weightInfo(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"weight_version": s.version})
}

func (s *Server) updateWeightVersion(w http.ResponseWriter, r *http.Request) {
	var req struct {
		NewVersion *string `json:"new_version"`
	}
	release, ok := s.readJSON(w, r, &req)
	if !ok {
		return
	}
	defer release()
	if req.NewVersion == nil {
		writeError(w, badRequest("new_version", "new_version is required"))
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
	release, ok := s.readJSON(w, r, &req)
	if !ok {
		return
	}
	defer release()
	if req.ModelPath == "" {
		writeError(w, badRequest("model_path", "model_path is required"))
		return
	}
	dir, err := s.allowed(req.ModelPath)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.reload(r.Context(), dir, true); err != nil {
		var ae *apiError
		if errors.As(err, &ae) { // a file of the folder links outside the root now
			writeError(w, ae)
			return
		}
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
	release, ok := s.readJSON(w, r, &req)
	if !ok {
		return
	}
	defer release()
	switch req.Method {
	case "update_config":
		dir := req.Kwargs.Overrides.ModelConfig.Model
		if dir == "" {
			writeError(w, badRequest("kwargs", "update_config: kwargs.overrides.model_config.model is required"))
			return
		}
		dir, err := s.allowed(dir)
		if err != nil {
			writeError(w, err)
			return
		}
		s.mu.Lock()
		s.pending = dir
		s.mu.Unlock()
	case "reload_weights":
		s.mu.Lock()
		dir, rooted := s.pending, true // update_config's folder is under the root
		if dir == "" {
			dir, rooted = s.modelPath, s.modelRooted
		}
		s.mu.Unlock()
		if err := s.reload(r.Context(), dir, rooted); err != nil {
			writeError(w, err)
			return
		}
	default:
		writeError(w, badRequest("method", "collective_rpc method %q: drmas serve supports update_config and reload_weights", req.Method))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": []any{nil}})
}

// allowed resolves a folder a reload names (symbolic links followed) and checks that it lies under
// the weights root. A path outside the root, or one that cannot be resolved, gets the same answer
// whatever is there, so that the endpoint does not tell which paths exist.
func (s *Server) allowed(path string) (string, error) { return s.allowedAs("model_path", path) }

// allowedAs is allowed for the request field param.
func (s *Server) allowedAs(param, path string) (string, error) {
	refused := &apiError{status: http.StatusForbidden, param: param,
		msg: fmt.Sprintf("%s %q: not a folder under this server's weights root (--weights-root)", param, path)}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", refused
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		// A path that does not resolve: "missing" is said only when its deepest existing folder,
		// links resolved, lies under the root (so that a link cannot tell what exists elsewhere).
		for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
			if got, err := filepath.EvalSymlinks(dir); err == nil {
				if within(s.root, got) {
					return "", badRequest(param, "%s %q: no such folder under the weights root", param, path)
				}
				return "", refused
			}
			if dir == filepath.Dir(dir) {
				return "", refused
			}
		}
	}
	if !within(s.root, real) {
		return "", refused
	}
	if err := s.filesWithin(param, path, real); err != nil {
		return "", err
	}
	return real, nil
}

// filesWithin checks that every entry of the folder dir (already resolved under the root) resolves
// under the root too: a reload or an adapter load opens the folder's files (config.json, the
// safetensors files and shards, adapter_config.json, the tokenizer's files) by name, and a symbolic
// link among them would read a file outside the root. A link that leads outside the root, or that
// does not resolve, gets the same 403 as a folder outside it (path is what the client sent, for the
// message).
func (s *Server) filesWithin(param, path, dir string) error {
	refused := &apiError{status: http.StatusForbidden, param: param,
		msg: fmt.Sprintf("%s %q: not a folder under this server's weights root (--weights-root)", param, path)}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return refused
	}
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		got, err := filepath.EvalSymlinks(filepath.Join(dir, e.Name()))
		if err != nil || !within(s.root, got) {
			log.Warn().Str("folder", dir).Str("file", e.Name()).Msg("refused a folder under the weights root: a file in it links outside the root")
			return refused
		}
	}
	return nil
}

// Load errors come from files a client named: what reaches the client must not quote those files'
// bytes (a file that is not what its name says could be anything). These patterns are the places
// where the loaders' messages (pkg/policy's safetensors header check, encoding/json's syntax and
// type errors) carry bytes of the file; scrub removes them and keeps the rest (the file, the key).
var (
	headerLength  = regexp.MustCompile(`header length \d+ does not fit`)
	jsonCharacter = regexp.MustCompile(`invalid character '(?:\\'|[^'])*'`)
	jsonNumber    = regexp.MustCompile(`cannot unmarshal number \S+ into`)
)

// scrub is a load error's text without bytes of the file it came from.
func scrub(err error) string {
	msg := err.Error()
	msg = headerLength.ReplaceAllString(msg, "header length (the file's first 8 bytes) does not fit")
	msg = jsonCharacter.ReplaceAllString(msg, "invalid character")
	msg = jsonNumber.ReplaceAllString(msg, "cannot unmarshal number into")
	return msg
}

// within says whether path is root or below it (both absolute and clean).
func within(root, path string) bool {
	rel, err := filepath.Rel(root, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// reload queues a weight reload behind the generation batches already queued and waits for it.
// Rooted: dir is a folder a client named under the weights root.
func (s *Server) reload(ctx context.Context, dir string, rooted bool) error {
	j := &job{reload: dir, rooted: rooted, done: make(chan struct{})}
	select {
	case s.jobs <- j:
	case <-ctx.Done():
		return ctx.Err()
	}
	<-j.done // a reload is never abandoned half-way
	if j.err == nil {
		s.mu.Lock()
		s.modelPath, s.modelRooted = dir, rooted
		s.mu.Unlock()
	}
	return j.err
}
