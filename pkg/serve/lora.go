package serve

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// LoRA adapters (issue #27): the server serves its base with any number of PEFT adapters, each
// under a name clients send as the OpenAI "model" or SGLang's "lora_path". Rows of one generation
// batch may run on different adapters (the policy's multi-LoRA batching).
//
// Every accepted generation holds a reference to the adapter it runs on until it ends, so that an
// unload (or a load_inplace that replaces the name) never frees tensors a generation still reads:
// the name goes at once (later requests get 404), the tensors when the last generation using them
// ends. Each adapter is registered with the policy under a key of its own (name#serial), so that a
// name reloaded in place and its previous tensors can both be live.

// DefaultMaxLoRAs bounds the adapters a server holds when Options.MaxLoRAs is 0.
const DefaultMaxLoRAs = 16

// LoRA is an adapter to serve from start-up: a PEFT folder under a name.
type LoRA struct {
	Name string
	Path string
}

// served is one loaded adapter.
type served struct {
	name string // what clients send
	key  string // the policy's name for it (name#serial)
	path string // the folder it came from

	users int  // generations holding it (under loraSet.mu)
	gone  bool // unloaded or replaced: freed when users reaches 0
	a     *policy.Adapter
}

// loraSet is the server's adapters by name.
type loraSet struct {
	mu     sync.Mutex
	byName map[string]*served
	serial int
	update sync.Mutex // one load or unload at a time (the count and name checks hold across a load)
}

// loraError is a load or unload refusal: the status and message each protocol answers with.
type loraError struct {
	status int
	msg    string
}

func (e *loraError) Error() string { return e.msg }

func loraErrorf(status int, format string, args ...any) *loraError {
	return &loraError{status: status, msg: fmt.Sprintf(format, args...)}
}

// names are the adapters' names, sorted.
func (l *loraSet) names() []*served {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*served, 0, len(l.byName))
	for _, sv := range l.byName {
		out = append(out, sv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// acquire is the adapter name with one more user (release it when its generation ends), or nil.
func (l *loraSet) acquire(name string) *served {
	l.mu.Lock()
	defer l.mu.Unlock()
	sv := l.byName[name]
	if sv != nil {
		sv.users++
	}
	return sv
}

// hold adds a user to sv (which has one already).
func (l *loraSet) hold(sv *served) {
	l.mu.Lock()
	sv.users++
	l.mu.Unlock()
}

// release drops a user of sv; the last user of an unloaded adapter frees it.
func (s *Server) releaseLoRA(sv *served) {
	if sv == nil {
		return
	}
	s.loras.mu.Lock()
	sv.users--
	free := sv.gone && sv.users == 0
	s.loras.mu.Unlock()
	if free {
		s.freeLoRA(sv)
	}
}

// freeLoRA unregisters sv from the policy and frees its tensors (no generation holds it).
func (s *Server) freeLoRA(sv *served) {
	s.pol.RemoveAdapter(sv.key)
	_ = torch.Do(func() error { sv.a.Free(); return nil })
	log.Info().Str("lora", sv.name).Str("path", sv.path).Msg("LoRA adapter freed")
}

// maxLoRAs is the bound on adapters held at once.
func (s *Server) maxLoRAs() int {
	if s.opt.MaxLoRAs > 0 {
		return s.opt.MaxLoRAs
	}
	return DefaultMaxLoRAs
}

// loadLoRA loads the PEFT folder dir (already checked against the weights root, or given at
// start-up) under name. An existing name is refused unless inplace, which replaces it (generations
// on the old tensors finish on them). A folder a client named (rooted) has its files checked
// against the root again just before they are opened. Adapters with NaN or infinite weights are
// refused, as reloads of full weights are.
func (s *Server) loadLoRA(name, dir string, inplace, rooted bool) error {
	if err := s.checkLoRAName(name); err != nil {
		return err
	}
	s.loras.update.Lock()
	defer s.loras.update.Unlock()
	s.loras.mu.Lock()
	old := s.loras.byName[name]
	count := len(s.loras.byName)
	s.loras.serial++
	key := fmt.Sprintf("%s#%d", name, s.loras.serial)
	s.loras.mu.Unlock()
	if old != nil && !inplace {
		return loraErrorf(http.StatusBadRequest, "The lora adapter '%s' has already been loaded. (unload it first, or load it under a new name)", name)
	}
	if old == nil && count >= s.maxLoRAs() {
		return loraErrorf(http.StatusBadRequest, "cannot load LoRA adapter '%s': %d adapters are loaded, the most this server holds (--max-loras %d); unload one first", name, count, s.maxLoRAs())
	}
	if !policy.IsAdapterDir(dir) {
		return loraErrorf(http.StatusBadRequest, "lora_path %q: not a PEFT adapter folder (no %s)", dir, policy.AdapterConfigFile)
	}
	if rooted {
		if err := s.filesWithin("lora_path", dir, dir); err != nil {
			return err
		}
	}
	m := s.pol.Model
	var a *policy.Adapter
	err := torch.Do(func() error {
		var err error
		if a, err = policy.LoadAdapter(dir, key, m.Base(), m.DType()); err != nil {
			return err
		}
		if w := nonFinite(a.Parameters()); w != "" {
			a.Free()
			return fmt.Errorf("weight %s holds NaN or infinite values: refused", w)
		}
		return nil
	})
	if err != nil {
		log.Error().Str("lora", name).Str("path", dir).Err(err).Msg("LoRA adapter load failed")
		return loraErrorf(http.StatusBadRequest, "load LoRA adapter '%s' from %s: %s", name, dir, scrub(err))
	}
	if _, err := s.pol.AddAdapter(a); err != nil {
		_ = torch.Do(func() error { a.Free(); return nil })
		return loraErrorf(http.StatusBadRequest, "load LoRA adapter '%s': %v", name, err)
	}
	sv := &served{name: name, key: key, path: dir, a: a}
	s.loras.mu.Lock()
	if s.loras.byName == nil {
		s.loras.byName = map[string]*served{}
	}
	s.loras.byName[name] = sv
	free := false
	if old != nil {
		old.gone = true
		free = old.users == 0
	}
	s.loras.mu.Unlock()
	if free {
		s.freeLoRA(old)
	}
	log.Info().Str("lora", name).Str("path", dir).Int("rank", a.Config.Rank).Bool("replaced", old != nil).Msg("LoRA adapter loaded")
	return nil
}

// unloadLoRA removes name: new requests for it get 404 at once; its tensors are freed when the
// generations running on it end.
func (s *Server) unloadLoRA(name string) error {
	s.loras.update.Lock()
	defer s.loras.update.Unlock()
	s.loras.mu.Lock()
	sv := s.loras.byName[name]
	if sv == nil {
		s.loras.mu.Unlock()
		return loraErrorf(http.StatusNotFound, "The lora adapter '%s' cannot be found. (loaded: %s)", name, s.loraList())
	}
	delete(s.loras.byName, name)
	sv.gone = true
	free := sv.users == 0
	s.loras.mu.Unlock()
	if free {
		s.freeLoRA(sv)
	}
	log.Info().Str("lora", name).Bool("in_use", !free).Msg("LoRA adapter unloaded")
	return nil
}

// loraList names the loaded adapters for messages (under loras.mu).
func (s *Server) loraList() string {
	if len(s.loras.byName) == 0 {
		return "none"
	}
	var names []string
	for n := range s.loras.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// loraNameForm is the form of an adapter name, for refusals.
const loraNameForm = `1–256 bytes of printable characters, one path segment (no / or \, not . or ..), without control characters or white space at either end (e.g. "solver" or "verifier@100")`

// checkLoRAName refuses names a client could not tell from the base or send back: empty, the
// base's, control characters (a newline cannot travel in a header or a log line), white space at
// either end (one name for the server and another for the client that trims it), over 256 bytes,
// not UTF-8, or not one path segment (../../etc/passwd, a/b: a name is a file name to clients and to
// drmas's own checkpoints). Each refusal names the name and the form wanted.
func (s *Server) checkLoRAName(name string) error {
	switch {
	case name == "":
		return loraErrorf(http.StatusBadRequest, "lora_name is required: the name requests will use for the adapter, %s", loraNameForm)
	case name == s.opt.Name || name == s.pol.ID:
		return loraErrorf(http.StatusBadRequest, "lora_name %q is the base model's name (requests naming it get the base): choose another, %s", name, loraNameForm)
	case len(name) > 256:
		return loraErrorf(http.StatusBadRequest, "lora_name %q… (%d bytes): too long; want %s", name[:32], len(name), loraNameForm)
	case !utf8.ValidString(name):
		return loraErrorf(http.StatusBadRequest, "lora_name %q: not UTF-8; want %s", name, loraNameForm)
	case strings.TrimSpace(name) != name:
		return loraErrorf(http.StatusBadRequest, "lora_name %q: white space at an end (clients that trim it would name another adapter); want %s", name, loraNameForm)
	case strings.ContainsFunc(name, unicode.IsControl):
		return loraErrorf(http.StatusBadRequest, "lora_name %q: a control character; want %s", name, loraNameForm)
	case strings.ContainsAny(name, `/\`) || name == "." || name == "..":
		return loraErrorf(http.StatusBadRequest, "lora_name %q: not one path segment (a name must not hold / or \\, nor be . or ..: clients and tools take it for a file name); want %s", name, loraNameForm)
	}
	return nil
}

// useModel resolves a request's model: nil for the base ("" or its name), an adapter with one
// user held (release it with releaseLoRA), or a 404 naming what is served.
func (s *Server) useModel(name string) (*served, error) {
	if name == "" || name == s.opt.Name {
		return nil, nil
	}
	if sv := s.loras.acquire(name); sv != nil {
		return sv, nil
	}
	return nil, s.unknownModel(name)
}

func (s *Server) unknownModel(name string) error {
	served := fmt.Sprintf("%q", s.opt.Name)
	if names := s.loras.names(); len(names) > 0 {
		var ns []string
		for _, sv := range names {
			ns = append(ns, fmt.Sprintf("%q", sv.name))
		}
		served += " and the LoRA adapters " + strings.Join(ns, ", ")
	}
	return &apiError{status: http.StatusNotFound, param: "model", code: "model_not_found",
		msg: fmt.Sprintf("The model %q does not exist: this server serves %s (GET /v1/models)", name, served)}
}

// loraRequest is the body of both protocols' load and unload endpoints.
type loraRequest struct {
	LoraName    string `json:"lora_name"`
	LoraPath    string `json:"lora_path"`
	LoadInplace bool   `json:"load_inplace"` // vLLM: replace an adapter of that name
	Pinned      bool   `json:"pinned"`       // SGLang: never evicted (drmas serve evicts none)
}

// loraUpdate reads a load or unload request and runs it; the error is a loraError (or the
// weights-root refusal).
func (s *Server) loraUpdate(w http.ResponseWriter, r *http.Request, load bool, answer func(name string, err error)) {
	var req loraRequest
	release, ok := s.readJSON(w, r, &req)
	if !ok {
		return
	}
	defer release()
	if !load {
		if req.LoraName == "" {
			answer("", loraErrorf(http.StatusBadRequest, "'lora_name' needs to be provided to unload a LoRA adapter."))
			return
		}
		answer(req.LoraName, s.unloadLoRA(req.LoraName))
		return
	}
	if req.LoraName == "" || req.LoraPath == "" {
		answer(req.LoraName, loraErrorf(http.StatusBadRequest, "Both 'lora_name' and 'lora_path' must be provided."))
		return
	}
	dir, err := s.allowedAs("lora_path", req.LoraPath)
	if err != nil {
		answer(req.LoraName, err)
		return
	}
	answer(req.LoraName, s.loadLoRA(req.LoraName, dir, req.LoadInplace, true))
}

// vllmLoRA is vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter: 200 with a plain
// text "Success: ..." line, errors in the OpenAI error shape with their status.
func (s *Server) vllmLoRA(load bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.loraUpdate(w, r, load, func(name string, err error) {
			if err != nil {
				writeError(w, asAPIError(err, "lora_name"))
				return
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusOK)
			if load {
				fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", name)
			} else {
				fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", name)
			}
		})
	}
}

// sglangLoRAUpdate is SGLang's POST /load_lora_adapter and /unload_lora_adapter: {"success",
// "error_message", "loaded_adapters": {name: path}}, 200 on success and 400 (or the refusal's
// status) on failure.
func (s *Server) sglangLoRAUpdate(load bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.loraUpdate(w, r, load, func(_ string, err error) {
			loaded := map[string]string{}
			for _, sv := range s.loras.names() {
				loaded[sv.name] = sv.path
			}
			if err != nil {
				status := asAPIError(err, "lora_name").status
				writeJSON(w, status, map[string]any{"success": false, "error_message": err.Error(), "loaded_adapters": loaded})
				return
			}
			writeJSON(w, http.StatusOK, map[string]any{"success": true, "error_message": nil, "loaded_adapters": loaded})
		})
	}
}

// asAPIError gives a load/unload error its status.
func asAPIError(err error, param string) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var le *loraError
	if errors.As(err, &le) {
		return &apiError{status: le.status, msg: le.msg, param: param}
	}
	return &apiError{status: http.StatusInternalServerError, msg: err.Error()}
}

// loadStartLoRAs loads the adapters given at start-up (their folders are the operator's: no
// weights-root check).
func (s *Server) loadStartLoRAs(loras []LoRA) error {
	for i, l := range loras {
		if err := s.loadLoRA(l.Name, l.Path, false, false); err != nil {
			for _, done := range loras[:i] { // the policy is the caller's: leave it as it was
				_ = s.unloadLoRA(done.Name)
			}
			return fmt.Errorf("--lora %s=%s: %w", l.Name, l.Path, err)
		}
	}
	return nil
}
