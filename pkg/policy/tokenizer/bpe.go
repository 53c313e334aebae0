package tokenizer

import (
	"container/heap"
	"fmt"
	"sync"
)

// pair is two adjacent token ids.
type pair struct{ left, right int }

// mergeRule is what a pair becomes: its rank (lower merges first) and the id
// of the merged token.
type mergeRule struct{ rank, id int }

// bpe is a byte-level BPE model: the vocabulary of byte-level strings and
// the ranked merges.
type bpe struct {
	vocab        map[string]int
	merges       map[pair]mergeRule
	ignoreMerges bool     // emit a word that is itself in the vocabulary without merging
	unk          int      // id of the unknown token, -1 when there is none
	byteIDs      [256]int // id of each byte's token, -1 when the vocabulary lacks it

	cache wordCache
}

// wordCache remembers the ids of pre-token words: prompts repeat the same
// words (role names, instructions, tags) over and over.
type wordCache struct {
	mu sync.RWMutex
	m  map[string][]int
}

const (
	cacheMaxEntries = 1 << 16
	cacheMaxWordLen = 256 // longer words (long digit or CJK runs) are not cached
)

func (c *wordCache) get(word string) ([]int, bool) {
	c.mu.RLock()
	ids, ok := c.m[word]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(word string, ids []int) {
	if len(word) > cacheMaxWordLen {
		return
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string][]int)
	}
	if len(c.m) < cacheMaxEntries {
		c.m[word] = ids
	}
	c.mu.Unlock()
}

// newBPE checks the model section of a tokenizer.json and builds the model.
func newBPE(m modelSpec) (*bpe, error) {
	if m.Type == "" && m.Vocab != nil {
		m.Type = "BPE" // files from old tokenizers versions omit it
	}
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("model.type %q is not supported (want BPE)", m.Type)
	case m.ByteFallback:
		return nil, fmt.Errorf("model.byte_fallback true (SentencePiece-style BPE) is not supported")
	case m.Dropout != nil && *m.Dropout > 0:
		return nil, fmt.Errorf("model.dropout %v is not supported", *m.Dropout)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("model: continuing_subword_prefix / end_of_word_suffix are not supported")
	case len(m.Vocab) == 0:
		return nil, fmt.Errorf("model.vocab is empty")
	}
	model := &bpe{vocab: m.Vocab, merges: make(map[pair]mergeRule, len(m.Merges.pairs)), ignoreMerges: m.IgnoreMerges, unk: -1}
	seen := make(map[int]string, len(m.Vocab))
	for tok, id := range m.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("model.vocab[%q]: negative id %d", tok, id)
		}
		if id >= MaxVocabSize {
			return nil, fmt.Errorf("model.vocab[%q]: id %d exceeds the bound %d", tok, id, MaxVocabSize-1)
		}
		if prev, dup := seen[id]; dup {
			return nil, fmt.Errorf("model.vocab: id %d is used by both %q and %q", id, prev, tok)
		}
		seen[id] = tok
	}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in the vocabulary", *m.UnkToken)
		}
		model.unk = id
	}
	for rank, p := range m.Merges.pairs {
		a, okA := m.Vocab[p[0]]
		b, okB := m.Vocab[p[1]]
		merged, okM := m.Vocab[p[0]+p[1]]
		if !okA || !okB || !okM {
			return nil, fmt.Errorf("model.merges[%d] %q + %q: token not in the vocabulary", rank, p[0], p[1])
		}
		if _, dup := model.merges[pair{a, b}]; !dup { // the first (lowest) rank wins
			model.merges[pair{a, b}] = mergeRule{rank: rank, id: merged}
		}
	}
	model.setByteIDs()
	return model, nil
}

// setByteIDs fills byteIDs from the vocabulary.
func (m *bpe) setByteIDs() {
	for b := range m.byteIDs {
		id, ok := m.vocab[byteToString[b]]
		if !ok {
			id = -1
		}
		m.byteIDs[b] = id
	}
}

// appendWord appends the ids of one pre-token word (raw bytes, before the
// byte-level mapping) to dst.
func (m *bpe) appendWord(dst []int, word string) []int {
	if ids, ok := m.cache.get(word); ok {
		return append(dst, ids...)
	}
	ids := m.encodeWord(word)
	m.cache.put(word, ids)
	return append(dst, ids...)
}

// encodeWord runs BPE on a word: start from one symbol per byte (one rune
// of the byte-level alphabet) and repeatedly merge the adjacent pair of
// lowest rank (leftmost on ties), exactly as Hugging Face's BPE model does.
func (m *bpe) encodeWord(word string) []int {
	if m.ignoreMerges {
		if id, ok := m.vocab[byteLevelEncode(word)]; ok {
			return []int{id}
		}
	}
	ids := make([]int, 0, len(word))
	for i := 0; i < len(word); i++ {
		if id := m.byteIDs[word[i]]; id >= 0 {
			ids = append(ids, id)
		} else if m.unk >= 0 {
			ids = append(ids, m.unk)
		}
		// Without an unknown token Hugging Face drops a symbol missing
		// from the vocabulary; a byte-level vocabulary holds all 256, so
		// this only happens with a broken file.
	}
	if len(ids) < 2 || len(m.merges) == 0 {
		return ids
	}
	return m.merge(ids)
}

// merge applies the merges to a sequence of symbol ids. Symbols form a
// linked list; candidate merges sit in a heap ordered by (rank, position) and
// are checked for staleness when popped.
func (m *bpe) merge(ids []int) []int {
	n := len(ids)
	prev := make([]int, n)
	next := make([]int, n)
	alive := make([]bool, n)
	for i := range ids {
		prev[i], next[i], alive[i] = i-1, i+1, true
	}
	next[n-1] = -1

	h := make(candidateHeap, 0, n)
	for i := 0; i < n-1; i++ {
		if c, ok := m.candidate(ids, i, i+1); ok {
			h = append(h, c)
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(candidate)
		i, j := c.pos, c.right
		if !alive[i] || !alive[j] || next[i] != j || ids[i] != c.left || ids[j] != c.rightID {
			continue // stale: one side was merged away since it was queued
		}
		ids[i] = c.id
		alive[j] = false
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		if p := prev[i]; p >= 0 {
			if c, ok := m.candidate(ids, p, i); ok {
				heap.Push(&h, c)
			}
		}
		if k := next[i]; k >= 0 {
			if c, ok := m.candidate(ids, i, k); ok {
				heap.Push(&h, c)
			}
		}
	}
	out := make([]int, 0, n)
	for i := 0; i >= 0; i = next[i] {
		out = append(out, ids[i])
	}
	return out
}

// candidate returns the merge of symbols i and j (adjacent), if there is one.
func (m *bpe) candidate(ids []int, i, j int) (candidate, bool) {
	r, ok := m.merges[pair{ids[i], ids[j]}]
	return candidate{rank: r.rank, pos: i, right: j, left: ids[i], rightID: ids[j], id: r.id}, ok
}

// candidate is a merge that was possible when it was queued.
type candidate struct {
	rank, pos, right  int
	left, rightID, id int
}

type candidateHeap []candidate

func (h candidateHeap) Len() int { return len(h) }
func (h candidateHeap) Less(a, b int) bool {
	if h[a].rank != h[b].rank {
		return h[a].rank < h[b].rank
	}
	return h[a].pos < h[b].pos
}
func (h candidateHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *candidateHeap) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *candidateHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
