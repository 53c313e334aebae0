package policy

import (
	"github.com/sugarme/gotch/ts"
)

// KVCache holds the keys and values of past tokens for every layer, preallocated as
// [batch, kv_heads, capacity, head_dim] per layer so that a decoding step writes its column in place
// and attends to a view of the first Len() positions: no per-step concatenation or copy. All rows
// share the position counter (prompts are left-padded to a common length).
type KVCache struct {
	k, v     []*ts.Tensor
	batch    int64
	capacity int64
	length   int
	// starts, when set, is each row's first column (continuous batching: rows of different ages
	// share the columns): a decoding step's query of row b attends to the columns starts[b] … only
	// (attendRows), and the valid mask is not read.
	starts []int64
	// from, when > 0, is the first column any row sees: attention skips the columns before it.
	from int64
	// slots, when set, are the cache rows of a decoding step's rows (the live rows of a continuous
	// batch, the others idle): row i writes to and attends over slot slots[i] (slotIdx, on the
	// device), and starts[i] is its first column.
	slots   []int64
	slotIdx *ts.Tensor
}

// rows is the number of rows a forward call on the cache has.
func (c *KVCache) rows() int64 {
	if c.slots != nil {
		return int64(len(c.slots))
	}
	return c.batch
}

// NewKVCache allocates a cache for batch rows of up to capacity tokens. Its tensors belong to the
// current torch scope (or call Free). Call it on the torch thread.
func NewKVCache(m *Model, batch, capacity int) *KVCache {
	c := m.Config
	shape := []int64{int64(batch), int64(c.NumKeyValueHeads), int64(capacity), int64(c.HeadDim)}
	kv := &KVCache{batch: int64(batch), capacity: int64(capacity)}
	for range m.Layers {
		kv.k = append(kv.k, ts.MustZeros(shape, m.dtype, m.device))
		kv.v = append(kv.v, ts.MustZeros(shape, m.dtype, m.device))
	}
	return kv
}

// Len is the number of positions the cache holds.
func (c *KVCache) Len() int { return c.length }

// Capacity is the number of positions the cache can hold.
func (c *KVCache) Capacity() int { return int(c.capacity) }

// append writes k and v [B, KV, T, D] at the current position of layer's cache and returns views of
// everything the layer's cache holds after the write, [B, KV, Len()+T, D]. Forward advances Len()
// once all layers are done. Like the rest of a layer's tensors, k, v and the views belong to the
// layer's scope.
func (c *KVCache) append(layer int, k, v *ts.Tensor) (*ts.Tensor, *ts.Tensor) {
	T := k.MustSize()[2]
	pos := int64(c.length)
	for _, p := range [][2]*ts.Tensor{{c.k[layer], k}, {c.v[layer], v}} {
		dst := p[0].MustNarrow(2, pos, T, false)
		if c.slotIdx != nil {
			dst.MustIndexCopy_(0, c.slotIdx, p[1])
		} else {
			dst.Copy_(p[1])
		}
	}
	return c.k[layer].MustNarrow(2, 0, pos+T, false), c.v[layer].MustNarrow(2, 0, pos+T, false)
}

// selectRows keeps the rows idx (int64 [n]) of the cache, in that order: a batch whose rows have
// finished shrinks to the live ones.
func (c *KVCache) selectRows(idx *ts.Tensor) {
	for i := range c.k {
		c.k[i] = replace(c.k[i], c.k[i].MustIndexSelect(0, idx, false))
		c.v[i] = replace(c.v[i], c.v[i].MustIndexSelect(0, idx, false))
	}
	c.batch = idx.MustSize()[0]
}

// Free releases the cache's tensors now.
func (c *KVCache) Free() {
	for i := range c.k {
		c.k[i].MustDrop()
		c.v[i].MustDrop()
	}
}
