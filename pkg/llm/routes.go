package llm

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
)

// Routes are the experts a mixture-of-experts model routed consecutive tokens of one sequence
// (prompt then response) to, in the layout of vLLM's routed_experts: token-major int16, Layers ×
// TopK entries a token, each layer's experts in the order the router ranked them; −1 in dense
// layers (a replay ignores those).
type Routes struct {
	From   int // the index in the sequence of the first token covered
	Layers int // num_hidden_layers
	TopK   int // num_experts_per_tok
	// IDs is [tokens × Layers × TopK]: token From+t's experts in layer l are
	// IDs[(t·Layers+l)·TopK:][:TopK].
	IDs []int16
}

// Tokens is the number of tokens the routes cover.
func (r *Routes) Tokens() int {
	if r == nil || r.Layers <= 0 || r.TopK <= 0 {
		return 0
	}
	return len(r.IDs) / (r.Layers * r.TopK)
}

// Base64 is the routes in SGLang's wire format (meta_info.routed_experts): the IDs as little-endian
// int32, base64-encoded (standard alphabet, padded).
func (r *Routes) Base64() string {
	b := make([]byte, 4*len(r.IDs))
	for i, id := range r.IDs {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(id)))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// RoutesFromBase64 reads routes in SGLang's wire format for a model of layers layers and topK
// experts a token; the payload must hold whole tokens and expert ids in int16's range (−1 in dense
// layers).
func RoutesFromBase64(s string, layers, topK int) (*Routes, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("routed experts: not base64: %w", err)
	}
	if layers <= 0 || topK <= 0 || len(b)%(4*layers*topK) != 0 {
		return nil, fmt.Errorf("routed experts: %d bytes are not whole tokens of %d layers × %d experts as int32", len(b), layers, topK)
	}
	r := &Routes{Layers: layers, TopK: topK, IDs: make([]int16, len(b)/4)}
	for i := range r.IDs {
		v := int32(binary.LittleEndian.Uint32(b[4*i:]))
		if v < -1 || v > math.MaxInt16 {
			return nil, fmt.Errorf("routed experts: entry %d is expert %d", i, v)
		}
		r.IDs[i] = int16(v)
	}
	return r, nil
}

// RouteShape is what a mixture-of-experts model routes each token to: TopK experts in each of
// Layers layers (the zero value for a dense model, which routes nothing).
type RouteShape struct{ Layers, TopK int }

// MoE says whether the shape is a mixture of experts'.
func (s RouteShape) MoE() bool { return s.Layers > 0 && s.TopK > 0 }
