package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/rs/zerolog/log"
)

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
